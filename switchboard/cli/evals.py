"""``switchboard eval run``: run scenario files, print a table, write JSON results, compare with a baseline.

Models come from the configured providers and are priced with the configured price table, as in the worker; the
offline model stays the default. ``--variant NAME=FILE.yaml`` runs every scenario once per variant of the agent and
prints them side by side.

``switchboard eval record SESSION``: write a real session as a replay scenario (:mod:`switchboard.evals.record`).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import redis.asyncio as aioredis
from pydantic import TypeAdapter, ValidationError

from switchboard.cli.control import operator_principal
from switchboard.cli.sessions import redis_url_for, with_redis
from switchboard.control import ControlError, ControlService
from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.errors import ConfigError
from switchboard.evals.record import record_case, scope_for, write_case
from switchboard.evals.report import by_scenario, side_by_side, summary, table
from switchboard.evals.runner import EvalSetup, ScenarioResult, Variant, agent_under_test, compare, run_scenarios
from switchboard.evals.scenario import Scenario, load_scenarios, read_yaml
from switchboard.queue.ingest import Ingestor
from switchboard.settings import Settings

__all__ = ["eval_command", "eval_setup", "parse_variant", "record_command", "scenario_files", "summary"]

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


_BASELINE_BYTES = 64 * 1024 * 1024


def _load_baseline(path: Path) -> list[ScenarioResult]:
    try:
        if path.stat().st_size > _BASELINE_BYTES:
            raise ConfigError(f"{path}: too large for a results file (over {_BASELINE_BYTES // (1024 * 1024)} MiB)")
        raw = json.loads(path.read_text(encoding="utf-8"))
        return _RESULTS.validate_python(raw.get("results") if isinstance(raw, dict) else raw)
    except RecursionError:
        raise ConfigError(f"{path}: not a results file of `switchboard eval run --json`: nested too deeply") from None
    except (OSError, ValueError, ValidationError) as err:
        raise ConfigError(f"{path}: not a results file of `switchboard eval run --json`: {err}") from None


def eval_setup(settings: Settings, *, rubrics: bool = True) -> EvalSetup:
    """The worker's providers (keys, endpoints) and price table, read from the settings (``rubrics``: grade them)."""
    from switchboard.cli.worker import provider_config

    return EvalSetup(providers=provider_config(settings), prices=settings.file.prices, rubrics=rubrics)


def parse_variant(text: str) -> Variant:
    """``NAME=FILE.yaml``: a variant of the agent under test, its overrides read from the file.

    Raises:
        ConfigError: not ``NAME=FILE``, an unreadable file, or overrides that are not a valid agent's fields.
    """
    name, sep, file = text.partition("=")
    if not sep or not name or not file:
        raise ConfigError(f"--variant {text!r}: write NAME=OVERRIDES.yaml")
    try:
        raw: Any = read_yaml(Path(file))
    except ConfigError as err:
        raise ConfigError(f"--variant {name}: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"--variant {name}: {file} must hold a mapping of agent fields (model, models, ...)")
    try:
        variant = Variant(name=name, overrides=raw)
        variant.apply(Agent(name="eval", profile=AgentProfile(name="eval")), scripted=False)
    except (ValueError, ValidationError) as err:
        raise ConfigError(f"--variant {name}: {file}: {err}") from None
    return variant


def eval_command(
    paths: Sequence[Path],
    *,
    json_out: Path | None = None,
    baseline: Path | None = None,
    concurrency: int = 4,
    agents: Mapping[str, Agent] | None = None,
    out: TextIO | None = None,
    setup: EvalSetup | None = None,
    variants: Sequence[Variant] = (),
    small_threshold: float = 0.9,
    repeat: int = 1,
) -> int:
    """Run the scenarios of ``paths``; exit status 1 when a result is not correct, or a strict check regressed.

    Not correct: a check failed, or a rubric failed or could not be graded. With ``baseline``, only a strict check
    that passed there and fails now sets the exit status.

    ``setup``: providers and prices (default: none, the offline model); ``variants``: run every scenario once per
    variant and print them side by side, with whether each routing variant's small model is accurate enough
    (``small_threshold``: the share of correct results it must reach); ``repeat``: run each scenario that many times
    (measures are over all runs: a model that is right only sometimes costs more per correct result).

    Raises:
        ConfigError: a bad scenario file or baseline, an agent under test that is not valid (no such configured
            agent, a variant that breaks it), or two variants of one name (nothing runs).
    """
    out = out if out is not None else sys.stdout  # looked up now: a caller may have redirected it
    scenarios: list[Scenario] = []
    for file in scenario_files(paths):
        scenarios += load_scenarios(file)
    seen: set[tuple[str, str]] = set()
    for scenario in scenarios:
        if (scenario.id, scenario.version) in seen:
            raise ConfigError(f"scenario {scenario.id} version {scenario.version} is defined twice")
        seen.add((scenario.id, scenario.version))
    if repeat < 1:
        raise ConfigError(f"--repeat {repeat}: run each scenario at least once")
    if len({v.name for v in variants}) != len(variants):
        raise ConfigError("--variant: two variants have the same name")
    options: list[Variant | None] = [*variants] or [None]
    for scenario in scenarios:  # every agent under test is valid before anything runs
        for variant in options:
            agent_under_test(scenario, agents or {}, variant)
    before = _load_baseline(baseline) if baseline is not None else None
    by_variant = asyncio.run(_run_variants(list(scenarios) * repeat, variants, concurrency, agents, setup))
    results = [r for group in by_variant.values() for r in group]
    for name, group in by_variant.items():
        if variants:
            out.write(f"== variant {name}\n")
        table(group, out)
    if variants:
        side_by_side(by_variant, out, small_threshold)
    if json_out is not None:
        written: dict[str, Any] = {"summary": summary(results), "scenarios": by_scenario(results)}
        if variants:
            written["variants"] = {name: summary(group) for name, group in by_variant.items()}
        written["results"] = _RESULTS.dump_python(results, mode="json")
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(written, indent=1) + "\n")
    if before is not None:
        found = compare(results, before)
        out.write(
            f"baseline mean score {found.baseline_mean:.2f}, candidate {found.candidate_mean:.2f} "
            f"({len(found.compared)} scenario(s) compared)\n"
        )
        for line in found.changed:
            out.write(f"changed (compared): {line}\n")
        for line in found.not_comparable:
            out.write(f"not comparable: {line}\n")
        for line in found.regressions:
            out.write(f"REGRESSION (strict): {line}\n")
        return 1 if found.regressions else 0
    return 0 if all(r.correct for r in results) else 1


async def _run_variants(
    scenarios: Sequence[Scenario],
    variants: Sequence[Variant],
    concurrency: int,
    agents: Mapping[str, Agent] | None,
    setup: EvalSetup | None,
) -> dict[str, list[ScenarioResult]]:
    """Every scenario per variant (one after the other, so variants do not slow each other down)."""
    if not variants:
        return {"": await run_scenarios(scenarios, concurrency=concurrency, configured=agents, setup=setup)}
    return {
        v.name: await run_scenarios(scenarios, concurrency=concurrency, configured=agents, setup=setup, variant=v)
        for v in variants
    }


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
        steps = scenario.model if isinstance(scenario.model, list) else []
        calls = sum(len(step.calls) for step in steps)
        print(
            f"wrote {out}: scenario {scenario.id}, {len(scenario.messages)} turn(s), {calls} tool call(s), "
            f"{len(scenario.invariants)} invariant(s); run it with `switchboard eval run {out}`",
            file=stdout,
        )
        return 0

    return with_redis(redis_url_for(settings), go)
