"""A session's raw event log, for ``switchboard sessions show --events`` (states and transcripts: ``control``)."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from switchboard.queue.eventlog import read_events
from switchboard.types import SessionKey

__all__ = ["timeline"]


async def timeline(redis: aioredis.Redis, session: SessionKey, count: int = 200) -> list[dict[str, Any]]:
    """The session's most recent ``count`` event-log entries, oldest first.

    Each entry is the event's own fields (``kind``, ``at``, ``message_id``, ...) plus ``id`` (the stream entry
    id) and ``ts`` (when it was appended, Unix seconds).
    """
    return await read_events(redis, session, count)
