"""The session event log: a capped Redis stream of facts, one entry per state transition.

Each entry has two fields: ``kind`` (the event's discriminator) and ``data`` (the event as JSON, see
:mod:`switchboard.core.events`). The ingest script writes ``message_received`` and ``run_queued``; the
drain writes the rest through fenced scripts, so a worker that lost its lease cannot add facts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import redis.asyncio as aioredis

from switchboard.core.events import Event, EventAdapter
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import LeaseToken, fenced_xadd
from switchboard.types import SessionKey

__all__ = ["EventLog", "decode_entries", "encode_event", "read_events"]


def encode_event(event: Event) -> str:
    """The JSON of one event, as stored in the ``data`` field."""
    return EventAdapter.dump_json(event).decode()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def decode_entries(entries: Iterable[tuple[Any, Mapping[Any, Any]]]) -> list[dict[str, Any]]:
    """Stream entries → dicts with ``id``, ``ts`` (entry time, Unix seconds), ``kind`` and the event's fields."""
    out: list[dict[str, Any]] = []
    for raw_id, fields in entries:
        entry_id = _text(raw_id)
        values = {_text(k): _text(v) for k, v in fields.items()}
        try:
            data = json.loads(values.get("data", "{}"))
        except ValueError:
            data = {"raw": values.get("data", "")}
        if not isinstance(data, dict):
            data = {"value": data}
        item: dict[str, Any] = {"id": entry_id, "ts": int(entry_id.split("-", 1)[0]) / 1000}
        item.update(data)
        item["kind"] = values.get("kind", data.get("kind", ""))
        out.append(item)
    return out


async def read_events(redis: aioredis.Redis, session: SessionKey, count: int = 200) -> list[dict[str, Any]]:
    """The most recent ``count`` entries of the session's event log, oldest first."""
    entries: Any = await redis.xrevrange(SessionKeys(session).events, count=count)
    return decode_entries(reversed(entries or []))


class EventLog:
    """Fenced appends to one session's event log."""

    def __init__(self, redis: aioredis.Redis, lease: LeaseToken, *, maxlen: int) -> None:
        self.redis = redis
        self.lease = lease
        self.maxlen = maxlen

    async def append(self, event: Event) -> str:
        """Append one fact; raises :class:`~switchboard.errors.FencedWriteError` once the lease is lost."""
        fields = {"kind": event.kind, "data": encode_event(event)}
        return await fenced_xadd(self.redis, self.lease, SessionKeys(self.lease.session).events, fields, self.maxlen)
