"""A session's transcript: its history (what was said, the tool calls and results) merged with its event log.

Built on demand, when an operator asks, from what the session stores anyway: the history entries
(:class:`~switchboard.core.turn.HistoryEntry`) carry the words, the tool calls (``meta.tool_calls``) and their results
(``meta.call_id``); the event log carries who sent what, the approvals, the operators' take-overs and the failures;
the inbox holds what was said and is not handled yet.
Every event lands in exactly one line (those that stand for no line of their own go with the line before them), so
each line opens to its facts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import redis.asyncio as aioredis

from switchboard.control.reading import timeline_of
from switchboard.control.views import TimelineEntry, TranscriptItem
from switchboard.core.inbound import history_text
from switchboard.core.messages import InboundMessage, OperatorActed
from switchboard.core.turn import HistoryEntry
from switchboard.queue.keys import SessionKeys
from switchboard.queue.store import load_history
from switchboard.types import SessionKey

__all__ = ["OPERATOR_PREFIX", "build_transcript", "redacted", "transcript_of"]

OPERATOR_PREFIX: Final = "console:"
"""The principal prefix of operators (the console and the CLI): their messages are operator lines, not the user's."""
_USER_KINDS: Final = frozenset({"message_received", "run_queued", "message_dropped"})
_ANSWER_KINDS: Final = frozenset({"reply_sent", "send_dead_lettered", "run_completed", "run_cancelled"})
_APPROVAL_KINDS: Final = frozenset({"approval_requested", "approval_decided", "approval_settled"})
_NOTICE_KINDS: Final = frozenset(
    {
        "run_failed",
        "run_dead_lettered",
        "run_deferred",
        "run_cancelled",
        "send_dead_lettered",
        "message_dropped",
        "compaction_held",
    }
)


@dataclass
class _Line:
    item: TranscriptItem
    events: list[TimelineEntry] = field(default_factory=list)
    result: HistoryEntry | None = None


def _mid(event: TimelineEntry) -> str:
    value = event.data.get("message_id")
    return value if isinstance(value, str) else ""


def _order(event: TimelineEntry) -> tuple[int, ...]:
    """A stream entry id (``<ms>-<seq>``) as numbers, in the stream's order."""
    return tuple(int(part) for part in event.id.split("-") if part.isdigit())


def _approval_text(events: Sequence[TimelineEntry]) -> tuple[str, str]:
    """What became of one approval, in words, and its last status."""
    tool, words, status = "reply", [], "requested"
    for event in events:
        data = event.data
        if event.kind == "approval_requested":
            tool = str(data.get("tool") or "reply")
            rule = f" (rule {data['rule']})" if data.get("rule") else ""
            words.append(f"approval asked for {tool}{rule}")
        elif event.kind == "approval_decided":
            verdict = {"approve": "approved", "deny": "denied", "expire": "expired"}.get(str(data.get("verdict")), "")
            status = verdict or status
            words.append(f"{verdict} by {data.get('actor', '?')} via {data.get('via', '?')} ({data.get('result', '')})")
        else:
            status = str(data.get("status", status))
            reason = f": {data['reason']}" if data.get("reason") else ""
            words.append(f"{status}{reason}")
    return "; ".join(words), status


def _notice_text(event: TimelineEntry) -> str:
    data = event.data
    detail = data.get("error") or data.get("reason") or ""
    return f"{event.kind.replace('_', ' ')}{f': {detail}' if detail else ''}"


def build_transcript(
    history: Sequence[HistoryEntry], events: Sequence[TimelineEntry], waiting: Sequence[InboundMessage] = ()
) -> list[TranscriptItem]:
    """The transcript of ``history`` (oldest first) and ``events`` (the event log, oldest first), in time order.

    ``waiting`` are the session's messages not handled yet (its inbox): they are not in the history, and show as
    lines with the action ``queued``.
    """
    by_message: dict[str, list[TimelineEntry]] = defaultdict(list)
    senders: dict[str, str] = {}
    received: dict[str, TimelineEntry] = {}
    for event in events:
        mid = _mid(event)
        if mid:
            by_message[mid].append(event)
        if event.kind == "message_received" and mid:
            senders[mid] = str(event.data.get("sender", ""))
            received[mid] = event
    claimed: set[str] = set()
    calls = {str(e.data["call_id"]): e for e in events if e.kind == "tool_called" and e.data.get("call_id")}
    lines: list[_Line] = []
    tools: dict[str, _Line] = {}

    def take(candidates: Sequence[TimelineEntry], kinds: frozenset[str]) -> list[TimelineEntry]:
        found = [e for e in candidates if e.kind in kinds and e.id not in claimed]
        claimed.update(e.id for e in found)
        return found

    for entry in history:
        untrusted = entry.untrusted
        mid = entry.message_id or ""
        if entry.role == "user":
            actor = senders.get(mid) or "user"
            item = TranscriptItem(kind="user", at=entry.at, actor=actor, text=entry.text, untrusted=untrusted)
            lines.append(_Line(item, take(by_message.get(mid, []), _USER_KINDS)))
        elif entry.role == "tool":
            call_id = str(entry.meta.get("call_id", ""))
            line = tools.get(call_id)
            if line is None:  # its call fell off the front of the history
                tool = str(entry.meta.get("tool", "")) or None
                line = _Line(TranscriptItem(kind="tool_call", at=entry.at, actor="agent", tool=tool))
                lines.append(line)
            line.result = entry
        elif entry.meta.get("tool_calls"):
            if entry.text.strip():
                lines.append(_Line(TranscriptItem(kind="agent", at=entry.at, actor="agent", text=entry.text)))
            for call in entry.meta["tool_calls"]:
                call_id = str(call.get("id", ""))
                item = TranscriptItem(
                    kind="tool_call",
                    at=entry.at,
                    actor="agent",
                    tool=str(call.get("name", "")),
                    arguments=call.get("arguments"),
                    untrusted=untrusted,
                )
                fact = calls.get(call_id)
                line = _Line(item, take([fact], frozenset({"tool_called"})) if fact is not None else [])
                tools[call_id] = line
                lines.append(line)
        else:
            sender = senders.get(mid, "")
            related = by_message.get(mid, [])
            control = [e for e in related if e.kind == "control_changed"]
            spoke = received.get(mid) is not None and int(received[mid].data.get("chars") or 0) > 0
            if sender.startswith(OPERATOR_PREFIX) and (control or spoke):
                action = str(control[0].data.get("action")) if control else "say"
                item = TranscriptItem(kind="operator", at=entry.at, actor=sender, action=action, text=entry.text)
                kinds = _USER_KINDS | _ANSWER_KINDS | {"control_changed"}
                lines.append(_Line(item, take(related, kinds)))
            else:
                item = TranscriptItem(kind="agent", at=entry.at, actor="agent", text=entry.text, untrusted=untrusted)
                lines.append(_Line(item, take(related, _ANSWER_KINDS)))

    for message in waiting:
        fact = received.get(message.id)
        if fact is None or fact.id in claimed:
            continue
        operator = message.event if isinstance(message.event, OperatorActed) else None
        if operator is not None:
            item = TranscriptItem(
                kind="operator", at=message.received_at, actor=operator.operator, action=operator.action,
                text=message.text,
            )  # fmt: skip
        else:
            item = TranscriptItem(
                kind="user", at=message.received_at, actor=message.sender.id, action="queued",
                text=history_text(message),
            )  # fmt: skip
        lines.append(_Line(item, take(by_message.get(message.id, []), _USER_KINDS)))

    approvals: dict[str, list[TimelineEntry]] = defaultdict(list)
    for event in events:
        if event.kind in _APPROVAL_KINDS and event.id not in claimed and event.data.get("approval_id"):
            approvals[str(event.data["approval_id"])].append(event)
    for group in approvals.values():
        text, status = _approval_text(group)
        tool = next((str(e.data.get("tool") or "") for e in group if e.kind == "approval_requested"), "") or None
        lines.append(_Line(TranscriptItem(kind="approval", at=group[0].at, tool=tool, action=status, text=text)))
        lines[-1].events = take(group, _APPROVAL_KINDS)
    for event in events:
        if event.id in claimed:
            continue
        if event.kind == "control_changed":  # its answer fell off the front of the history
            actor = str(event.data.get("operator", ""))
            action = str(event.data.get("action", ""))
            item = TranscriptItem(kind="operator", at=event.at, actor=actor, action=action, text="")
        elif event.kind in _NOTICE_KINDS:
            item = TranscriptItem(kind="notice", at=event.at, action=event.kind, text=_notice_text(event))
        else:
            continue
        claimed.add(event.id)
        lines.append(_Line(item, [event]))

    lines.sort(key=lambda line: line.item.at or 0.0)  # stable: the history's own order holds within one instant
    owners = {_mid(e): line for line in lines for e in line.events if e.kind == "message_received"}
    rest = [e for e in events if e.id not in claimed]
    for event in rest:  # runs, steps, usage ...: with their message's line, else the line they followed
        at = event.at or 0.0
        home = owners.get(_mid(event)) or next(
            (line for line in reversed(lines) if (line.item.at or 0.0) <= at), lines[0] if lines else None
        )
        if home is not None:
            home.events.append(event)
    out = []
    for line in lines:
        extra: dict[str, Any] = {"events": sorted(line.events, key=_order)}
        if line.result is not None:
            called = line.events[0].data if line.events and line.events[0].kind == "tool_called" else {}
            ok = called.get("ok")
            extra.update(
                result=line.result.text,
                ok=ok if isinstance(ok, bool) else None,
                untrusted=line.item.untrusted or line.result.untrusted,
            )
        out.append(replace(line.item, **extra))
    return out


def redacted(item: TranscriptItem) -> TranscriptItem:
    """``item`` without the words, arguments and results (for an operator whose role may not read messages)."""
    if item.kind in ("approval", "notice") or (item.kind == "operator" and item.action != "say"):
        return item
    return replace(item, text="", arguments=None, result=None, redacted=True)


async def transcript_of(
    redis: aioredis.Redis, session: SessionKey, *, history_limit: int, events_limit: int
) -> list[TranscriptItem]:
    """The session's transcript from its last ``history_limit`` history entries and ``events_limit`` events."""
    history = await load_history(redis, session, history_limit)
    events = await timeline_of(redis, session, events_limit)
    keys = SessionKeys(session)
    ids = await redis.lrange(keys.inbox, 0, history_limit - 1)
    stored = await redis.hmget(keys.messages, ids) if ids else []
    waiting = [InboundMessage.model_validate_json(raw) for raw in stored if raw]
    return build_transcript(history, events, waiting)
