"""Caps on open web chat streams per session and per client address, counted in Redis across web processes.

A stream's slot is taken in two steps, each one set in one slot (a cluster keeps the address's and the session's sets
apart): the address's set, then the session's; when the session's cap refuses, the address's entry is taken back.
Neither cap is ever exceeded (each step checks and adds atomically); the cost of the two steps is a window of one
round trip in which a stream refused by its session's cap still holds an address entry, so another stream of the
same address opening just then may be refused when the address is at its cap (a false refusal, never a false
admission). A process dying between the steps leaves an entry nothing refreshes: it expires within the slot TTL.

An address is counted as the session quota counts it (IPv6 per /64), so rotating addresses within one /64 gains
nothing. Each open stream holds a slot with an expiry on the server's clock, pushed back while the stream lives, so
a process that dies leaves slots that expire and a crash never leaves a count stuck.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass
from typing import Final, Literal

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard.queue.keys import GlobalKeys
from switchboard.queue.limits import address_bucket
from switchboard.queue.scripts import Script, ScriptArg

__all__ = ["SLOT_TTL_MS", "Slot", "StreamSlots"]

logger = logging.getLogger(__name__)

SLOT_TTL_MS: Final = 60_000
"""A slot whose process stopped refreshing it is gone this long after its last refresh."""
_ACQUIRE: Final = Script("stream_slot_acquire")
_REFRESH: Final = Script("stream_slot_refresh")
_REFRESH_BATCH: Final = 500


@dataclass(frozen=True, slots=True)
class Slot:
    """One open stream's place in the counts (thousands are held at once: the keys are derived, not stored)."""

    id: str
    session: str
    address: str
    """The address's bucket (:func:`~switchboard.queue.limits.address_bucket`), what the cap counts."""

    @property
    def session_key(self) -> str:
        """The session's ZSET of open streams."""
        return GlobalKeys().web_streams_by_session(self.session)

    @property
    def address_key(self) -> str:
        """The address's ZSET of open streams."""
        return GlobalKeys().web_streams_by_address(self.address)


class StreamSlots:
    """Takes, refreshes and frees stream slots on ``redis`` (the streams' own pool)."""

    def __init__(self, redis: aioredis.Redis, *, ttl_ms: int = SLOT_TTL_MS) -> None:
        """Track slots on ``redis``; :meth:`start` begins refreshing them."""
        self.redis = redis
        self.ttl_ms = ttl_ms
        self._held: dict[str, Slot] = {}
        self._task: asyncio.Task[None] | None = None
        self._cleanup: set[asyncio.Future[None]] = set()

    def start(self) -> None:
        """Start refreshing held slots (call from the running loop)."""
        self._task = asyncio.create_task(self._refresh_forever())

    async def aclose(self) -> None:
        """Stop refreshing (held slots then expire by themselves)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def acquire(
        self, session: str, address: str, *, per_session: int, per_address: int
    ) -> Slot | Literal["session", "address"]:
        """Take a slot, or name the cap that refuses one (``0`` = no limit; with both ``0`` nothing is counted).

        ``address`` is the client's address as seen (IPv6 is counted per /64).

        Raises:
            RedisError: Redis failed (nothing was counted that a refresh would keep alive).
        """
        slot = Slot(secrets.token_hex(8), session, address_bucket(address))
        if per_session <= 0 and per_address <= 0:
            return slot
        # Two steps, each one set in one slot (on a cluster the address's and the session's sets live apart): the
        # address's, then the session's; a refusal by the second takes the first back.
        steps = [
            (key, cap) for key, cap in ((slot.address_key, per_address), (slot.session_key, per_session)) if cap > 0
        ]
        self._held[slot.id] = slot  # from the first step on: a failure part way frees what was taken (release)
        try:
            for key, cap in steps:
                if int(await _ACQUIRE(self.redis, [key], [slot.id, self.ttl_ms, cap])):
                    await self.release(slot)
                    return "session" if key == slot.session_key else "address"
        except BaseException:
            # A step may have run even though its answer never came (a deadline, a lost connection): take the slot
            # back, or it would count against the caps until it expires.
            self._cleanup.add(task := asyncio.ensure_future(self.release(slot)))
            task.add_done_callback(self._cleanup.discard)
            raise
        return slot

    async def release(self, slot: Slot) -> None:
        """Free a slot now (on failure it still expires within the TTL)."""
        if self._held.pop(slot.id, None) is None:
            return
        try:
            await asyncio.gather(self.redis.zrem(slot.session_key, slot.id), self.redis.zrem(slot.address_key, slot.id))
        except (RedisError, OSError, TimeoutError) as exc:
            logger.debug("stream slot not freed (%s); it expires by itself", type(exc).__name__)

    async def refresh(self) -> None:
        """Push back the expiry of every held slot (in batches).

        Raises:
            RedisError: Redis failed.
        """
        by_key: dict[str, list[str]] = {}
        for slot in list(self._held.values()):
            by_key.setdefault(slot.session_key, []).append(slot.id)
            by_key.setdefault(slot.address_key, []).append(slot.id)
        calls: list[tuple[list[str], list[ScriptArg]]] = []
        for key, ids in by_key.items():  # one call per set (a script touches one slot), in batches of ids
            calls += [([key], [self.ttl_ms, *ids[n : n + _REFRESH_BATCH]]) for n in range(0, len(ids), _REFRESH_BATCH)]
        for start in range(0, len(calls), _REFRESH_BATCH):  # one round trip per batch of calls
            await _REFRESH.many(self.redis, calls[start : start + _REFRESH_BATCH])

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_ms / 3000)
            try:
                await self.refresh()
            except (RedisError, OSError, TimeoutError) as exc:
                logger.warning("could not refresh open stream counts: %s", type(exc).__name__)
