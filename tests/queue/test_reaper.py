from __future__ import annotations

import time

import redis
import redis.asyncio as aioredis
from rq import Queue
from rq.serializers import JSONSerializer

from switchboard.queue.ingest import Ingestor
from switchboard.queue.jobs import DrainJobs, new_job_id
from switchboard.queue.keys import GlobalKeys, RQKeys, SessionKeys
from switchboard.queue.lease import Lease
from switchboard.queue.reaper import Reaper, live_workers, queued_grace_s
from switchboard.settings import QueueSettings

from .conftest import make_message


async def _flag(client: aioredis.Redis, session: str) -> str | None:
    raw = await client.get(SessionKeys(session).drain)  # type: ignore[arg-type]
    return raw.decode() if raw else None


async def test_reaper_reenqueues_session_whose_drain_job_vanished(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, sync_redis: redis.Redis
) -> None:
    msg = make_message("stranded")
    await ingestor.ingest(msg)
    old = await _flag(client, msg.session_key)
    rq = RQKeys(queue_settings.name)
    await client.delete(rq.job(old or ""), rq.queue)  # the job is gone (e.g. deleted by an operator)

    reaper = Reaper(client, queue_settings, worker_id="w1", sync_redis=sync_redis)
    assert await reaper.sweep() == 1
    new = await _flag(client, msg.session_key)
    assert new and new != old
    queue = Queue(queue_settings.name, connection=sync_redis, serializer=JSONSerializer)
    assert queue.job_ids == [new]
    assert queue.fetch_job(new).args == [msg.session_key]  # type: ignore[union-attr]


async def test_reaper_leaves_healthy_sessions_alone(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    queued = make_message("queued", conversation="q")
    await ingestor.ingest(queued)  # job waiting in the queue: fine
    leased = make_message("leased", conversation="l")
    await ingestor.ingest(leased)
    rq = RQKeys(queue_settings.name)
    await client.delete(rq.job((await _flag(client, leased.session_key)) or ""))
    assert await Lease(client, worker_id="w9", lease_ms=10_000).acquire(leased.session_key)  # a live holder

    assert await Reaper(client, queue_settings, worker_id="w1").sweep() == 0
    assert await client.llen(rq.queue) == 2


async def test_reaper_recovers_job_started_by_a_dead_worker(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    msg = make_message("orphan")
    await ingestor.ingest(msg)
    jobs = DrainJobs(queue_settings.name)
    popped = await client.blmove(jobs.keys.queue, jobs.keys.intermediate, 1, "LEFT", "RIGHT")
    started = await jobs.start(client, popped.decode(), worker="ghost", heartbeat_ttl_s=60)
    assert started is not None and started.session == msg.session_key
    await client.zadd(GlobalKeys().workers, {"alive": time.time() * 1000})

    assert await Reaper(client, queue_settings, worker_id="w1").sweep() == 1  # "ghost" never heartbeated
    assert await client.llen(jobs.keys.queue) == 1
    assert await live_workers(client, 5.0) == 1


async def test_reaper_repairs_job_stuck_in_the_intermediate_list(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    msg = make_message("stuck")
    await ingestor.ingest(msg)
    jobs = DrainJobs(queue_settings.name)
    job_id = (await client.blmove(jobs.keys.queue, jobs.keys.intermediate, 1, "LEFT", "RIGHT")).decode()
    # the worker died right after BLMOVE: the id sits in the intermediate list, the job still says queued
    reaper = Reaper(client, queue_settings, worker_id="w1")
    assert await reaper.sweep() == 0  # first sight only notes when
    await client.set(jobs.keys.first_seen(job_id), f"{time.time() - 60:.3f}")
    await client.delete(GlobalKeys().reaper_lock)
    assert await reaper.sweep() == 1
    assert await client.llen(jobs.keys.intermediate) == 0
    assert await client.llen(jobs.keys.queue) == 1


async def test_reaper_repairs_old_queued_job_that_is_in_no_list(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    msg = make_message("lost job")
    await ingestor.ingest(msg)
    jobs = DrainJobs(queue_settings.name)
    reaper = Reaper(client, queue_settings, worker_id="w1")
    await client.delete(jobs.keys.queue)  # the job hash still says queued, but no list holds it
    assert await reaper.sweep() == 0  # too young to suspect: it may be waiting behind a backlog
    old = new_job_id(time.time() - 2 * queued_grace_s(queue_settings))
    await client.hset(jobs.keys.job(old), mapping={"status": "queued"})
    await client.set(SessionKeys(msg.session_key).drain, old)
    await client.delete(GlobalKeys().reaper_lock)
    assert await reaper.sweep() == 1
    assert await _flag(client, msg.session_key) != old


async def test_only_one_reaper_sweeps_at_a_time(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    await client.set(GlobalKeys().reaper_lock, "other", px=10_000)
    msg = make_message("x")
    await ingestor.ingest(msg)
    await client.delete(SessionKeys(msg.session_key).drain)
    assert await Reaper(client, queue_settings, worker_id="w1").sweep() == 0
