"""One Redis reader per web process for every open web chat stream, fanned out to in-process subscribers.

A stream never holds a Redis connection of its own: :class:`StreamFanout` keeps one ``XREAD BLOCK`` reader over every
subscribed session and one multiplexed connection for the rest, apart from the web tier's main client. A subscriber
that falls too far behind is closed (its client reconnects with ``Last-Event-ID`` and loses nothing), so a slow reader
never costs unbounded memory.

On a Redis Cluster one ``XREAD`` names streams of one slot only, so the reader polls instead of blocking: every
:data:`POLL_S`, one non-blocking ``XREAD`` per slot with a followed session, in one pipeline per node (the streams'
client is redis-py's cluster client, :func:`~switchboard.queue.muxredis.multiplexed_like`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any, Final

import redis.asyncio as aioredis
from redis.crc import key_slot
from redis.exceptions import RedisClusterException, RedisError

from switchboard.outbound.webstream import WebEvent, decode_entries, with_message_ids
from switchboard.queue.connection import AsyncClient, as_redis
from switchboard.queue.keys import SessionKeys
from switchboard.queue.muxredis import multiplexed_like
from switchboard.types import SessionKey

__all__ = ["POOL_SIZE", "StreamFanout", "Subscription", "SubscriptionClosedError"]

logger = logging.getLogger(__name__)

POOL_SIZE: Final = 2
"""Connections the streams' client may hold (replay, tickets, caps: one multiplexed connection, one spare while it
is replaced); the reader has one more of its own."""
BLOCK_MS: Final = 10_000
"""How long one multiplexed ``XREAD`` blocks when nothing happens."""
READ_COUNT: Final = 500
"""Entries one ``XREAD`` takes per session stream."""
QUEUE_LIMIT: Final = 256
"""Batches a subscription may hold unread before it is closed as too slow."""
SWEEP_S: Final = 1.0
"""How often subscriptions are checked for a client that went away (its slot is freed within about this long)."""
_COALESCE_S: Final = 0.005
_COALESCE_PER_KEY_S: Final = 0.00002
"""Each re-issued ``XREAD`` names every followed session: with many, additions wait longer to be batched (20 ms per
1,000 sessions, so a burst of new streams costs the reader and Redis a bounded number of re-issues)."""
_COALESCE_MAX_S: Final = 0.1
POLL_S: Final = 0.05
"""On a Redis Cluster: how long the reader waits between two polls that found nothing (or until a new session)."""
_UNBLOCK_TRIES: Final = 50


class SubscriptionClosedError(Exception):
    """The subscription was closed: the fan-out stopped, the client went away, or it fell too far behind."""


class Subscription:
    """What one open stream receives: batches of events of its session, in stream order.

    Thousands are open at once, so it holds only a list and, while its stream waits, one future.
    """

    __slots__ = ("_batches", "_waiter", "closing", "limit", "reason", "session", "tag")

    def __init__(
        self, session: SessionKey, limit: int, closing: Callable[[], bool] | None, tag: str | None = None
    ) -> None:
        self.session = session
        self.tag = tag
        """What the caller groups subscriptions by (the web chat: the hash of the token that opened the stream)."""
        self.limit = limit
        self.closing = closing
        """Checked by the fan-out's sweep; ``True`` closes the subscription (the client went away)."""
        self.reason: str | None = None
        """Why it was closed (``None`` while open)."""
        self._batches: list[list[WebEvent]] = []
        self._waiter: asyncio.Future[None] | None = None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self.reason is not None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def deliver(self, batch: list[WebEvent]) -> None:
        """Queue a batch; a subscription already holding ``limit`` batches is closed instead."""
        if self.reason is not None:
            return
        if len(self._batches) >= self.limit:
            self.close("overflow")
            return
        self._batches.append(batch)
        self._wake()

    def close(self, reason: str) -> None:
        """Close it: :meth:`next` raises once the batches already queued are taken."""
        if self.reason is None:
            self.reason = reason
        self._wake()

    async def next(self, timeout_s: float) -> list[WebEvent]:
        """The next batch, or ``[]`` when none came within ``timeout_s``.

        Raises:
            SubscriptionClosedError: closed, and nothing is left to take.
        """
        if not self._batches and self.reason is None and timeout_s > 0:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout_s, _settle, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        if self._batches:
            return self._batches.pop(0)
        if self.reason is not None:
            raise SubscriptionClosedError(self.reason)
        return []


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _streams(reply: Any) -> Sequence[Any]:
    """``[(key, entries)]`` from an ``XREAD`` answer (RESP2 ``[[key, entries]]``, RESP3 ``{key: entries}``)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return list(reply.items())
    return list(reply)


class StreamFanout:
    """The process's one multiplexed reader of web streams, its subscribers, and the streams' small Redis pool."""

    def __init__(
        self,
        template: AsyncClient,
        *,
        pool_size: int = POOL_SIZE,
        block_ms: int = BLOCK_MS,
        queue_limit: int = QUEUE_LIMIT,
        sweep_s: float = SWEEP_S,
    ) -> None:
        """Create clients to the server of ``template`` with its options (nothing connects before first use).

        ``template`` is the web tier's main client; none of its connections is ever taken.
        """
        self.block_ms = block_ms
        self.queue_limit = queue_limit
        self.sweep_s = sweep_s
        self._reader: aioredis.Redis | None = None
        """The blocking reader's own connection (none on a cluster: the reader polls through :attr:`redis`)."""
        if not isinstance(template, aioredis.RedisCluster):
            pool = template.connection_pool
            reader_options = {**pool.connection_kwargs, "socket_timeout": block_ms / 1000 + 5.0}
            self._reader = aioredis.Redis(
                connection_pool=aioredis.ConnectionPool(
                    connection_class=pool.connection_class, max_connections=1, **reader_options
                )
            )
        self.redis: aioredis.Redis = as_redis(multiplexed_like(template, max_connections=pool_size))
        """The streams' client for replay, tickets and caps: every command pipelined on one connection (a few pooled
        ones where that is not possible; redis-py's cluster client on a cluster). Never the web tier's main client."""
        self._subs: dict[SessionKey, set[Subscription]] = {}
        self._cursors: dict[str, str] = {}
        """Web stream key → the last entry id the reader has taken from it."""
        self._sessions: dict[str, SessionKey] = {}
        self._changed = asyncio.Event()
        self._reader_id: int | None = None
        self._reading = False
        self._waker: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._warned_at = 0.0
        self._shutting_down = False
        self._stopping = False

    @property
    def subscriptions(self) -> int:
        """Open subscriptions in this process."""
        return sum(len(subs) for subs in self._subs.values())

    def start(self) -> None:
        """Start the reader and the sweep (call from the running loop)."""
        self._tasks = [asyncio.create_task(self._run()), asyncio.create_task(self._sweep())]

    def shutdown(self) -> None:
        """Close every subscription, and every one made from now on (their streams end: the app is stopping)."""
        self._shutting_down = True
        for subs in list(self._subs.values()):
            for sub in list(subs):
                sub.close("shutdown")

    async def aclose(self) -> None:
        """Close every subscription, stop the reader, and close both clients."""
        self.shutdown()
        self._stopping = True
        self._changed.set()
        # Cancelling a blocked XREAD does not end it (redis-py waits for the reply): closing the socket does.
        if self._reader is not None:
            await self._reader.connection_pool.disconnect(inuse_connections=True)
        tasks = [*self._tasks, *([self._waker] if self._waker is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        if self._reader is not None:
            await self._reader.aclose()
        await self.redis.aclose()

    def subscribe(
        self,
        session: SessionKey,
        after: str | None,
        closing: Callable[[], bool] | None = None,
        *,
        tag: str | None = None,
    ) -> tuple[Subscription, bool]:
        """Receive the session's events that follow ``after`` (the last id the caller has seen; ``None``: none).

        Returns the subscription and whether the caller must catch up: when someone in this process already followed
        the session, the reader may have taken events after ``after`` before this call, and those are not delivered
        here; read them with :func:`~switchboard.outbound.webstream.replay` after subscribing, skipping ids already
        seen.
        Otherwise the reader starts at ``after`` and nothing is missed.
        """
        sub = Subscription(session, self.queue_limit, closing, tag)
        if self._shutting_down:
            sub.close("shutdown")
            return sub, False
        subs = self._subs.setdefault(session, set())
        subs.add(sub)
        key = SessionKeys(session).web
        cursor = self._cursors.get(key)
        if cursor is None:
            self._cursors[key] = after or "0-0"
            self._sessions[key] = session
            self._wake()
            return sub, False
        return sub, _id_key(cursor) > _id_key(after or "0-0")

    def tags(self) -> set[str]:
        """The tags of the open subscriptions."""
        return {sub.tag for subs in self._subs.values() for sub in subs if sub.tag is not None}

    def close_tagged(self, tags: set[str], reason: str) -> int:
        """Close every subscription whose tag is in ``tags``; returns how many."""
        closed = 0
        for subs in list(self._subs.values()):
            for sub in list(subs):
                if sub.tag in tags and not sub.closed:
                    sub.close(reason)
                    closed += 1
        return closed

    def unsubscribe(self, sub: Subscription) -> None:
        """Stop delivering to ``sub`` (and stop reading its session once nobody here follows it)."""
        sub.close("unsubscribed")
        subs = self._subs.get(sub.session)
        if subs is None:
            return
        subs.discard(sub)
        if not subs:
            del self._subs[sub.session]
            key = SessionKeys(sub.session).web
            self._cursors.pop(key, None)
            self._sessions.pop(key, None)

    # ------------------------------------------------------------------ the reader

    def _wake(self) -> None:
        self._changed.set()
        if self._waker is None or self._waker.done():
            self._waker = asyncio.create_task(self._unblock())

    async def _unblock(self) -> None:
        """Make a blocked ``XREAD`` return so the reader re-issues it with the sessions added since."""
        # one unblock for a burst of new streams
        await asyncio.sleep(min(max(_COALESCE_S, len(self._cursors) * _COALESCE_PER_KEY_S), _COALESCE_MAX_S))
        for _ in range(_UNBLOCK_TRIES):
            if not self._changed.is_set():
                return  # the reader already re-read the set
            reader_id = self._reader_id
            if self._reading and reader_id is not None:
                try:
                    if await self.redis.client_unblock(reader_id):
                        return
                except (RedisError, OSError):
                    return  # the reader sees the new set after its block time at worst
            await asyncio.sleep(0.01)  # the read has not reached the server yet

    async def _run(self) -> None:
        backoff = 0.1
        while not self._stopping:
            if not self._cursors:
                self._changed.clear()
                await self._changed.wait()
                continue
            self._changed.clear()
            streams = dict(self._cursors)
            try:
                if self._reader is None:
                    read = await self._poll(streams)
                else:
                    if self._reader_id is None:
                        self._reader_id = int(await self._reader.client_id())
                    self._reading = True
                    try:
                        reply = await self._reader.xread(streams, count=READ_COUNT, block=self.block_ms)  # type: ignore[arg-type]
                    finally:
                        self._reading = False
                    read = list(_streams(reply))
            except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
                self._reader_id = None
                if self._stopping:
                    return
                self._warn(f"web stream reader: Redis failed ({type(exc).__name__}); retrying")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.1
            for raw_key, entries in read:
                await self._dispatch(_text(raw_key), entries)

    async def _poll(self, streams: dict[str, str]) -> list[Any]:
        """One non-blocking ``XREAD`` per slot (a cluster's); waits up to :data:`POLL_S` when nothing came."""
        by_slot: dict[int, dict[str, str]] = {}
        for key, cursor in streams.items():
            by_slot.setdefault(key_slot(key.encode()), {})[key] = cursor
        async with self.redis.pipeline(transaction=False) as pipe:
            for group in by_slot.values():
                pipe.xread(group, count=READ_COUNT)  # type: ignore[arg-type]
            replies = await pipe.execute()
        read = [item for reply in replies for item in _streams(reply)]
        if not read:
            with suppress(TimeoutError):
                async with asyncio.timeout(POLL_S):
                    await self._changed.wait()
        return read

    async def _dispatch(self, key: str, entries: Any) -> None:
        if isinstance(entries, list) and entries and isinstance(entries[0], list) and len(entries[0]) == 1:
            entries = entries[0]  # RESP3 nests one more list level in some client versions
        if not entries or key not in self._cursors:
            return
        self._cursors[key] = _text(entries[-1][0])
        session = self._sessions[key]
        events = decode_entries(entries)
        if any(e.type == "user" for e in events):
            try:
                events = await with_message_ids(self.redis, session, events)
            except (RedisError, OSError, TimeoutError) as exc:
                # Without the ids a page cannot place the echoes: end these streams, their clients resume.
                self._warn(f"web stream reader: message id look-up failed ({type(exc).__name__})")
                for sub in list(self._subs.get(session, ())):
                    sub.close("redis")
                return
        if events:
            for sub in list(self._subs.get(session, ())):
                sub.deliver(events)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_s)
            for subs in list(self._subs.values()):
                for sub in list(subs):
                    if sub.closing is not None and sub.closing():
                        sub.close("gone")

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._warned_at >= 10.0:  # at most one warning per 10 s, however many streams are open
            self._warned_at = now
            logger.warning(message)
