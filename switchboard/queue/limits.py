"""Abuse limits kept in Redis, so every web process shares them (``SWITCHBOARD_LIMITS__*``).

Each limit is a GCRA meter (``lua/_limits.lua``) read and advanced inside the script that does the work, so a limit
costs no extra round trip: message limits in the ingest script, sessions per address in :func:`count_session`,
stream tickets in :func:`issue_stream_ticket`. A refused request writes nothing. The exception is the per-sender
message limit: a sender writes into several sessions, so its meter lives in no session's cluster slot and is taken
by ``sender_meter.lua`` in a round trip of its own before ingest (only when the limit is on; see
:class:`~switchboard.queue.ingest.Ingestor`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import secrets
from typing import Final

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard.errors import QueueUnavailableError
from switchboard.queue import scripts
from switchboard.queue.keys import GlobalKeys, SessionKeys, ShardKeys
from switchboard.queue.shards import SHARDS, shard_of
from switchboard.settings import LimitsSettings
from switchboard.types import SessionKey

__all__ = [
    "HOUR_MS",
    "address_bucket",
    "count_session",
    "issue_stream_ticket",
    "new_stream_ticket",
    "retry_after_s",
    "stream_ticket_key",
]

HOUR_MS: Final = 3_600_000
_GLOBAL: Final = GlobalKeys()
_STREAM_TICKET: Final = scripts.Script("stream_ticket", preludes=[scripts.LIMITS_PRELUDE])


def retry_after_s(wait_ms: int) -> int:
    """A ``Retry-After`` value: the wait in whole seconds, rounded up (at least 1)."""
    return max(1, math.ceil(wait_ms / 1000))


def address_bucket(address: str) -> str:
    """What a client address is counted as: itself for IPv4, its /64 for IPv6 (one host often holds a whole /64)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


async def count_session(redis: aioredis.Redis, address: str, limits: LimitsSettings, *, timeout_s: float) -> int:
    """Count one new web chat session for ``address``: 0 when allowed (and counted), else the wait in ms.

    Refused: nothing is written. ``sessions_per_address_per_hour = 0`` allows everything without a round trip.

    Raises:
        QueueUnavailableError: Redis did not answer within ``timeout_s``.
    """
    limit = limits.sessions_per_address_per_hour
    if limit <= 0:
        return 0
    try:
        async with asyncio.timeout(timeout_s):
            wait = await scripts.SESSION_QUOTA(redis, [_GLOBAL.address_rate(address_bucket(address))], [limit, HOUR_MS])
    except (TimeoutError, RedisError, OSError) as err:
        raise QueueUnavailableError(f"the session limit could not be checked: {type(err).__name__}") from err
    return int(wait)


def new_stream_ticket(session: SessionKey) -> str:
    """A fresh stream ticket for ``session``: ``<shard>.<random>``, 256 random bits after its session's shard.

    The shard (:func:`~switchboard.queue.shards.shard_of`) tells where the ticket is kept (:meth:`ShardKeys.web_ticket`,
    beside the session's ticket meter) without a lookup; it is no secret (anyone may compute a session's shard), the
    random part is what makes a ticket unguessable.
    """
    return f"{shard_of(session)}.{secrets.token_urlsafe(32)}"


def stream_ticket_key(ticket: str, ticket_hash: str) -> str | None:
    """The key a ticket is kept under (``ticket_hash`` is its hash), or ``None`` when it names no shard.

    A ticket whose shard part was changed is refused like an unknown one: its hash covers the whole ticket, so no
    shard holds it (and one naming no shard, or not a number, is never looked up).
    """
    shard, dot, _ = ticket.partition(".")
    if not dot or not (0 < len(shard) <= 4 and shard.isascii() and shard.isdecimal()) or int(shard) >= SHARDS:
        return None
    return ShardKeys.every()[int(shard)].web_ticket(ticket_hash)


async def issue_stream_ticket(
    redis: aioredis.Redis, session: SessionKey, ticket_hash: str, token_hash: str, *, ttl_s: int, per_ttl: int
) -> int:
    """Store a stream ticket for ``session`` unless it asked for too many: 0 when stored, else the wait in ms.

    ``ticket_hash`` is the hash of a ticket from :func:`new_stream_ticket` for ``session``: it is kept in the session's
    shard, so the ticket and the session's ticket meter are one script in one slot.

    At most ``per_ttl`` tickets in any ``ttl_s`` (a burst of ``per_ttl`` included; ``0`` = no limit), so a session
    holds at most about twice that many unused tickets. One round trip, as storing the ticket alone took.

    Raises:
        RedisError: Redis failed (``TimeoutError`` / ``OSError`` likewise).
    """
    keys = SessionKeys(session)
    ticket_key = keys.shard.web_ticket(ticket_hash)
    return int(await _STREAM_TICKET(redis, [keys.ticket_rate, ticket_key], [per_ttl, ttl_s * 1000, token_hash, ttl_s]))
