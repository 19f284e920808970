"""Agent-runtime overhead (issue #3): per step of ``Runtime.run_turn``, and per Monty program run.

**Per step.** A zero-latency scripted model (it yields a ``noop`` tool call until it has seen ``k`` tool results,
then a one-word answer) and a no-op tool, so nearly everything measured is the runtime itself: prompt and
request building, the context-budget fit, streaming into the reply, the decision fold, the tool gateway
(validation, idempotency key, outcome tiers), budgets and the step/tool/usage events (into an in-memory
sink; the queue's Redis writes are in the e2e figures). The model's and the tool's own costs are measured
alone in the same run and subtracted:

    overhead per step = (turn time − steps × model stream − tool calls × tool call) / steps

**Per program.** ``core.codeact.run_program`` on a warm Monty pool: a pure computation and a program making two
tool calls; side by side, CPython compiling and running the same computation in-process (no sandbox).

    python -m bench.runtime
    python -m bench.runtime --quick
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench._harness import SUMMARY_HEADERS, Row, fmt, median, parser, percentile, render_table, rounds_of, verdicts
from switchboard.core.agent import codeact
from switchboard.core.agent.config import Agent, AgentLimits, AgentProfile
from switchboard.core.agent.runtime import Runtime
from switchboard.core.events import Event
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.core.model import Finished, ModelEvent, ModelRequest, TextDelta, ToolCall, ToolCallEvent, Usage
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.turn import HistoryEntry, TurnRequest

TARGET_STEP_MS = 2.0
TARGET_PROGRAM_MS = 5.0
PURE_PROGRAM = "total = 0\nfor i in range(200):\n    total += i * i\ntotal\n"
TOOL_PROGRAM = "a = noop()\nb = noop()\n[a, b]\n"


class _Empty(BaseModel):
    pass


async def _noop(args: Any, ctx: ToolContext) -> dict[str, Any]:
    return {"ok": True}


NOOP = Tool(name="noop", description="Does nothing and says so.", input=_Empty, fn=_noop)


class ScriptedModel:
    """Zero latency: ``tool_steps`` calls of ``noop`` (one per step), then a short answer."""

    provider = "offline"

    def __init__(self, tool_steps: int) -> None:
        self.tool_steps = tool_steps

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Count the tool results since the last user message and decide from that."""
        done = 0
        for message in reversed(request.messages):
            if message.role == "user":
                break
            done += message.role == "tool"
        if done < self.tool_steps:
            yield ToolCallEvent(call=ToolCall(id=f"call_{done}", name="noop", arguments={}))
            yield Usage(input_tokens=50, output_tokens=5)
            yield Finished(stop_reason="tool_calls")
        else:
            yield TextDelta(text="Done.")
            yield Usage(input_tokens=50, output_tokens=1)
            yield Finished()

    async def aclose(self) -> None:
        """Nothing to release."""


class _Store:
    def __init__(self, history: Sequence[HistoryEntry]) -> None:
        self.history = list(history)
        self.slots: dict[str, Any] = {}

    async def load_history(self, limit: int) -> list[HistoryEntry]:
        return self.history[-limit:]

    async def append_history(self, entries: Sequence[HistoryEntry]) -> None:
        self.history.extend(entries)

    async def load_slots(self) -> dict[str, Any]:
        return dict(self.slots)

    async def save_slot(self, name: str, value: Any) -> None:
        self.slots[name] = value


class _Sink:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def delta(self, text: str) -> None:
        return None

    async def event(self, event: Event) -> None:
        self.events.append(event)


def _history(turns: int) -> list[HistoryEntry]:
    out = []
    for i in range(turns):
        out.append(HistoryEntry(role="user", text=f"question {i}: what about item {i}?", message_id=f"m{i}"))
        out.append(HistoryEntry(role="assistant", text=f"Item {i} is fine; nothing to do about it."))
    return out


def _request(agent: Agent, n: int) -> TurnRequest:
    message = InboundMessage(
        id=f"bench-{n}",
        dedup_key=f"bench-{n}",
        conversation=ConversationRef(agent=agent.name, channel="web", conversation="bench"),
        sender=Sender(id="user-1", name="Ada"),
        text="Please do the thing and tell me when it is done.",
    )
    return TurnRequest(
        session_key=message.session_key, agent=agent, messages=[message], run_id=f"run-{n}", deadline=time.time() + 60
    )


async def time_turns(workspace: Path, tool_steps: int, reps: int, history: int) -> list[float]:
    """Milliseconds of each of ``reps`` turns with ``tool_steps`` tool-calling steps plus the answer."""
    factory = ModelFactory(ProviderConfig())
    factory.override("offline", ScriptedModel(tool_steps))
    registry = default_registry()
    registry.register(NOOP, replace=True)
    runtime = Runtime(models=factory, tools=registry, workspace_root=workspace, model_backoff_s=0.0)
    agent = Agent(
        name="bench",
        profile=AgentProfile(name="Bench"),
        instructions="You are a benchmark agent. Call noop when asked, then answer.",
        model="offline",
        tools=["noop"],
        limits=AgentLimits(max_steps=tool_steps + 2, max_tool_calls=tool_steps + 1),
    )
    store = _Store(_history(history))
    took = []
    for n in range(reps + 3):
        sink = _Sink()
        t = time.perf_counter()
        result = await runtime.run_turn(_request(agent, n), sink, store)
        elapsed = (time.perf_counter() - t) * 1000
        if result.steps != tool_steps + 1 or result.stopped_by is not None:
            raise RuntimeError(f"the scripted turn took {result.steps} steps (stopped by {result.stopped_by})")
        if n >= 3:  # the first turns warm caches up
            took.append(elapsed)
    return took


async def time_model_and_tool(reps: int) -> tuple[float, float]:
    """Median ms of draining one scripted model step, and of one direct no-op tool call."""
    model = ScriptedModel(1)
    request = ModelRequest(model="offline", system="s", messages=[])
    ctx = ToolContext(
        session_key=_request(Agent(name="x"), 0).session_key,
        tenant="default",
        run_id="r",
        actor="a",
        workspace=Path(tempfile.gettempdir()),
        idempotency_key="k",
    )
    streams, tools = [], []
    for _ in range(reps):
        t = time.perf_counter()
        async for _event in model.stream(request):
            pass
        streams.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        await NOOP.fn(_Empty(), ctx)
        tools.append((time.perf_counter() - t) * 1000)
    return median(streams), median(tools)


async def time_programs(reps: int) -> dict[str, list[float]]:
    """Milliseconds per ``run_program`` (pure; two tool calls) and per CPython compile + exec of the pure one."""

    async def call_tool(name: str, args: dict[str, Any]) -> Any:
        return {"ok": True}

    out: dict[str, list[float]] = {"pure": [], "tools": [], "cpython": []}
    for _ in range(5):  # start the pool's worker and warm it
        await codeact.run_program(PURE_PROGRAM, call_tool=call_tool, tool_names=["noop"])
    for _ in range(reps):
        t = time.perf_counter()
        result = await codeact.run_program(PURE_PROGRAM, call_tool=call_tool, tool_names=["noop"])
        out["pure"].append((time.perf_counter() - t) * 1000)
        if result.error is not None or result.value != sum(i * i for i in range(200)):
            raise RuntimeError(f"the program failed: {result.error or result.value}")
        t = time.perf_counter()
        result = await codeact.run_program(TOOL_PROGRAM, call_tool=call_tool, tool_names=["noop"])
        out["tools"].append((time.perf_counter() - t) * 1000)
        if result.error is not None or result.calls != 2:
            raise RuntimeError(f"the tool program failed: {result.error or result.calls}")
        t = time.perf_counter()
        scope: dict[str, Any] = {}
        exec(compile(PURE_PROGRAM.replace("\ntotal\n", "\n"), "program.py", "exec"), scope)
        out["cpython"].append((time.perf_counter() - t) * 1000)
    return out


async def run(argv: list[str] | None = None) -> list[Row]:
    """Run the benchmark, print its tables, return the summary rows."""
    p = parser(__doc__.splitlines()[0] if __doc__ else "runtime")
    p.add_argument("--steps", type=int, default=10, help="tool-calling steps in the long turn (default 10)")
    p.add_argument("--history", type=int, default=10, help="earlier exchanges in the session's history (default 10)")
    ns = p.parse_args(argv)
    rounds = rounds_of(ns)
    reps = 10 if ns.quick else 200
    print(f"runtime: {rounds} round(s) × {reps} turns / programs; history {ns.history} exchanges", flush=True)
    per_round: list[dict[str, float]] = []
    programs: dict[str, list[float]] = {"pure": [], "tools": [], "cpython": []}
    with tempfile.TemporaryDirectory(prefix="sb-bench-runtime-") as tmp:
        for _ in range(rounds):
            one = await time_turns(Path(tmp) / "ws", 0, reps, ns.history)
            many = await time_turns(Path(tmp) / "ws", ns.steps, max(reps // 4, 5), ns.history)
            model_ms, tool_ms = await time_model_and_tool(reps)
            k = ns.steps
            t1, tk = median(one), median(many)
            per_round.append(
                {
                    "t1": t1,
                    "tk": tk,
                    "model": model_ms,
                    "tool": tool_ms,
                    "step_overhead": (tk - (k + 1) * model_ms - k * tool_ms) / (k + 1),
                    "answer_overhead": t1 - model_ms,
                    "marginal": (tk - t1) / k - model_ms - tool_ms,
                    "p90_step": (percentile(many, 90) - (k + 1) * model_ms - k * tool_ms) / (k + 1),
                }
            )
            for key, values in (await time_programs(max(reps // 2, 5))).items():
                programs[key] += values
    codeact.default_runner().close()
    return verdicts(report(per_round, programs, ns.steps), ns.quick)


def report(per_round: list[dict[str, float]], programs: dict[str, list[float]], k: int) -> list[Row]:
    """Print the tables; return the summary rows."""

    def m(key: str) -> float:
        return median([r[key] for r in per_round])

    print()
    print(
        render_table(
            f"Agent runtime, per step (median of {len(per_round)} round(s); ms)",
            ["figure", "ms"],
            [
                [f"turn with {k} tool steps + answer ({k + 1} steps)", fmt(m("tk"), 3)],
                ["turn with just an answer (1 step)", fmt(m("t1"), 3)],
                ["baseline: scripted model stream alone, per step", fmt(m("model"), 4)],
                ["baseline: no-op tool called directly", fmt(m("tool"), 4)],
                [
                    f"**runtime overhead per step** ({k + 1}-step turn, model and tool subtracted)",
                    fmt(m("step_overhead"), 3),
                ],
                ["runtime overhead per step, p90 turn", fmt(m("p90_step"), 3)],
                ["marginal cost of one more tool step (runtime + gateway)", fmt(m("marginal"), 3)],
                ["overhead of a one-step turn (prompt, answer, usage event)", fmt(m("answer_overhead"), 3)],
            ],
        )
    )
    print(
        render_table(
            "Monty program runs (core.codeact.run_program, warm pool; ms)",
            ["program", "runs", "median", "p90", "p99", "mean"],
            [
                [
                    name,
                    len(values),
                    fmt(median(values), 3),
                    fmt(percentile(values, 90), 3),
                    fmt(percentile(values, 99), 3),
                    fmt(statistics.fmean(values) if values else float("nan"), 3),
                ]
                for name, values in (
                    ("loop of 200 multiplications", programs["pure"]),
                    ("two tool calls", programs["tools"]),
                    ("baseline: CPython compile + exec of the loop, no sandbox", programs["cpython"]),
                )
            ],
        )
    )
    step = m("step_overhead")
    program = median(programs["pure"])
    tools = median(programs["tools"])
    return [
        Row(
            "runtime",
            "overhead per step (excl. model and tools), median",
            f"{step:.3f} ms",
            f"≤ {TARGET_STEP_MS:g} ms",
            step <= TARGET_STEP_MS,
        ),
        Row(
            "runtime",
            "Monty program run, median",
            f"{program:.3f} ms",
            f"≤ {TARGET_PROGRAM_MS:g} ms",
            program <= TARGET_PROGRAM_MS,
        ),
        Row(
            "runtime",
            "Monty program with two tool calls, median",
            f"{tools:.3f} ms",
            f"≤ {TARGET_PROGRAM_MS:g} ms",
            tools <= TARGET_PROGRAM_MS,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.runtime``."""
    rows = asyncio.run(run(argv))
    print(render_table("Summary", SUMMARY_HEADERS, [r.cells() for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
