"""The turn's tool traffic: trust-marked tool messages for the model, history entries for the record.

A ``data`` tool's result is wrapped in a labelled ``<data …>`` envelope, and from then on the turn counts as holding
untrusted content (:func:`holds_untrusted`). At the end of a turn :func:`work_entries` turns calls and results into
history entries, a call always with its result, for later prompts and compaction.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from switchboard.core.agent.budget import StepTokens
from switchboard.core.agent.programs import cap_output
from switchboard.core.model import ChatMessage, Decision, ToolCall, ToolCalls, data_block
from switchboard.core.tools.definition import Tool
from switchboard.core.tools.gateway import ToolOutcome
from switchboard.core.turn import HistoryEntry

__all__ = [
    "MAX_RESULT_CHARS",
    "call_facts",
    "data_source",
    "holds_untrusted",
    "step_detail",
    "stopped_reply",
    "tool_message",
    "untrusted_output",
    "work_entries",
]

MAX_RESULT_CHARS = 8_000
"""Longest tool result kept in the history (head and tail); the event log and workspace files keep the rest."""


def data_source(tool: str, arguments: Mapping[str, Any]) -> str:
    """The label of a data block: the tool and, where it has one, the path or URL it read."""
    where = arguments.get("path") or arguments.get("url")
    return f"{tool}:{where}" if isinstance(where, str) and where else tool


def tool_message(call: ToolCall, content: str, *, untrusted: bool) -> ChatMessage:
    """The result of ``call`` as a tool message; ``untrusted`` content goes inside a data envelope."""
    if untrusted:
        wrapped = data_block(content, source=data_source(call.name, call.arguments))
        return ChatMessage(role="tool", content=wrapped, tool_call_id=call.id, name=call.name, trust="data")
    return ChatMessage(role="tool", content=content, tool_call_id=call.id, name=call.name)


def untrusted_output(tool: Tool | None) -> bool:
    """Results of this tool carry outside text."""
    return tool is not None and tool.output_trust == "data"


def call_facts(tool: Tool | None, outcome: ToolOutcome) -> dict[str, Any]:
    """What the history keeps about one call besides its result (compaction reads these)."""
    return {
        "ok": outcome.ok,
        "side_effect": tool.side_effect if tool is not None else "read",
        "idempotency_key": outcome.idempotency_key,
        "action_sha256": outcome.action_sha256,
        "file": outcome.file,
        "error_class": outcome.error_class,
    }


def holds_untrusted(messages: Iterable[ChatMessage]) -> bool:
    """Untrusted content (a data-class tool result) is among ``messages``."""
    return any(m.role == "tool" and m.trust == "data" for m in messages)


def work_entries(
    messages: Sequence[ChatMessage], facts: Mapping[str, dict[str, Any]], untrusted_from: int | None = None
) -> list[HistoryEntry]:
    """The turn's calls and results as history entries, in order; ``facts`` holds gateway facts by call id.

    Messages from index ``untrusted_from`` on were produced with untrusted content in the context: their
    entries carry ``meta.untrusted`` (see :attr:`HistoryEntry.untrusted`), so showing them later counts too.
    """
    entries: list[HistoryEntry] = []
    now = time.time()
    for index, message in enumerate(messages):
        meta: dict[str, Any] = {}
        if untrusted_from is not None and index >= untrusted_from:
            meta["untrusted"] = True
        if message.role == "assistant" and message.tool_calls:
            meta["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls]
            entries.append(HistoryEntry(role="assistant", text=message.content, at=now, meta=meta))
        elif message.role == "tool" and message.tool_call_id:
            meta.update({"call_id": message.tool_call_id, "tool": message.name})
            meta.update(facts.get(message.tool_call_id, {}))
            if message.trust == "data":
                meta["trust"] = "data"
            text = message.content
            if len(text) > MAX_RESULT_CHARS:
                meta["truncated_chars"] = len(text)
                text = cap_output(text, MAX_RESULT_CHARS)
            entries.append(HistoryEntry(role="tool", text=text, at=now, meta=meta))
    return entries


def stopped_reply(budget: str, messages: Sequence[ChatMessage], tool_calls: int) -> str:
    """The fixed answer of a turn whose ``budget`` ran out before even a last model call could answer.

    ``messages`` are the turn's own (its tool results name what was done).
    """
    names = sorted({m.name for m in messages if m.role == "tool" and m.name})
    done = f"{tool_calls} tool call(s) ({', '.join(names)})" if names else "nothing yet"
    return (
        f"I had to stop before finishing: the {budget} budget of this turn ran out. "
        f"Done: {done}. Not done: the rest of your request; ask me to continue."
    )


def step_detail(
    spec: str,
    decision: Decision,
    usage: StepTokens,
    cost: float,
    duration_s: float,
    final: str | None,
    trace_id: str | None,
) -> dict[str, Any]:
    """The ``detail`` of a ``step`` fact: model, tokens, credits, duration, the tools called, why it was final."""
    detail: dict[str, Any] = {
        "model": spec,
        "input_tokens": usage[0],
        "output_tokens": usage[1],
        "credits": round(cost, 6),
        "duration_ms": round(duration_s * 1000, 3),
    }
    if usage.cached or usage.written:
        detail["cached_input_tokens"] = usage.cached
        detail["cache_write_tokens"] = usage.written
    if isinstance(decision, ToolCalls):
        detail["calls"] = [c.name for c in decision.calls]
    if final is not None:
        detail["final"] = final
    if trace_id:
        detail["trace_id"] = trace_id
    return detail
