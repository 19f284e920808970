"""``switchboard eval run``: run scenario files, print a table, write JSON results, compare with a baseline.

``switchboard eval record SESSION``: write a real session as a replay scenario (:mod:`switchboard.evals.record`).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

import redis.asyncio as aioredis
from pydantic import TypeAdapter, ValidationError

from switchboard.cli.control import operator_principal
from switchboard.cli.sessions import redis_url_for, with_redis
from switchboard.control import ControlError, ControlService
from switchboard.core.agent.config import Agent
from switchboard.errors import ConfigError
from switchboard.evals.record import record_case, scope_for, write_case
from switchboard.evals.runner import ScenarioResult, regressions, run_scenarios
from switchboard.evals.scenario import Scenario, load_scenarios
from switchboard.queue.ingest import Ingestor
from switchboard.settings import Settings

__all__ = ["eval_command", "record_command", "scenario_files", "summary"]

_RESULTS: TypeAdapter[list[ScenarioResult]] = TypeAdapter(list[ScenarioResult])


def scenario_files(paths: Sequence[Path]) -> list[Path]:
    """The YAML files named, and those under the directories named (sorted).

    Raises:
        ConfigError: a path does not exist, or names no scenario file.
    """
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix in {".yaml", ".yml"} and p.is_file())
            if not found:
                raise ConfigError(f"{path}: no scenario files (*.yaml) in this directory")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise ConfigError(f"{path}: no such scenario file or directory")
    return files


def _load_baseline(path: Path) -> list[ScenarioResult]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return _RESULTS.validate_python(raw.get("results") if isinstance(raw, dict) else raw)
    except (OSError, ValueError, ValidationError) as err:
        raise ConfigError(f"{path}: not a results file of `switchboard eval run --json`: {err}") from None


def _table(results: Sequence[ScenarioResult], out: TextIO) -> None:
    width = max([len(r.id) for r in results] + [8])
    out.write(f"{'scenario':<{width}}  {'ver':<6} {'score':>5}  {'tokens':>6}  {'ms':>7}  failed\n")
    for r in results:
        failed = ", ".join(f"{c.name}{' (strict)' if c.strict else ''}" for c in r.checks if not c.passed)
        tokens = r.input_tokens + r.output_tokens
        out.write(f"{r.id:<{width}}  {r.version:<6} {r.score:>5.2f}  {tokens:>6}  {r.latency_ms:>7.0f}  {failed}\n")
    totals = summary(results)
    out.write(
        f"{len(results)} scenario(s), mean score {totals['mean_score']:.2f}, "
        f"latency p50 {totals['latency_p50_ms']:.0f} ms p95 {totals['latency_p95_ms']:.0f} ms, "
        f"{totals['tokens']:.0f} tokens\n"
    )


def summary(results: Sequence[ScenarioResult]) -> dict[str, float]:
    """Mean score, latency p50/p95 (nearest rank) and total tokens and credits of a run."""
    latencies = sorted(r.latency_ms for r in results)

    def rank(q: float) -> float:
        return latencies[min(len(latencies) - 1, math.ceil(q * len(latencies)) - 1)] if latencies else 0.0

    return {
        "mean_score": sum(r.score for r in results) / len(results) if results else 0.0,
        "latency_p50_ms": rank(0.5),
        "latency_p95_ms": rank(0.95),
        "tokens": sum(r.input_tokens + r.output_tokens for r in results),
        "credits": sum(r.credits for r in results),
    }


def eval_command(
    paths: Sequence[Path],
    *,
    json_out: Path | None = None,
    baseline: Path | None = None,
    concurrency: int = 4,
    agents: Mapping[str, Agent] | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """Run the scenarios of ``paths``; exit status 1 when a check fails, or a strict one regressed from ``baseline``.

    Raises:
        ConfigError: a bad scenario file or baseline (nothing runs).
    """
    scenarios: list[Scenario] = []
    for file in scenario_files(paths):
        scenarios += load_scenarios(file)
    seen: set[tuple[str, str]] = set()
    for scenario in scenarios:
        if (scenario.id, scenario.version) in seen:
            raise ConfigError(f"scenario {scenario.id} version {scenario.version} is defined twice")
        seen.add((scenario.id, scenario.version))
    before = _load_baseline(baseline) if baseline is not None else None
    results = asyncio.run(run_scenarios(scenarios, concurrency=concurrency, configured=agents))
    _table(results, out)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(
            json.dumps({"summary": summary(results), "results": _RESULTS.dump_python(results, mode="json")}, indent=1)
            + "\n"
        )
    if before is not None:
        regressed = regressions(results, before)
        mean_before = sum(r.score for r in before) / len(before) if before else 0.0
        mean_now = sum(r.score for r in results) / len(results) if results else 0.0
        out.write(f"baseline mean score {mean_before:.2f}, candidate {mean_now:.2f}\n")
        for line in regressed:
            out.write(f"REGRESSION (strict): {line}\n")
        return 1 if regressed else 0
    return 0 if all(c.passed for r in results for c in r.checks) else 1


def record_command(
    settings: Settings,
    session: str,
    *,
    out: Path | None = None,
    run_id: str | None = None,
    operator: str | None = None,
    stdout: TextIO = sys.stdout,
) -> int:
    """Record ``session`` into ``out`` (or print it); exit status 1, said on stderr, with nothing written on refusal."""
    scope = scope_for(settings, operator_principal(operator), operator)

    async def go(redis: aioredis.Redis) -> int:
        service = ControlService(redis, settings, Ingestor(redis, settings.queue))
        try:
            scenario, text = await record_case(service, scope, session, run_id=run_id)
        except (ControlError, ConfigError) as err:
            print(f"switchboard: {err}", file=sys.stderr)
            return 1
        if out is None:
            stdout.write(text)
            return 0
        try:
            write_case(text, out)
        except OSError as err:
            print(f"switchboard: cannot write {out}: {err.strerror}", file=sys.stderr)
            return 1
        calls = sum(len(step.calls) for step in scenario.model if not isinstance(step, str))
        print(
            f"wrote {out}: scenario {scenario.id}, {len(scenario.messages)} turn(s), {calls} tool call(s), "
            f"{len(scenario.invariants)} invariant(s); run it with `switchboard eval run {out}`",
            file=stdout,
        )
        return 0

    return with_redis(redis_url_for(settings), go)
