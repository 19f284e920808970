"""Stranding gaps the chaos runs found, reproduced deterministically (fast; no worker processes).

Each leaves a session with an acknowledged message, no lease and a drain flag, and must be repaired within a few
lease TTLs, as docs/ARCHITECTURE.md §5 promises ("a periodic sweep (seconds, not minutes)"):

1. ``test_entry_popped_by_a_worker_that_died_before_registering_it_is_repaired`` — the worker's safety pass pops an
   entry (``LMPOP``) and registers it right after; a worker SIGKILLed in between leaves a flag whose entry is in no
   list, found by the ``queued_grace_s`` path (one lease TTL).
2. ``test_drain_crashed_on_redis_error_is_repaired_while_its_worker_lives`` — the Redis-outage run: a drain whose
   Redis calls fail (and whose closing fails too) leaves its entry in the running set with a deadline ahead; the
   reaper sees its session unleased for a lease TTL and repairs it.
3. ``test_lost_entry_of_a_leased_session_is_repaired_once_the_lease_goes`` — the SIGKILL run once more: the lost
   entry of a session still leased by the dead worker is repaired as soon as the lease lapses.
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.queue.ingest import Ingestor
from switchboard.queue.jobs import DrainJobs, entry
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.reaper import Reaper
from switchboard.queue.shards import shard_of
from switchboard.settings import QueueSettings

from .harness import text

SETTINGS = QueueSettings(lease_ms=500, reaper_interval_s=0.1)
REPAIR_BOUND_S = 10 * SETTINGS.lease_ms / 1000
"""Ten lease TTLs: generous for a sweep every 0.1 s, far below the 30 s and 60 s fallbacks."""


def _message(conversation: str = "4242", dedup: str = "gap-1") -> InboundMessage:
    ref = ConversationRef(agent="assistant", channel="telegram", conversation=conversation)
    return InboundMessage(dedup_key=dedup, conversation=ref, sender=Sender(id="7"), text="hello")


async def _popped(redis: aioredis.Redis) -> tuple[InboundMessage, str]:
    """Ingest one message and pop its drain entry the way the worker's safety pass does (``LMPOP``), unregistered."""
    message = _message()
    await Ingestor(redis, SETTINGS).ingest(message)
    shard = SessionKeys(message.session_key).shard
    popped = await redis.lmpop(1, shard.drainq, direction="LEFT")
    assert popped is not None
    _key, (raw,) = popped
    return message, text(raw).rpartition("|")[2]


async def _repaired(
    redis: aioredis.Redis, reaper: Reaper, message: InboundMessage, old: str, *, beat: str = ""
) -> float:
    """Sweep (as the reaper loop does) until the session has a new drain job queued; returns the seconds it took."""
    keys = SessionKeys(message.session_key)
    started = time.monotonic()
    while time.monotonic() - started < REPAIR_BOUND_S:
        if beat:
            await redis.zadd(GlobalKeys().workers, {beat: int(time.time() * 1000)})
        await redis.delete(GlobalKeys().reaper_lock)
        await reaper.sweep()
        flag = text(await redis.get(keys.drain))
        if flag and flag != old and await redis.lpos(keys.shard.drainq, entry(message.session_key, flag)) is not None:
            return time.monotonic() - started
        await asyncio.sleep(SETTINGS.reaper_interval_s)
    raise AssertionError(
        f"session {message.session_key} not given a new drain job within {REPAIR_BOUND_S:g} s (flag still {old})"
    )


async def test_entry_popped_by_a_worker_that_died_before_registering_it_is_repaired(
    async_redis: aioredis.Redis,
) -> None:
    message, job_id = await _popped(async_redis)  # ... and that worker died before registering it
    reaper = Reaper(async_redis, SETTINGS, worker_id="survivor")
    assert await _repaired(async_redis, reaper, message, job_id) < REPAIR_BOUND_S


async def test_drain_crashed_on_redis_error_is_repaired_while_its_worker_lives(async_redis: aioredis.Redis) -> None:
    message = _message()
    await Ingestor(async_redis, SETTINGS).ingest(message)
    started, _ = await DrainJobs().take(async_redis, shard_of(message.session_key), ttl_s=60.0)
    assert started is not None
    # the drain then crashed on a Redis error and its closing failed as well (Redis was down): no lease, the
    # entry still running with a deadline ahead, its worker alive and heartbeating (so renewing that deadline)
    assert not await async_redis.exists(SessionKeys(message.session_key).lease)
    reaper = Reaper(async_redis, SETTINGS, worker_id="alive")
    await _repaired(async_redis, reaper, message, started.job_id, beat="alive")
    assert await async_redis.zscore(SessionKeys(message.session_key).shard.wip, started.entry) is None


async def test_lost_entry_of_a_leased_session_is_repaired_once_the_lease_goes(async_redis: aioredis.Redis) -> None:
    message, job_id = await _popped(async_redis)
    lease = SessionKeys(message.session_key).lease
    await async_redis.set(lease, "token:dead-worker", px=int(REPAIR_BOUND_S * 1000))
    reaper = Reaper(async_redis, SETTINGS, worker_id="survivor")
    await asyncio.sleep(SETTINGS.lease_ms / 1000 + 0.1)
    assert await reaper.sweep() == 0  # lost, but the session is leased: not repaired yet
    await async_redis.delete(lease)  # the dead worker's lease lapses
    await _repaired(async_redis, reaper, message, job_id)


async def test_repaired_session_goes_to_the_head_of_its_shard_queue(async_redis: aioredis.Redis) -> None:
    message, job_id = await _popped(async_redis)
    shard = shard_of(message.session_key)
    names = (c for c in (f"77{i}" for i in range(1_000_000)) if shard_of(_message(c).session_key) == shard)
    waiting = [_message(next(names), f"wait-{i}") for i in range(3)]
    for other in waiting:
        await Ingestor(async_redis, SETTINGS).ingest(other)
    drainq = SessionKeys(message.session_key).shard.drainq
    assert await async_redis.llen(drainq) == 3
    await asyncio.sleep(SETTINGS.lease_ms / 1000 + 0.1)
    assert await Reaper(async_redis, SETTINGS, worker_id="r").sweep() == 1
    flag = text(await async_redis.get(SessionKeys(message.session_key).drain))
    assert text(await async_redis.lindex(drainq, 0)) == entry(message.session_key, flag) and flag != job_id
    assert await async_redis.llen(drainq) == 4


async def test_batched_repairs_survive_a_flushed_script_cache(async_redis: aioredis.Redis) -> None:
    """Repairs go out in one pipeline; a Redis that lost its script cache (restarted) refuses them all once."""
    message, job_id = await _popped(async_redis)
    await asyncio.sleep(SETTINGS.lease_ms / 1000 + 0.1)
    await async_redis.script_flush()
    assert await Reaper(async_redis, SETTINGS, worker_id="r").sweep() == 1
    flag = text(await async_redis.get(SessionKeys(message.session_key).drain))
    drainq = SessionKeys(message.session_key).shard.drainq
    assert flag != job_id and await async_redis.lpos(drainq, entry(message.session_key, flag)) == 0
