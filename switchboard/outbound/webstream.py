"""The per-session web stream: what the web chat page reads over SSE.

One Redis stream per session, each entry a ``type`` and a JSON ``data``. The user's message is appended by the ingest
script; everything a worker appends goes through :class:`WebStreamPublisher`, fenced by the drain's lease, so a worker
that lost its lease cannot write a stale reply. Entry ids are the SSE event ids, so a reconnecting page resumes
exactly where it stopped.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any, Final, NamedTuple

import redis.asyncio as aioredis

from switchboard.errors import FencedWriteError
from switchboard.outbound.outbox import append_once
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import CURRENT_LEASE
from switchboard.types import SessionKey

__all__ = [
    "EVENT_TYPES",
    "WEB_STREAM_MAXLEN",
    "WEB_STREAM_MAX_BYTES",
    "WebEvent",
    "WebStreamPublisher",
    "decode_entries",
    "parse_event_id",
    "read",
    "replay",
    "with_message_ids",
]

logger = logging.getLogger(__name__)

WEB_STREAM_MAXLEN: Final = 1000
"""Approximate number of entries each session's web stream retains."""
WEB_STREAM_MAX_BYTES: Final = 4096 * 1024
"""Default byte budget of each session's web stream (``SWITCHBOARD_LIMITS__WEB_HISTORY_KIB``)."""
EVENT_TYPES: Final = frozenset({"user", "status", "delta", "message", "reply_error", "tool", "choices_settled"})
"""Every ``type`` a web stream entry may have (a failed reply is ``reply_error``: a browser's ``EventSource`` also
fires ``error`` for its own connection failures)."""
_LEGACY_TYPES: Final = {"error": "reply_error"}
"""Entry types written by earlier versions, read under their current name."""
_MAX_TRACKED_DELTAS: Final = 10_000
"""Delta ids remembered per reply for compaction; a reply longer than this keeps its oldest deltas."""
_ID = re.compile(r"^([0-9]{1,20})(?:-([0-9]{1,20}))?$")
_ID_PART_MAX: Final = 2**64 - 1
_LAST_ID: Final = f"{_ID_PART_MAX}-{_ID_PART_MAX}"


class WebEvent(NamedTuple):
    """One web stream entry."""

    id: str
    """Stream entry id (``<ms>-<seq>``): the SSE event id."""
    type: str
    data: dict[str, Any]


def parse_event_id(value: str) -> str | None:
    """Validate a client-sent ``Last-Event-ID``; ``"0"`` means from the beginning (``None``).

    Only what Redis itself accepts as a stream id passes: ASCII digits only (not every Unicode digit: ``１２３`` is
    refused), one or two parts, each within an unsigned 64-bit integer.

    Raises:
        ValueError: not a stream entry id.
    """
    value = value.strip(" \t")
    match = _ID.match(value)
    if not match or any(int(part) > _ID_PART_MAX for part in match.groups() if part is not None):
        raise ValueError("Last-Event-ID must be a stream entry id like 1700000000000-0, or 0")
    if value == _LAST_ID:  # no entry can follow it: not an id this server ever sent
        raise ValueError("Last-Event-ID is the largest possible stream id: nothing can follow it")
    return None if value in ("0", "0-0") else value


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def decode_entries(entries: Iterable[Any] | None) -> list[WebEvent]:
    """Decode raw ``XRANGE``/``XREAD`` entries (``[id, {field: value}]``); entries without a JSON object are skipped."""
    events: list[WebEvent] = []
    for raw_id, fields in entries or ():
        values = {_text(k): _text(v) for k, v in (fields or {}).items()}
        try:
            data = json.loads(values.get("data", "{}"))
        except ValueError:
            data = None
        if not isinstance(data, dict):
            logger.warning("web stream entry %s has no JSON object in data; skipped", _text(raw_id))
            continue
        kind = values.get("type", "")
        events.append(WebEvent(_text(raw_id), _LEGACY_TYPES.get(kind, kind), data))
    return events


async def with_message_ids(redis: aioredis.Redis, session: SessionKey, events: list[WebEvent]) -> list[WebEvent]:
    """Fill in ``message_id`` on ``user`` events from the session's dedup records.

    The ingest script writes the user's echo before the gateway id exists outside it, so the echo carries the
    message's dedup key (``client_id``) and the dedup record, which maps that key to the id, supplies the rest.
    """
    missing = [e for e in events if e.type == "user" and "message_id" not in e.data and e.data.get("client_id")]
    if not missing:
        return events
    keys = SessionKeys(session)
    found = await redis.mget([keys.dedup(str(e.data["client_id"])) for e in missing])
    for event, value in zip(missing, found, strict=True):
        if value is not None:
            event.data["message_id"] = _text(value).partition(":")[0]  # 'id' or 'id:text fingerprint'
    return events


async def replay(redis: aioredis.Redis, session: SessionKey, after: str | None, *, count: int = 500) -> list[WebEvent]:
    """Retained entries strictly after ``after``, oldest first, at most ``count`` of them.

    ``after=None`` starts at the oldest retained entry. An ``after`` that was already trimmed also starts at the
    oldest retained entry: trimming removes the oldest entries, so every retained one is newer than it.
    """
    if after == _LAST_ID:
        return []  # nothing can follow it (and Redis refuses an exclusive range starting there)
    start = "-" if after is None else f"({after}"
    entries = await redis.xrange(SessionKeys(session).web, min=start, max="+", count=count)
    return await with_message_ids(redis, session, decode_entries(entries))


async def read(
    redis: aioredis.Redis, session: SessionKey, after: str | None, block_ms: int, *, count: int = 500
) -> list[WebEvent]:
    """Entries strictly after ``after`` (``None``: from the beginning), waiting up to ``block_ms`` for the first.

    Returns an empty list when nothing arrived in time. ``block_ms`` must stay below the Redis client's socket
    timeout.
    """
    key = SessionKeys(session).web
    reply = await redis.xread({key: after or "0-0"}, count=count, block=block_ms)
    if not reply:
        return []
    # RESP2 answers [[key, entries]], RESP3 {key: [entries]}.
    streams: Sequence[Any] = list(reply.items()) if isinstance(reply, dict) else reply
    found: list[WebEvent] = []
    for _key, entries in streams:
        if isinstance(entries, list) and entries and isinstance(entries[0], list) and len(entries[0]) == 1:
            entries = entries[0]  # RESP3 nests one more list level in some client versions
        found.extend(decode_entries(entries))
    return await with_message_ids(redis, session, found)


class WebStreamPublisher:
    """Appends worker-side events (status, delta, message, reply_error) to sessions' web streams, fenced by the lease.

    The drain sets :data:`~switchboard.queue.lease.CURRENT_LEASE` while it runs a turn and delivers its actions;
    :meth:`publish` refuses to write without it, or for a session that lease does not cover.

    When a reply's final ``message`` is written, the ``delta`` entries that streamed it are deleted: they are
    superseded, and a capped stream of deltas would otherwise push the conversation out of the replayed history.
    A page that is live has already seen them; a page that reconnects gets the final message instead.
    """

    def __init__(
        self, redis: aioredis.Redis, maxlen: int = WEB_STREAM_MAXLEN, *, max_bytes: int = WEB_STREAM_MAX_BYTES
    ) -> None:
        """Create a publisher over a Redis client owned by the caller.

        Each session's stream keeps about ``maxlen`` entries and at most ``max_bytes`` (the oldest go first).
        """
        self._redis = redis
        self._maxlen = maxlen
        self._max_bytes = max_bytes
        self._deltas: dict[tuple[SessionKey, str], list[str]] = {}

    async def publish(self, session: SessionKey, type: str, data: dict[str, Any]) -> str:
        """Append one event; returns its stream entry id.

        Raises:
            ValueError: ``type`` is not a web stream event type.
            FencedWriteError: no lease is held for ``session`` in this context, or it has passed to another epoch.
        """
        if type not in EVENT_TYPES:
            raise ValueError(f"unknown web stream event type {type!r}")
        lease = CURRENT_LEASE.get()
        if lease is None or lease.session != session:
            raise FencedWriteError(
                "web stream writes need the session lease (CURRENT_LEASE is not set for this session)",
                session_key=session,
                epoch=lease.epoch if lease is not None else 0,
            )
        fields = {"type": type, "data": json.dumps(data, ensure_ascii=False, separators=(",", ":"))}
        # a reply (an outbox send) is appended and recorded as sent in one step: a kill cannot duplicate it
        entry_id = await append_once(
            self._redis, lease, SessionKeys(session).web, fields, self._maxlen, self._max_bytes
        )
        reply_to = data.get("reply_to")
        if type == "delta" and isinstance(reply_to, str):
            ids = self._deltas.setdefault((session, reply_to), [])
            if len(ids) < _MAX_TRACKED_DELTAS:
                ids.append(entry_id)
        elif type == "message" and isinstance(reply_to, str):
            await self._compact(session, self._deltas.pop((session, reply_to), []))
        elif type == "reply_error" and isinstance(reply_to, str):
            # Keep the partial reply visible on replay; a retry streams anew.
            self._deltas.pop((session, reply_to), None)
        elif type == "status" and data.get("status") == "idle":
            for key in [k for k in self._deltas if k[0] == session]:
                del self._deltas[key]
        return entry_id

    async def _compact(self, session: SessionKey, ids: list[str]) -> None:
        if not ids:
            return
        try:
            await self._redis.xdel(SessionKeys(session).web, *ids)
        except Exception as exc:  # compaction is housekeeping: never fail a delivered reply over it
            logger.warning("could not compact %d web stream deltas: %s", len(ids), type(exc).__name__)
