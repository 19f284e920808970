"""Independent reads in one model step run concurrently (bounded); writes stay sequential barriers."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from switchboard import tracing
from switchboard.core.actions import SettleChoices, ShowToolCall
from switchboard.core.agent.replay import ReplayModel
from switchboard.core.model import ChatMessage
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.turn import TurnResult
from tests.core.turns import (
    MemorySink,
    MemoryStore,
    Payload,
    agent,
    answer_step,
    calls_step,
    flaky_tool,
    make_tool,
    registry_with,
    request,
    runtime,
)

Span = tuple[str, float, float]
"""A tool run as the tool itself recorded it: (label, started, ended) on the monotonic clock."""


class Timeline:
    """Slow test tools that record when each run started and ended."""

    def __init__(self) -> None:
        self.runs: list[Span] = []

    def tool(self, name: str, seconds: float | dict[int, float], *, write: bool = False, fails: int = -1) -> Tool:
        """A tool sleeping ``seconds`` (or ``seconds[n]`` for argument ``n``); argument ``fails`` raises."""

        async def fn(args: Payload, ctx: ToolContext) -> Any:
            began = time.monotonic()
            await asyncio.sleep(seconds if isinstance(seconds, float) else seconds[args.n])
            self.runs.append((f"{name}{args.n}", began, time.monotonic()))
            if args.n == fails:
                raise RuntimeError("upstream said no")
            return {"tool": name, "n": args.n}

        return make_tool(
            name, fn, input=Payload, side_effect="write" if write else "read", cost=5 if write else 1,
            retry_on=frozenset(),
        )  # fmt: skip

    def of(self, label: str) -> Span:
        return next(run for run in self.runs if run[0] == label)


def overlapping(runs: list[Span]) -> bool:
    """Every run was under way at one same moment: the latest start came before the earliest end."""
    return max(run[1] for run in runs) < min(run[2] for run in runs)


def tool_messages(model: ReplayModel, step: int = 1) -> list[ChatMessage]:
    """The tool results the model read at the start of step ``step + 1``, in the order they were appended."""
    return [m for m in model.requests[step].messages if m.role == "tool"]


class ActivityRecorder(MemorySink):
    """A sink that shows tool cards, keeping each one."""

    def __init__(self) -> None:
        super().__init__()
        self.cards: list[ShowToolCall] = []

    async def activity(self, action: ShowToolCall | SettleChoices) -> None:
        if isinstance(action, ShowToolCall):
            self.cards.append(action)


async def run(
    tmp_path: Path, tools: list[Tool], *calls: tuple[str, dict[str, Any]], sink: MemorySink | None = None, **kw: Any
) -> tuple[TurnResult, ReplayModel]:
    model = ReplayModel([calls_step(*calls), answer_step("done", step=2)])
    limits = kw.pop("limits", {})
    result = await runtime(tmp_path, model=model, registry=registry_with(*tools), **kw).run_turn(
        request("go", agent_=agent(tools=[t.name for t in tools], **limits)), sink or MemorySink(), MemoryStore()
    )
    return result, model


async def test_three_reads_of_one_step_run_at_the_same_time(tmp_path: Path) -> None:
    line = Timeline()
    await run(tmp_path, [line.tool("slow", 0.3)], *[("slow", {"n": n}) for n in range(3)])
    assert len(line.runs) == 3 and overlapping(line.runs)


async def test_results_are_appended_in_the_order_asked_not_the_order_finished(tmp_path: Path) -> None:
    line = Timeline()
    slow = line.tool("slow", {0: 0.3, 1: 0.15, 2: 0.01})
    _, model = await run(tmp_path, [slow], *[("slow", {"n": n}) for n in range(3)])
    assert [label for label, *_ in line.runs] == ["slow2", "slow1", "slow0"]  # finished last to first
    results = tool_messages(model)
    assert [m.tool_call_id for m in results] == ["c1_0", "c1_1", "c1_2"]
    assert [json.loads(m.content)["n"] for m in results] == [0, 1, 2]


async def test_one_parallel_read_setting_keeps_them_sequential(tmp_path: Path) -> None:
    line = Timeline()
    await run(tmp_path, [line.tool("slow", 0.05)], *[("slow", {"n": n}) for n in range(3)], parallel_reads=1)
    ordered = sorted(line.runs, key=lambda run: run[1])
    assert all(earlier[2] <= later[1] for earlier, later in itertools.pairwise(ordered))


async def test_the_bound_caps_how_many_reads_run_at_once(tmp_path: Path) -> None:
    line = Timeline()
    await run(tmp_path, [line.tool("slow", 0.1)], *[("slow", {"n": n}) for n in range(4)], parallel_reads=2)
    moments = sorted(t for run in line.runs for t in run[1:])
    most = max(sum(1 for run in line.runs if run[1] <= t < run[2]) for t in moments)
    assert most == 2


async def test_a_write_between_reads_is_a_barrier(tmp_path: Path) -> None:
    line = Timeline()
    tools = [line.tool("look", 0.1), line.tool("save", 0.05, write=True)]
    calls = [("look", {"n": 0}), ("look", {"n": 1}), ("save", {"n": 2}), ("look", {"n": 3}), ("look", {"n": 4})]
    _, model = await run(tmp_path, tools, *calls)
    assert overlapping([line.of("look0"), line.of("look1")]) and overlapping([line.of("look3"), line.of("look4")])
    save = line.of("save2")
    assert max(line.of("look0")[2], line.of("look1")[2]) <= save[1]  # the reads before it finished first
    assert save[2] <= min(line.of("look3")[1], line.of("look4")[1])  # the reads after it waited for it
    assert [m.tool_call_id for m in tool_messages(model)] == [f"c1_{i}" for i in range(5)]


async def test_a_failing_read_does_not_affect_the_others(tmp_path: Path) -> None:
    line = Timeline()
    _, model = await run(tmp_path, [line.tool("slow", 0.1, fails=1)], *[("slow", {"n": n}) for n in range(3)])
    assert overlapping(line.runs)
    contents = [json.loads(m.content) for m in tool_messages(model)]
    assert contents[0] == {"tool": "slow", "n": 0} and contents[2] == {"tool": "slow", "n": 2}
    assert "upstream said no" in contents[1]["error"] and contents[1]["error_class"]


async def test_the_tool_call_budget_is_checked_before_the_batch_starts(tmp_path: Path) -> None:
    line = Timeline()
    result, model = await run(
        tmp_path, [line.tool("slow", 0.05)], *[("slow", {"n": n}) for n in range(3)], limits={"max_tool_calls": 2}
    )
    assert sorted(label for label, *_ in line.runs) == ["slow0", "slow1"]  # the third never started
    log = model.requests[1].messages[-1].content  # the budget ran out: the last request holds the work log
    assert log.index('"n":1,') < log.index("not run: the tool-call budget ran out")
    assert result.stopped_by == "tool_calls"


async def test_identical_failing_reads_in_one_step_still_meet_the_repeat_guard(tmp_path: Path) -> None:
    runs: list[int] = []
    _, model = await run(tmp_path, [flaky_tool(runs)], *[("flaky", {"n": 7})] * 3)
    assert runs == [7, 7]  # the third identical call was refused, never run
    assert json.loads(tool_messages(model)[2].content)["error_class"] == "repeated"


async def test_every_overlapping_call_has_its_own_start_and_end_card(tmp_path: Path) -> None:
    line = Timeline()
    sink = ActivityRecorder()
    await run(tmp_path, [line.tool("slow", 0.1)], *[("slow", {"n": n}) for n in range(3)], sink=sink)
    by_call: dict[str, list[str]] = {}
    for card in sink.cards:
        by_call.setdefault(card.call_id, []).append(card.state)
    assert by_call == {f"c1_{i}": ["running", "ok"] for i in range(3)}
    states = [card.state for card in sink.cards]
    assert states[:3] == ["running"] * 3  # all three started before any ended
    assert all(card.duration_ms is not None and card.duration_ms >= 100 for card in sink.cards if card.state == "ok")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.install(None)
        provider.shutdown()


async def test_the_trace_shows_the_tool_spans_overlapping(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    line = Timeline()
    await run(tmp_path, [line.tool("slow", 0.1)], *[("slow", {"n": n}) for n in range(3)])
    calls = [s for s in spans.get_finished_spans() if s.name == "tool.call"]
    assert len(calls) == 3
    assert max(s.start_time or 0 for s in calls) < min(s.end_time or 0 for s in calls)


# ---------------------------------------------------------------- CodeAct: parallel()


async def run_program(tmp_path: Path, tools: list[Tool], code: str, **limits: Any) -> tuple[dict[str, Any], MemorySink]:
    model = ReplayModel([calls_step(("run_program", {"code": code})), answer_step("done", step=2)])
    sink = MemorySink()
    await runtime(tmp_path, model=model, registry=registry_with(*tools)).run_turn(
        request("go", agent_=agent(tools=[t.name for t in tools], codeact=True, **limits)), sink, MemoryStore()
    )
    results = tool_messages(model)
    body: dict[str, Any] = (
        json.loads(results[0].content) if results else {"log": model.requests[1].messages[-1].content}
    )
    return body, sink


async def test_a_program_runs_reads_at_the_same_time_with_parallel(tmp_path: Path) -> None:
    line = Timeline()
    slow = line.tool("slow", {0: 0.3, 1: 0.2, 2: 0.1}, fails=1)
    code = "found = parallel([['slow', {'n': 0}], ['slow', {'n': 1}], ['slow', {'n': 2}]])\nfound"
    body, sink = await run_program(tmp_path, [slow], code)
    assert len(line.runs) == 3 and overlapping(line.runs)
    first, failed, last = body["value"]  # in the order asked; a failure in its place, the others unaffected
    assert first == {"tool": "slow", "n": 0} and last == {"tool": "slow", "n": 2}
    assert "upstream said no" in failed["error"] and failed["error_class"]
    assert [t.tool for t in sink.of("tool_called")].count("slow") == 3


async def test_parallel_in_a_program_refuses_writes(tmp_path: Path) -> None:
    line = Timeline()
    tools = [line.tool("look", 0.01), line.tool("save", 0.01, write=True)]
    body, _ = await run_program(tmp_path, tools, "parallel([['look', {'n': 0}], ['save', {'n': 1}]])")
    assert line.runs == [] and "save" in body["error"] and "reads only" in body["error"]


async def test_parallel_in_a_program_checks_the_budget_before_starting(tmp_path: Path) -> None:
    line = Timeline()
    code = "parallel([['slow', {'n': 0}], ['slow', {'n': 1}], ['slow', {'n': 2}]])"
    body, _ = await run_program(tmp_path, [line.tool("slow", 0.01)], code, max_tool_calls=2)
    assert line.runs == []  # the three would pass the budget (the program itself is one call): none started
    assert "the tool-call budget of this turn ran out" in body["log"]  # the budget ran out: the work log says so
