"""④ Actions still open in a conversation, which compaction must keep word for word or not run over.

An approval a person has not decided yet, a write whose outcome is in doubt (it timed out after it was sent, or its
start was recorded without a result) and a tool call with no result at all change what the agent may do next: a
summary that turns them into "write_file error" changes their meaning. :func:`pending_actions` finds them in the
history (or a turn's messages) from ids and recorded facts alone; :func:`lost_actions` checks, by call id and
arguments, that a request still carries each one, verbatim or as its :attr:`PendingAction.line`. When one is lost the
runtime stops the turn for review (``compaction_held``) instead of letting the model act on a summary.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from switchboard.core.model import ChatMessage, data_block
from switchboard.core.turn import HistoryEntry

__all__ = ["PENDING_HEADING", "PendingAction", "PendingKind", "held_reply", "lost_actions", "pending_actions",
           "render_pending"]  # fmt: skip

PendingKind = Literal["approval_waiting", "write_in_doubt", "unanswered_call"]
PENDING_HEADING = "## Pending actions (kept word for word, never summarised: not done, or not known to be done)"
_WAITING = re.compile(r'"status":\s*"waiting_for_approval"')
_APPROVAL_ID = re.compile(r'"approval_id":\s*"([A-Za-z0-9_-]+)"')
_DOUBT_CLASSES = frozenset({"ambiguous_timeout", "ambiguous"})
_ERROR_CLASS = re.compile(r'"error_class":\s*"([a-z_]+)"')
_APPROVAL_CALL = "approval_"
"""Prefix of the call id under which a decided approval's outcome comes back (``settled_messages``)."""
_NAMED = 10
"""Open actions a held reply names one by one."""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


@dataclass(frozen=True)
class PendingAction:
    """One open action: what it is, the call that made it and, for an approval, the approval's id."""

    kind: PendingKind
    call_id: str
    tool: str
    arguments: dict[str, Any]
    approval_id: str | None = None
    error_class: str | None = None
    """For a write in doubt: the failure that left it in doubt."""

    @property
    def line(self) -> str:
        """The action as one line of the pending block: its ids and its arguments as canonical JSON."""
        head = f"- {self.kind}: {self.tool} call_id={self.call_id}"
        if self.approval_id:
            head += f" approval_id={self.approval_id}"
        if self.error_class:
            head += f" error_class={self.error_class}"
        return f"{head} arguments={_canonical(self.arguments)}"

    def fact(self) -> dict[str, Any]:
        """What the event log keeps of it (ids and the tool, never the arguments)."""
        return {"kind": self.kind, "tool": self.tool, "call_id": self.call_id, "approval_id": self.approval_id}


@dataclass(frozen=True)
class _Item:
    role: str
    text: str
    calls: list[tuple[str, str, dict[str, Any]]]
    call_id: str | None
    trusted: bool
    """Not outside text: a status written in it was written by the gateway, not quoted from a tool's output."""
    meta: dict[str, Any]


def _item(found: HistoryEntry | ChatMessage) -> _Item:
    if isinstance(found, ChatMessage):
        calls = [(c.id, c.name, dict(c.arguments)) for c in found.tool_calls]
        return _Item(found.role, found.content, calls, found.tool_call_id, found.trust != "data", {})
    raw = found.meta.get("tool_calls") if found.role == "assistant" else None
    calls = []
    for call in raw if isinstance(raw, list) else []:
        if isinstance(call, dict) and call.get("id"):
            arguments = call.get("arguments")
            calls.append((str(call["id"]), str(call.get("name") or "tool"), arguments if isinstance(arguments, dict)
                          else {}))  # fmt: skip
    call_id = found.meta.get("call_id") or found.meta.get("tool_call_id")
    trusted = found.meta.get("trust") != "data"
    return _Item(found.role, found.text, calls, str(call_id) if call_id else None, trusted, dict(found.meta))


def _error_class(result: _Item) -> str | None:
    recorded = result.meta.get("error_class")
    if isinstance(recorded, str):
        return recorded
    if result.meta.get("ok") is True:
        return None
    found = _ERROR_CLASS.search(result.text) if result.trusted else None
    return found.group(1) if found else None


def pending_actions(conversation: Sequence[HistoryEntry | ChatMessage]) -> list[PendingAction]:
    """The actions still open at the end of ``conversation`` (history entries, messages, or both), oldest first.

    An approval counts as decided once its outcome came back (a call ``approval_<id>``); a write in doubt once the
    same call (tool and arguments) later succeeded.
    """
    calls: list[tuple[str, str, dict[str, Any], _Item | None]] = []
    waiting: dict[str, int] = {}  # call id → its call's index, until answered (ids may repeat in later turns)
    for item in (_item(found) for found in conversation):
        for call_id, name, arguments in item.calls:
            waiting[call_id] = len(calls)
            calls.append((call_id, name, arguments, None))
        if item.role == "tool" and item.call_id in waiting:
            index = waiting.pop(item.call_id)
            call_id, name, arguments, _ = calls[index]
            calls[index] = (call_id, name, arguments, item)
    decided = {call_id for call_id, *_ in calls if call_id.startswith(_APPROVAL_CALL)}
    done = {_canonical([name, arguments]) for _, name, arguments, result in calls
            if result is not None and result.meta.get("ok") is not False and _error_class(result) is None}  # fmt: skip
    found: list[PendingAction] = []
    for call_id, name, arguments, result in calls:
        if result is None:
            found.append(PendingAction("unanswered_call", call_id, name, arguments))
            continue
        if result.trusted and _WAITING.search(result.text):
            approval = _APPROVAL_ID.search(result.text)
            approval_id = approval.group(1) if approval else None
            if approval_id is None or f"{_APPROVAL_CALL}{approval_id}" not in decided:
                found.append(PendingAction("approval_waiting", call_id, name, arguments, approval_id=approval_id))
            continue
        error_class = _error_class(result)
        if error_class in _DOUBT_CLASSES and _canonical([name, arguments]) not in done:
            found.append(PendingAction("write_in_doubt", call_id, name, arguments, error_class=error_class))
    return found


def render_pending(actions: Sequence[PendingAction]) -> str:
    """The pending block of a prompt: the heading, then one :attr:`PendingAction.line` each ("" for none)."""
    return "\n".join([PENDING_HEADING, *(a.line for a in actions)]) if actions else ""


def _shown(line: str) -> str:
    """``line`` as it reads inside a data block (a ``<data`` tag in its arguments is escaped there)."""
    block = data_block(line, source="")
    return block[block.index("\n") + 1 : block.rindex("\n")]


def _verbatim(action: PendingAction, messages: Sequence[ChatMessage]) -> bool:
    called = any(
        c.id == action.call_id and c.name == action.tool and c.arguments == action.arguments
        for m in messages
        if m.role == "assistant"
        for c in m.tool_calls
    )
    answered = action.kind == "unanswered_call" or any(
        m.role == "tool" and m.tool_call_id == action.call_id for m in messages
    )
    return called and answered


def lost_actions(actions: Sequence[PendingAction], messages: Sequence[ChatMessage]) -> list[PendingAction]:
    """The ``actions`` a request over ``messages`` no longer carries: neither verbatim nor as their pending line."""
    text = "\n".join(m.content for m in messages)
    return [a for a in actions if not _verbatim(a, messages) and a.line not in text and _shown(a.line) not in text]


def held_reply(actions: Sequence[PendingAction]) -> str:
    """What the user is told when a turn stops rather than continue on a summary of ``actions``.

    The first :data:`_NAMED` are named, the rest counted: a flood of open actions makes a short reply still.
    """
    named = "; ".join(
        f"{a.tool} ({'approval ' + a.approval_id if a.approval_id else a.kind.replace('_', ' ')})"
        for a in actions[:_NAMED]
    )
    if len(actions) > _NAMED:
        named += f"; and {len(actions) - _NAMED} more"
    return (
        "I stopped before continuing: this conversation grew too long to keep these open actions word for word, and "
        f"I will not act on a summary of them: {named}. A person needs to review them first (an operator can check "
        "the conversation, or send /reset to start over)."
    )
