"""Test doubles for one turn: an in-memory SessionStore (our own Protocol), a sink, request builders."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from switchboard.core.agent.config import Agent, AgentLimits, AgentProfile
from switchboard.core.agent.replay import RecordedStep
from switchboard.core.agent.runtime import Runtime
from switchboard.core.events import Event
from switchboard.core.messages import ConversationRef, InboundEvent, InboundMessage, Posted, Sender
from switchboard.core.model import Finished, ModelEvent, TextDelta, ToolCall, ToolCallEvent, Usage
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import ToolRegistry, default_registry
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.turn import HistoryEntry, TurnRequest

RECORDINGS = Path(__file__).resolve().parent.parent / "recordings"


class MemoryStore:
    """SessionStore in a dict; records what was written."""

    def __init__(self, history: Sequence[HistoryEntry] = (), slots: dict[str, Any] | None = None) -> None:
        self.history = list(history)
        self.slots: dict[str, Any] = dict(slots or {})
        self.appended: list[HistoryEntry] = []
        self.saved: list[tuple[str, Any]] = []
        self.resets = 0

    async def load_history(self, limit: int) -> list[HistoryEntry]:
        return self.history[-limit:]

    async def append_history(self, entries: Sequence[HistoryEntry]) -> None:
        self.appended.extend(entries)
        self.history.extend(entries)

    async def load_slots(self) -> dict[str, Any]:
        return dict(self.slots)

    async def save_slot(self, name: str, value: Any) -> None:
        self.saved.append((name, value))
        self.slots[name] = value

    async def reset_conversation(self) -> None:
        self.history.clear()
        self.slots.clear()
        self.resets += 1


class MemorySink:
    """TurnSink collecting deltas and events."""

    def __init__(self) -> None:
        self.deltas: list[str] = []
        self.events: list[Event] = []

    async def delta(self, text: str) -> None:
        self.deltas.append(text)

    async def event(self, event: Event) -> None:
        self.events.append(event)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def of(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.kind == kind]


def message(
    text: str, *, id: str = "m1", conversation: str = "c1", event: InboundEvent | None = None
) -> InboundMessage:
    return InboundMessage(
        id=id,
        dedup_key=f"d-{id}",
        conversation=ConversationRef(agent="a", channel="web", conversation=conversation),
        sender=Sender(id="user-1", name="Ada"),
        text=text,
        event=event or Posted(),
    )


def agent(*, tools: Sequence[str] = ("current_time",), codeact: bool = False, **limits: Any) -> Agent:
    return Agent(
        name="a",
        profile=AgentProfile(name="a"),  # a ready agent: drafts are not served
        instructions="Be brief.",
        tools=list(tools),
        codeact=codeact,
        limits=AgentLimits(**limits),
    )


def request(
    text: str = "hello", *, agent_: Agent | None = None, deadline_s: float = 60.0, run_id: str = "run-1", **kw: Any
) -> TurnRequest:
    msg = message(text)
    return TurnRequest(
        session_key=msg.session_key,
        agent=agent_ or agent(),
        messages=[msg],
        run_id=run_id,
        deadline=time.time() + deadline_s,
        **kw,
    )


def runtime(
    tmp_path: Path,
    *,
    model: Any | None = None,
    registry: ToolRegistry | None = None,
    prices: dict[str, dict[str, float]] | None = None,
    delay_ms: int = 0,
    **kw: Any,
) -> Runtime:
    factory = ModelFactory(ProviderConfig(offline_delay_ms=delay_ms))
    if model is not None:
        factory.override("offline", model)
    return Runtime(
        models=factory,
        tools=registry or default_registry(),
        workspace_root=tmp_path / "ws",
        prices=prices,
        model_backoff_s=0.0,
        **kw,
    )


def calls_step(*calls: tuple[str, dict[str, Any]], step: int = 1, prefix: str = "c") -> RecordedStep:
    events: list[ModelEvent] = [
        ToolCallEvent(call=ToolCall(id=f"{prefix}{step}_{i}", name=name, arguments=args))
        for i, (name, args) in enumerate(calls)
    ]
    events += [Usage(input_tokens=10, output_tokens=5), Finished(stop_reason="tool_calls")]
    return RecordedStep(step=step, events=events)


def answer_step(text: str, *, step: int = 1) -> RecordedStep:
    words = text.split(" ")
    events: list[ModelEvent] = [TextDelta(text=(" " if i else "") + w) for i, w in enumerate(words)]
    events += [Usage(input_tokens=10, output_tokens=len(words)), Finished()]
    return RecordedStep(step=step, events=events)


class Empty(BaseModel):
    pass


class Payload(BaseModel):
    n: int = 0


def make_tool(name: str, fn: Any, *, input: type[BaseModel] = Empty, **kw: Any) -> Tool:
    return Tool(name=name, description=f"test tool {name}", input=input, fn=fn, **kw)


async def noop(args: Any, ctx: ToolContext) -> dict[str, Any]:
    return {"ok": True}


class FlakyInput(BaseModel):
    n: int


def flaky_tool(counter: list[int]) -> Tool:
    """A tool that always fails transiently-but-not-retryably, counting its runs."""

    async def fn(args: FlakyInput, ctx: ToolContext) -> Any:
        counter.append(args.n)
        raise RuntimeError("upstream said no")

    return make_tool("flaky", fn, input=FlakyInput, retry_on=frozenset())


def big_tool(rows: int = 200) -> Tool:
    """A read tool whose result is a few KB of JSON (a data card, not inline)."""

    async def fn(args: Empty, ctx: ToolContext) -> Any:
        return [{"id": i, "name": f"item {i}", "price": i * 1.5} for i in range(rows)]

    return make_tool("big", fn)


def registry_with(*extra: Tool) -> ToolRegistry:
    registry = default_registry()
    for tool in extra:
        registry.register(tool, replace=True)
    return registry
