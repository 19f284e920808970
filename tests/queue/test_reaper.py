from __future__ import annotations

import time

import redis.asyncio as aioredis

from switchboard.queue.ingest import Ingestor
from switchboard.queue.jobs import DrainJobs, entry, new_job_id
from switchboard.queue.keys import GlobalKeys, SessionKeys, ShardKeys
from switchboard.queue.lease import Lease
from switchboard.queue.reaper import Reaper, queued_grace_s
from switchboard.settings import QueueSettings

from .conftest import make_message, queued_entries


async def _flag(client: aioredis.Redis, session: str) -> str | None:
    raw = await client.get(SessionKeys(session).drain)  # type: ignore[arg-type]
    return raw.decode() if raw else None


async def test_reaper_reenqueues_session_whose_drain_job_vanished(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    msg = make_message("stranded")
    await ingestor.ingest(msg)
    old = await _flag(client, msg.session_key)
    await client.delete(SessionKeys(msg.session_key).shard.drainq)  # the entry is gone (e.g. deleted by an operator)
    reaper = Reaper(client, queue_settings, worker_id="w1")
    assert await reaper.sweep() == 0  # too young to suspect: it may be on its way to a worker
    old = new_job_id(time.time() - 2 * queued_grace_s(queue_settings))  # an entry this old is in no list: lost
    await client.set(SessionKeys(msg.session_key).drain, old)
    await client.delete(GlobalKeys().reaper_lock)

    assert await reaper.sweep() == 1
    new = await _flag(client, msg.session_key)
    assert new and new != old
    assert await queued_entries(client, msg.session_key) == [entry(msg.session_key, new)]


async def test_reaper_leaves_healthy_sessions_alone(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    queued = make_message("queued", conversation="q")
    await ingestor.ingest(queued)  # job waiting in the queue: fine
    leased = make_message("leased", conversation="l")
    await ingestor.ingest(leased)
    assert await Lease(client, worker_id="w9", lease_ms=10_000).acquire(leased.session_key)  # a live holder
    await client.delete(SessionKeys(leased.session_key).shard.drainq)
    await client.set(SessionKeys(leased.session_key).drain, new_job_id(time.time() - 3600))  # old, in no list

    assert await Reaper(client, queue_settings, worker_id="w1").sweep() == 0
    assert await queued_entries(client, queued.session_key) == [
        entry(queued.session_key, (await _flag(client, queued.session_key)) or "")
    ]


async def test_reaper_recovers_a_drain_whose_worker_stopped_heartbeating_it(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    msg = make_message("orphan")
    await ingestor.ingest(msg)
    jobs = DrainJobs()
    shard = SessionKeys(msg.session_key).shard
    started, left = await jobs.take(client, shard.shard, ttl_s=60)
    assert started is not None and started.session == msg.session_key and left == 0
    reaper = Reaper(client, queue_settings, worker_id="w1")
    assert await reaper.sweep() == 0  # running: its deadline is ahead

    await client.zadd(shard.wip, {started.entry: time.time() - 1})  # its worker stopped heartbeating it
    await client.delete(GlobalKeys().reaper_lock)
    assert await reaper.sweep() == 1
    new = await _flag(client, msg.session_key)
    assert new != started.job_id and await queued_entries(client, msg.session_key) == [
        entry(msg.session_key, new or "")
    ]
    assert await client.zscore(shard.wip, started.entry) is None  # the dead drain's entry went in the same step


async def test_reaper_repairs_a_running_drain_whose_session_stays_unleased(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    """A drain heartbeated but holding no lease for a whole lease TTL is not running (it died on a Redis error)."""
    msg = make_message("unleased")
    await ingestor.ingest(msg)
    started, _ = await DrainJobs().take(client, SessionKeys(msg.session_key).shard.shard, ttl_s=600)
    assert started is not None
    reaper = Reaper(client, queue_settings, worker_id="w1")
    assert await reaper.sweep() == 0  # first sight only notes when
    await client.set(GlobalKeys().unleased_since(started.job_id), f"{time.time() - 3600:.3f}")
    await client.delete(GlobalKeys().reaper_lock)
    assert await reaper.sweep() == 1


async def test_reaper_cleans_long_expired_running_entries(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    every = ShardKeys.every()
    await client.zadd(every[3].wip, {"tenant/a|d1": time.time() - 7200, "tenant/b|d2": time.time() + 60})
    reaper = Reaper(client, queue_settings, worker_id="w1")
    await reaper.sweep()
    assert [m.decode() for m in await client.zrange(every[3].wip, 0, -1)] == ["tenant/b|d2"]


async def test_only_one_reaper_sweeps_at_a_time(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    await client.set(GlobalKeys().reaper_lock, "other", px=10_000)
    msg = make_message("x")
    await ingestor.ingest(msg)
    await client.delete(SessionKeys(msg.session_key).drain)
    assert await Reaper(client, queue_settings, worker_id="w1").sweep() == 0
