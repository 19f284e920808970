"""Compaction measured: the long scenarios of ``evals/long/`` with compaction off, deterministic and native.

    python -m bench.compaction                 # every scenario of evals/long, the three modes side by side
    python -m bench.compaction --json out.json # the figures as JSON too

Each scenario runs through :func:`switchboard.evals.runner.run_scenarios` three times, on a real runtime, against one
fake OpenAI Responses API served over HTTP (``tests/fakes/openai_api.py``: its ``/v1/responses/compact`` keeps the
user's messages and answers one opaque compaction item, as OpenAI does):

- ``off``: a context budget that holds the whole conversation (nothing is compacted);
- ``deterministic``: a small budget (:data:`BUDGET_TOKENS`), older turns folded into the ``gw.compaction/1`` record;
- ``native``: the same budget with ``compaction: native`` (the provider compacts past 80 % of it).

The model is a *reader*: a deterministic stand-in that answers only from what the request carries (message texts and
tool results; never the opaque compaction item). Asked for a fact, it answers it when the fact is in view; when not,
it calls ``search_history`` once (an extra step) and then answers or says it does not know. Asked to make sure an
order is placed, it orders again unless the request shows that the earlier order is in doubt. So the figures say what
each compaction mode leaves in view, not how well a real model reads it.

Printed per scenario and mode: facts recalled, steps (and extra steps against ``off``), ``search_history`` calls,
tokens, compactions, and for a write in doubt whether it survived (``kept``: never repeated; ``held``: the turn
stopped for review; ``lost``: ordered again).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from switchboard.core.agent.config import Agent, AgentLimits, AgentProfile
from switchboard.core.providers import ProviderConfig
from switchboard.evals.runner import EvalSetup, ScenarioResult, run_scenarios
from switchboard.evals.scenario import AgentUnderTest, Scenario, load_scenarios
from tests.fakes.model_script import Call
from tests.fakes.openai_api import FakeOpenAI

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "evals" / "long"
BUDGET_TOKENS = 2_500
"""``limits.max_input_tokens`` of the compacting modes: about a dozen chat turns fit, the rest is compacted."""
OFF_TOKENS = 400_000
"""The budget of ``off``: every scenario's whole conversation fits."""
MODES: dict[str, tuple[int, str]] = {
    "off": (OFF_TOKENS, "deterministic"),
    "deterministic": (BUDGET_TOKENS, "deterministic"),
    "native": (BUDGET_TOKENS, "native"),
}
MODEL = "openai:reader-1"

_REMEMBER = re.compile(r"Remember: the (?P<key>[A-Za-z ]+?) is (?P<value>[^.]+)\.")
_QUESTION = re.compile(r"What is the (?P<key>[A-Za-z ]+?)\?")
_LOOKUP = re.compile(r"Look up the customers? (?P<names>\w+(?: and \w+)*)\.")
_ORDER = re.compile(r"Order (?P<qty>\d+) of (?P<sku>[A-Z0-9-]+)\.")
_STATUS = re.compile(r"Is my order of (?P<sku>[A-Z0-9-]+) done\?")
_ENSURE = re.compile(r"Please make sure (?P<qty>\d+) of (?P<sku>[A-Z0-9-]+) are ordered\.")
_FACT = re.compile(r"the (?P<key>[A-Za-z ]+?) is (?P<value>[^.\"\n<]+?)\.")
_DOUBT = ("ambiguous_timeout", "in doubt", "in_doubt", "write_in_doubt")


# ---------------------------------------------------------------- the reader


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _chunks(items: list[dict[str, Any]]) -> list[str]:
    """What the request shows, one chunk per item; a tool result is prefixed with the call it answers."""
    calls = {
        i.get("call_id"): f"{i.get('name')} {i.get('arguments')}" for i in items if i.get("type") == "function_call"
    }
    chunks = []
    for item in items:
        kind = item.get("type")
        if kind == "message":
            chunks.append(_text(item.get("content")))
        elif kind == "function_call":
            chunks.append(f"{item.get('name')} {item.get('arguments')}")
        elif kind == "function_call_output":
            chunks.append(f"{calls.get(item.get('call_id'), '')} -> {item.get('output')}")
    return chunks  # a compaction item is opaque: the reader cannot read it


def _order_state(chunks: list[str], sku: str) -> str:
    for chunk in chunks:
        for line in chunk.splitlines() or [chunk]:
            about = sku in line or "place_order" in line
            if about and any(marker in line for marker in _DOUBT):
                return "in doubt"
            if about and '"ordered"' in line:
                return "done"
    return "unknown"


@dataclass
class _Step:
    text: str = ""
    calls: list[Call] = field(default_factory=list)


def read(body: dict[str, Any]) -> _Step:
    """The reader's step for one request (see the module docstring)."""
    items = [i for i in body.get("input") or [] if isinstance(i, dict)]
    tools = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
    users = [n for n, i in enumerate(items) if i.get("type") == "message" and i.get("role") == "user"
             and not _text(i.get("content")).lstrip().startswith("<data")]  # fmt: skip
    last = users[-1] if users else -1
    ask = _text(items[last].get("content")).split("\n\n")[-1].strip() if users else ""
    before, turn = _chunks(items[:last]), items[last + 1 :]
    done = [(i.get("name"), json.loads(i.get("arguments") or "{}")) for i in turn if i.get("type") == "function_call"]
    seen = before + _chunks(turn)
    if m := _REMEMBER.fullmatch(ask):
        return _Step(f"Noted: the {m['key']} is {m['value']}.")
    if m := _QUESTION.fullmatch(ask):
        key = m["key"]
        for chunk in reversed(seen):
            found = [f for f in _FACT.finditer(chunk) if f["key"].lower().endswith(key.lower())]
            if found:
                return _Step(f"The {key} is {found[-1]['value']}.")
        if "search_history" in tools and not any(name == "search_history" for name, _ in done):
            return _Step(calls=[Call("search_history", {"query": key})])
        return _Step(f"I don't know the {key}.")
    if m := _LOOKUP.fullmatch(ask):
        looked = {args.get("name") for name, args in done if name == "lookup_customer"}
        for customer in m["names"].split(" and "):  # one lookup a step
            if customer not in looked:
                return _Step(calls=[Call("lookup_customer", {"name": customer})])
        return _Step(f"I looked up {m['names']}.")
    if (m := _ORDER.fullmatch(ask)) or (m := _ENSURE.fullmatch(ask)):
        state = _order_state(seen, m["sku"])
        if state == "unknown" and not any(name == "place_order" for name, _ in done):
            return _Step(calls=[Call("place_order", {"sku": m["sku"], "qty": int(m["qty"])})])
        if state == "in doubt":
            return _Step(f"The order of {m['sku']} is in doubt: it may have gone through; I will not order again.")
        return _Step(f"Ordered {m['qty']} of {m['sku']}.")
    if m := _STATUS.fullmatch(ask):
        return _Step(f"The order of {m['sku']}: {_order_state(seen, m['sku'])}.")
    return _Step("Here is what I know: " + " ".join(["it depends on the season and the weather"] * 6) + ".")


class ReaderAPI(FakeOpenAI):
    """The fake Responses API whose every answer is the reader's step for the request it got."""

    folded = 0
    """Requests that carried a deterministic compaction record."""

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if any("(compacted record)" in _text(i.get("content")) for i in body.get("input") or [] if isinstance(i, dict)):
            self.folded += 1
        step = read(body)
        tokens = len(json.dumps(body.get("input"), ensure_ascii=False)) // 4 + len(body.get("instructions") or "") // 4
        self.reply(*([step.text] if step.text else []), calls=step.calls, input_tokens=tokens,
                   output_tokens=max(1, len(step.text.split())))  # fmt: skip
        return await super()._responses(request)


# ---------------------------------------------------------------- the runs


def _facts(scenario: Scenario) -> dict[str, str]:
    """Every fact the scenario states (its messages and its tools' answers), by key."""
    sources = [*scenario.messages, *(json.dumps(t.model_dump(mode="json")) for t in scenario.tools)]
    return {f["key"].lower(): f["value"] for text in sources for f in _FACT.finditer(text)}


@dataclass
class Figures:
    """One scenario under one mode."""

    scenario: str
    mode: str
    asked: int
    recalled: int
    steps: int
    searches: int
    tokens: int
    folded: int
    """Model requests that carried the deterministic record."""
    compactions: int
    """Native compactions (``/v1/responses/compact`` calls)."""
    writes_in_doubt: int
    pending: str
    """``kept``, ``held``, ``lost`` or ``-`` (no write in doubt in the scenario)."""
    held: int
    passed: bool


def figures(scenario: Scenario, result: ScenarioResult, mode: str, folded: int, compactions: int) -> Figures:
    """What one run shows (see the module docstring)."""
    trajectory = result.trajectory
    assert trajectory is not None
    facts = _facts(scenario)
    asked = recalled = 0
    for message, answer in zip(scenario.messages, trajectory.answers, strict=False):
        if m := _QUESTION.fullmatch(message):
            asked += 1
            value = next((v for k, v in facts.items() if k.endswith(m["key"].lower())), None)
            recalled += value is not None and value in answer
    orders = [c for c in trajectory.calls if c.tool == "place_order"]
    held = sum(1 for e in trajectory.events if e.get("kind") == "compaction_held")
    pending = "-" if not orders else "held" if held else "kept" if len(orders) == 1 else "lost"
    return Figures(
        scenario=scenario.id,
        mode=mode,
        asked=asked,
        recalled=recalled,
        steps=trajectory.steps,
        searches=sum(1 for c in trajectory.calls if c.tool == "search_history"),
        tokens=trajectory.input_tokens + trajectory.output_tokens,
        folded=folded,
        compactions=compactions,
        writes_in_doubt=len(orders),
        pending=pending,
        held=held,
        passed=result.error is None and all(c.passed for c in result.checks),
    )


def _agents(mode: str) -> dict[str, Agent]:
    budget, compaction = MODES[mode]
    agent = Agent(name="reader", profile=AgentProfile(name="reader"), instructions="Be brief.", model=MODEL,
                  limits=AgentLimits(max_input_tokens=budget, max_steps=6), compaction=compaction)  # fmt: skip
    return {"reader": agent}


def _as_reader(scenario: Scenario) -> Scenario:
    """The scenario played by the reader (its tools and instructions kept; model, limits and compaction the mode's)."""
    spec = scenario.agent
    agent = AgentUnderTest(configured="reader", instructions=spec.instructions, tools=spec.tools)
    return scenario.model_copy(update={"agent": agent, "model": "offline"})


async def _serve(api: FakeOpenAI) -> tuple[web.AppRunner, str]:
    app_runner = web.AppRunner(api.app())
    await app_runner.setup()
    site = web.TCPSite(app_runner, "127.0.0.1", 0)
    await site.start()
    port = app_runner.addresses[0][1]
    return app_runner, f"http://127.0.0.1:{port}/v1"


async def measure(scenarios: list[Scenario], modes: list[str]) -> list[Figures]:
    """Every scenario under every mode, one run at a time (the reader's answers queue in call order)."""
    found: list[Figures] = []
    for mode in modes:
        for scenario in scenarios:
            api = ReaderAPI()
            app_runner, url = await _serve(api)
            setup = EvalSetup(providers=ProviderConfig(openai_api_key="sk-bench", openai_base_url=url))
            try:
                (result,) = await run_scenarios(
                    [_as_reader(scenario)], concurrency=1, configured=_agents(mode), setup=setup
                )
            finally:
                api.release()
                await app_runner.cleanup()
            if result.error:
                print(f"{scenario.id} [{mode}]: {result.error}", file=sys.stderr)
            found.append(figures(scenario, result, mode, api.folded, len(api.compactions())))
    return found


def table(rows: list[Figures]) -> str:
    """The figures side by side, extra steps counted against ``off``."""
    base = {r.scenario: r.steps for r in rows if r.mode == "off"}
    head = f"{'scenario':22} {'mode':14} {'facts':>6} {'steps':>6} {'extra':>6} {'search':>7} {'tokens':>8} "
    head += f"{'folded':>7} {'native':>7} {'pending':>8} {'checks':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        extra = r.steps - base[r.scenario] if r.scenario in base else 0
        facts = f"{r.recalled}/{r.asked}" if r.asked else "-"
        lines.append(
            f"{r.scenario:22} {r.mode:14} {facts:>6} {r.steps:>6} {extra:>+6} {r.searches:>7} {r.tokens:>8} "
            f"{r.folded:>7} {r.compactions:>7} {r.pending:>8} {'pass' if r.passed else 'FAIL':>7}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the measurement and print the table (and write JSON with ``--json``)."""
    parser = argparse.ArgumentParser(prog="python -m bench.compaction", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, default=[SCENARIOS])
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: off,deterministic,native")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    files = [p for path in args.paths for p in (sorted(path.glob("*.yaml")) if path.is_dir() else [path])]
    scenarios = [s for f in files for s in load_scenarios(f)]
    started = time.perf_counter()
    rows = asyncio.run(measure(scenarios, [m for m in args.modes.split(",") if m]))
    print(table(rows))
    print(f"\n{len(scenarios)} scenario(s) x {len(rows) // max(1, len(scenarios))} mode(s) in "
          f"{time.perf_counter() - started:.1f} s; budget {BUDGET_TOKENS} tokens when compacting")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
