"""Which worker consumes which shard's drain queue, the wake-ups that say a shard has work, and the fair order.

- **Assignment** (:func:`owned_shards`): no owner keys. Every worker reads the live workers (``GlobalKeys.workers``)
  and takes the shards rendezvous (highest-random-weight) hashing gives it, so an idle single node stores nothing
  per shard. While membership changes, two workers may both consume a shard for a heartbeat (safe: a take is atomic,
  the session lease fences the runs) or none (a delay until the next heartbeat).
- **Wake-ups** (:class:`ShardListener`): a script that pushes a drain entry ``SPUBLISH``es on the shard's ready
  channel; a worker ``SSUBSCRIBE``s to its shards' ready channels, and to the cancel channels of those shards and of
  the shards it runs drains of (a running turn's stop reaches it even after its shard moved on). Pub/sub is at most
  once: the worker's safety pass (``LMPOP`` over its shards' queues) finds what a lost wake-up left.
- **Fairness** (:class:`ShardRota`): the shards known to have work, served one entry each in turn, so a newcomer on
  any shard waits at most one turn of each session ahead of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterPubSub
from redis.exceptions import RedisError

from switchboard.queue.keys import ShardKeys
from switchboard.queue.shards import SHARDS
from switchboard.types import SessionKey

__all__ = ["ShardListener", "ShardRota", "owned_shards"]

logger = logging.getLogger(__name__)

_CHANNELS: dict[bytes, tuple[int, bool]] = {}
"""Channel name → (shard, whether it is the cancel channel), for every shard."""
for _keys in ShardKeys.every():
    _CHANNELS[_keys.ready.encode()] = (_keys.shard, False)
    _CHANNELS[_keys.cancel.encode()] = (_keys.shard, True)


def _weight(worker: str, shard: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{worker}\x00{shard}".encode(), digest_size=8).digest(), "big")


def owned_shards(me: str, workers: Iterable[str]) -> frozenset[int]:
    """The shards rendezvous hashing gives ``me`` among the live ``workers`` (``me`` counts even if not listed)."""
    others = sorted(set(workers) - {me})
    if not others:
        return frozenset(range(SHARDS))
    return frozenset(
        shard for shard in range(SHARDS) if _weight(me, shard) > max(_weight(other, shard) for other in others)
    )


class ShardRota:
    """The shards known to have drain entries waiting, in the order the worker serves them (each at most once)."""

    def __init__(self) -> None:
        self._order: deque[int] = deque()
        self._queued: set[int] = set()
        self.woken = asyncio.Event()
        """Set when a shard was added (the worker's idle wait ends)."""

    def add(self, shard: int) -> None:
        """Put ``shard`` at the back, unless it is already waiting its turn."""
        if shard not in self._queued:
            self._queued.add(shard)
            self._order.append(shard)
            self.woken.set()

    def next(self) -> int | None:
        """The shard whose turn it is (removed: re-add it when it still has work), or ``None``."""
        if not self._order:
            self.woken.clear()
            return None
        shard = self._order.popleft()
        self._queued.discard(shard)
        return shard

    def others_than(self, shard: int) -> bool:
        """Whether a shard other than ``shard`` waits its turn."""
        return any(s != shard for s in self._order)

    def waiting(self) -> frozenset[int]:
        """The shards waiting their turn."""
        return frozenset(self._queued)

    def __len__(self) -> int:
        return len(self._order)


class ShardListener:
    """One sharded pub/sub connection over the ready and cancel channels of the shards :meth:`watch` names.

    On a single node one ``SSUBSCRIBE`` carries every channel; redis-py's cluster pub/sub routes each shard channel to
    its node.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        on_ready: Callable[[int], None],
        on_stop: Callable[[SessionKey, str], bool],
        reason_of: Callable[[SessionKey], Awaitable[str | None]],
    ) -> None:
        """Call ``on_ready(shard)`` for a wake-up, ``on_stop(session, reason)`` for a stop request.

        ``reason_of(session)`` reads a stop's reason (:func:`~switchboard.queue.cancellation.stop_requested_since`).
        """
        self.redis = redis
        self.on_ready = on_ready
        self.on_stop = on_stop
        self.reason_of = reason_of
        self._wanted: set[bytes] = set()
        self.subscribed: set[bytes] = set()
        """The channels subscribed to now (what :meth:`watch` asked for, once the listener caught up)."""
        self.ready = asyncio.Event()
        """Set once the channels :meth:`watch` named first are subscribed (wake-ups from then on are heard)."""

    def watch(self, ready: Collection[int], cancel: Collection[int]) -> None:
        """Listen to the ready channels of ``ready`` and the cancel channels of ``cancel`` from now on."""
        every = ShardKeys.every()
        self._wanted = {every[s].ready.encode() for s in ready} | {every[s].cancel.encode() for s in cancel}

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver wake-ups and stop requests until ``stop`` is set (resubscribes after a lost connection)."""
        while not stop.is_set():
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            self.subscribed = set()
            try:
                while not stop.is_set():
                    await self._follow(pubsub)
                    message = await (
                        pubsub.get_sharded_message(timeout=0.2)  # a cluster's per-node sharded subscriptions
                        if isinstance(pubsub, ClusterPubSub)
                        else pubsub.get_message(timeout=0.2)
                    )
                    if message is None or message.get("type") != "smessage":
                        continue
                    channel = message["channel"]
                    name = channel if isinstance(channel, bytes) else str(channel).encode()
                    shard, cancel = _CHANNELS.get(name, (-1, False))
                    if shard < 0:
                        continue
                    if not cancel:
                        self.on_ready(shard)
                        continue
                    raw = message["data"]
                    session = SessionKey(raw.decode() if isinstance(raw, bytes) else str(raw))
                    reason = await self.reason_of(session) or "stopped on request"
                    if self.on_stop(session, reason):
                        logger.info("stopping the running turn of %s", session)
            except (RedisError, OSError) as err:
                logger.warning("shard listener lost Redis (%s); resubscribing", type(err).__name__)
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]

    async def _follow(self, pubsub: aioredis.client.PubSub) -> None:
        wanted = self._wanted
        gone, new = self.subscribed - wanted, wanted - self.subscribed
        if gone:
            await pubsub.sunsubscribe(*gone)
        if new:
            await pubsub.ssubscribe(*new)
        if gone or new:
            self.subscribed = set(wanted)
        if wanted:
            self.ready.set()
