"""Read-only views of sessions for ``switchboard sessions list|show`` and the console."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from switchboard.queue.eventlog import read_events
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.types import SessionKey

__all__ = ["SessionSummary", "list_sessions", "timeline"]

_GLOBAL = GlobalKeys()


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """One line of ``switchboard sessions list``."""

    key: SessionKey
    channel: str
    last_activity: float
    """Unix time of the last message accepted or turn finished."""
    inbox_depth: int
    """Messages waiting (including the one running)."""
    status: str
    """``running`` (a worker holds the lease), ``queued`` (messages wait) or ``idle``."""
    received: int
    """Messages accepted over the session's life."""
    dead_letters: int


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


async def list_sessions(redis: aioredis.Redis, limit: int = 50) -> list[SessionSummary]:
    """The ``limit`` most recently active sessions, newest first (two round trips)."""
    rows: Any = await redis.zrevrange(_GLOBAL.sessions, 0, max(limit, 1) - 1, withscores=True)
    if not rows:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for member, _score in rows:
            keys = SessionKeys(SessionKey(_text(member)))
            pipe.hmget(keys.meta, ["channel", "last_at", "received"])
            pipe.llen(keys.inbox)
            pipe.exists(keys.lease)
            pipe.llen(keys.dead)
        values = await pipe.execute()
    out: list[SessionSummary] = []
    for i, (member, score) in enumerate(rows):
        meta, depth, leased, dead = values[4 * i : 4 * i + 4]
        channel, last_at, received = (_text(v) if v is not None else "" for v in meta)
        status = "running" if leased else ("queued" if depth else "idle")
        out.append(
            SessionSummary(
                key=SessionKey(_text(member)),
                channel=channel,
                last_activity=float(last_at or score) / 1000,
                inbox_depth=int(depth),
                status=status,
                received=int(received or 0),
                dead_letters=int(dead),
            )
        )
    return out


async def timeline(redis: aioredis.Redis, session: SessionKey, count: int = 200) -> list[dict[str, Any]]:
    """The session's most recent ``count`` event-log entries, oldest first.

    Each entry is the event's own fields (``kind``, ``at``, ``message_id``, ...) plus ``id`` (the stream entry
    id) and ``ts`` (when it was appended, Unix seconds).
    """
    return await read_events(redis, session, count)
