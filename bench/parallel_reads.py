"""Independent reads of one model step (issue #23): 3 reads of 300 ms each, sequential vs parallel, side by side.

A scripted model asks for three calls of a read tool that sleeps 300 ms in one step, then answers; the turn runs
through ``Runtime.run_turn`` (the tool gateway, budgets, events) once with ``parallel_reads=1`` (one call after
another, as before) and once with the default bound. The figure is the wall time of the whole turn; the target is
the issue's: three 300 ms reads in at most 400 ms.

    python -m bench.parallel_reads
    python -m bench.parallel_reads --quick
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench._harness import SUMMARY_HEADERS, Row, fmt, median, parser, render_table, rounds_of, verdicts
from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.agent.runtime import Runtime
from switchboard.core.events import Event
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.core.model import Finished, ModelEvent, ModelRequest, TextDelta, ToolCall, ToolCallEvent, Usage
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.turn import HistoryEntry, TurnRequest

READS = 3
READ_S = 0.3
TARGET_MS = 400.0


class _Query(BaseModel):
    n: int


async def _slow_read(args: _Query, ctx: ToolContext) -> dict[str, Any]:
    await asyncio.sleep(READ_S)
    return {"n": args.n}


SLOW_READ = Tool(name="slow_read", description="Looks something up (takes 300 ms).", input=_Query, fn=_slow_read)


class ThreeReads:
    """Zero latency: one step asking for three ``slow_read`` calls, then a one-word answer."""

    provider = "offline"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Ask for the reads until their results are in, then answer."""
        if not any(message.role == "tool" for message in request.messages):
            for n in range(READS):
                yield ToolCallEvent(call=ToolCall(id=f"call_{n}", name="slow_read", arguments={"n": n}))
            yield Usage(input_tokens=50, output_tokens=5)
            yield Finished(stop_reason="tool_calls")
        else:
            yield TextDelta(text="done")
            yield Usage(input_tokens=60, output_tokens=1)
            yield Finished()

    async def aclose(self) -> None:
        """Nothing to close."""


class _Store:
    async def load_history(self, limit: int) -> list[HistoryEntry]:
        return []

    async def append_history(self, entries: Any) -> None:
        return None

    async def load_slots(self) -> dict[str, Any]:
        return {}

    async def save_slot(self, name: str, value: Any) -> None:
        return None

    async def reset_conversation(self) -> None:
        return None


class _Sink:
    async def delta(self, text: str) -> None:
        return None

    async def event(self, event: Event) -> None:
        return None


def _request(n: int) -> TurnRequest:
    agent = Agent(name="a", profile=AgentProfile(name="A"), instructions="Answer.", tools=["slow_read"])
    message = InboundMessage(
        id=f"m{n}",
        dedup_key=f"d{n}",
        conversation=ConversationRef(agent="a", channel="web", conversation="c1"),
        sender=Sender(id="u1", name="U"),
        text="look three things up",
    )
    return TurnRequest(
        session_key=message.session_key,
        agent=agent,
        messages=[message],
        run_id=f"run-{n}",
        deadline=time.time() + 60,
    )


async def time_turn(root: Path, parallel_reads: int, n: int) -> float:
    """Milliseconds one turn with three 300 ms reads in one step takes."""
    models = ModelFactory(ProviderConfig())
    models.override("offline", ThreeReads())
    registry = default_registry()
    registry.register(SLOW_READ, replace=True)
    runtime = Runtime(models=models, tools=registry, workspace_root=root, parallel_reads=parallel_reads)
    started = time.perf_counter()
    await runtime.run_turn(_request(n), _Sink(), _Store())
    return (time.perf_counter() - started) * 1000


async def run(argv: list[str] | None = None) -> list[Row]:
    """Run the benchmark, print its table, return the summary rows."""
    ns = parser(__doc__.splitlines()[0] if __doc__ else "parallel_reads").parse_args(argv)
    rounds = rounds_of(ns)
    print(f"parallel_reads: {rounds} round(s) of {READS} reads × {READ_S * 1000:.0f} ms in one step", flush=True)
    sequential: list[float] = []
    parallel: list[float] = []
    with tempfile.TemporaryDirectory(prefix="sb-bench-parallel-") as tmp:
        for n in range(rounds):
            sequential.append(await time_turn(Path(tmp) / "ws", 1, n))
            parallel.append(await time_turn(Path(tmp) / "ws", 4, n))
    seq, par = median(sequential), median(parallel)
    print(
        render_table(
            f"{READS} reads of {READ_S * 1000:.0f} ms in one model step (whole turn, median of {rounds})",
            ("reads", "wall time (ms)", "speed-up"),
            [
                ("sequential (`SWITCHBOARD_TOOLS__PARALLEL_READS=1`)", fmt(seq), "1.0×"),
                ("parallel (default bound 4)", fmt(par), f"{seq / par:.1f}×"),
            ],
        )
    )
    rows = [Row("parallel_reads", f"{READS}×{READ_S * 1000:.0f} ms reads, one step", f"{fmt(par)} ms",
                f"≤ {TARGET_MS:.0f} ms", par <= TARGET_MS)]  # fmt: skip
    rows = verdicts(rows, ns.quick)
    print(render_table("summary", SUMMARY_HEADERS, [row.cells() for row in rows]))
    return rows


if __name__ == "__main__":
    asyncio.run(run())
