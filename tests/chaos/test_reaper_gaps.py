"""Two stranding gaps the chaos runs found, reproduced deterministically (fast; no worker processes).

Both leave a session with an acknowledged message, no lease and a drain flag the reaper believes is fine, so the
message waits for a slow fallback (30 s, or RQ's 60 s started-job expiry) instead of the few seconds
docs/ARCHITECTURE.md §5 promises ("a periodic sweep (seconds, not minutes)"):

1. ``test_reaper_dying_between_its_two_steps_hides_nothing`` — the SIGKILL chaos run (a kill every 0.3 s) saw
   recoveries of 32–43 s: the reaper drops a stuck job id from RQ's intermediate list (and its first-seen mark)
   *before* re-enqueueing its session, so a reaper killed in between leaves a flag pointing at a queued job in no
   list, which only the 30 s ``queued_grace_s`` path notices.
2. ``test_drain_crashed_on_redis_error_is_repaired_while_its_worker_lives`` — the Redis-outage run: a drain whose
   Redis calls fail (and whose ``jobs.finish`` fails too) leaves its job ``started`` under a live worker's name;
   the reaper treats that as running, so the session waits ~60 s for RQ's StartedJobRegistry expiry.
3. ``test_stuck_job_given_up_while_its_session_is_leased_is_repaired_once_the_lease_goes`` — the SIGKILL run once
   more: a stuck id dropped while its session was still leased left a queued job in no list (33 s recoveries).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import redis.asyncio as aioredis

from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.queue.ingest import Ingestor
from switchboard.queue.jobs import DrainJobs
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.reaper import Reaper
from switchboard.settings import QueueSettings

from .harness import text

SETTINGS = QueueSettings(lease_ms=500, reaper_interval_s=0.1)
REPAIR_BOUND_S = 10 * SETTINGS.lease_ms / 1000
"""Ten lease TTLs: generous for a sweep every 0.1 s, far below the 30 s and 60 s fallbacks."""
STARTED_TTL_S = 60.0
"""What ``SessionWorker`` registers started drain jobs with (``switchboard.worker.worker.STARTED_TTL_S``)."""


def _message() -> InboundMessage:
    conversation = ConversationRef(agent="assistant", channel="telegram", conversation="4242")
    return InboundMessage(dedup_key="gap-1", conversation=conversation, sender=Sender(id="7"), text="hello")


async def _popped(redis: aioredis.Redis) -> tuple[InboundMessage, DrainJobs, str]:
    """Ingest one message and take its drain job off RQ's queue the way a worker does (``BLMOVE``)."""
    message = _message()
    await Ingestor(redis, SETTINGS).ingest(message)
    jobs = DrainJobs(SETTINGS.name)
    raw = await redis.blmove(jobs.keys.queue, jobs.keys.intermediate, 1, "LEFT", "RIGHT")
    assert raw is not None
    return message, jobs, text(raw)


async def _repaired(
    redis: aioredis.Redis, reaper: Reaper, message: InboundMessage, old: str, *, beat: str = ""
) -> float:
    """Sweep (as the reaper loop does) until the session has a new drain job queued; returns the seconds it took."""
    keys = SessionKeys(message.session_key)
    jobs = DrainJobs(SETTINGS.name)
    started = time.monotonic()
    while time.monotonic() - started < REPAIR_BOUND_S:
        if beat:
            await redis.zadd(GlobalKeys().workers, {beat: int(time.time() * 1000)})
        await redis.delete(GlobalKeys().reaper_lock)
        await reaper.sweep()
        flag = text(await redis.get(keys.drain))
        if flag and flag != old and await redis.lpos(jobs.keys.queue, flag) is not None:
            return time.monotonic() - started
        await asyncio.sleep(SETTINGS.reaper_interval_s)
    raise AssertionError(
        f"session {message.session_key} not given a new drain job within {REPAIR_BOUND_S:g} s (flag still {old})"
    )


async def test_reaper_dying_between_its_two_steps_hides_nothing(async_redis: aioredis.Redis) -> None:
    message, _jobs, job_id = await _popped(async_redis)  # ... and that worker died right after BLMOVE

    async def sigkilled() -> int:
        raise RuntimeError("the reaper's worker was SIGKILLed here")

    dying = Reaper(async_redis, SETTINGS, worker_id="dying")
    dying._sweep_runnable = sigkilled  # type: ignore[method-assign]
    with contextlib.suppress(RuntimeError):
        await dying.sweep()  # first sighting of the stuck id
    await asyncio.sleep(SETTINGS.lease_ms / 1000 + 0.1)
    await async_redis.delete(GlobalKeys().reaper_lock)
    with contextlib.suppress(RuntimeError):
        await dying.sweep()  # finds it stuck, then dies before re-enqueueing the session
    survivor = Reaper(async_redis, SETTINGS, worker_id="survivor")
    await _repaired(async_redis, survivor, message, job_id)


async def test_drain_crashed_on_redis_error_is_repaired_while_its_worker_lives(async_redis: aioredis.Redis) -> None:
    message, jobs, job_id = await _popped(async_redis)
    started = await jobs.start(async_redis, job_id, worker="alive", heartbeat_ttl_s=STARTED_TTL_S)
    assert started is not None
    # the drain then crashed on a Redis error and its jobs.finish failed as well (Redis was down): no lease, the
    # job still 'started', its worker alive and heartbeating but no longer running it (so not renewing its deadline)
    assert not await async_redis.exists(SessionKeys(message.session_key).lease)
    reaper = Reaper(async_redis, SETTINGS, worker_id="alive")
    await _repaired(async_redis, reaper, message, job_id, beat="alive")


async def test_stuck_job_given_up_while_its_session_is_leased_is_repaired_once_the_lease_goes(
    async_redis: aioredis.Redis,
) -> None:
    """3. The SIGKILL chaos run again (recoveries of 33 s): a stuck job dropped from the intermediate list while its
    session's lease was still held (by the worker that died, until its TTL) stayed ``queued`` in no list, so only
    the 30 s ``queued_grace_s`` path found it. Giving a stuck job up now deletes its hash in the same step."""
    message, jobs, job_id = await _popped(async_redis)
    lease = SessionKeys(message.session_key).lease
    await async_redis.set(lease, "token:dead-worker", px=int(REPAIR_BOUND_S * 1000))
    reaper = Reaper(async_redis, SETTINGS, worker_id="survivor")
    await reaper.sweep()  # first sighting
    await asyncio.sleep(SETTINGS.lease_ms / 1000 + 0.1)
    await async_redis.delete(GlobalKeys().reaper_lock)
    await reaper.sweep()  # stuck: given up, but the session is leased, so not repaired yet
    assert await async_redis.llen(jobs.keys.intermediate) == 0
    assert not await async_redis.exists(jobs.keys.job(job_id))
    assert await jobs.start(async_redis, job_id, worker="late", heartbeat_ttl_s=STARTED_TTL_S) is None
    await async_redis.delete(lease)  # the dead worker's lease lapses
    await _repaired(async_redis, reaper, message, job_id)


async def test_repaired_session_goes_to_the_head_of_the_queue(async_redis: aioredis.Redis) -> None:
    message, jobs, job_id = await _popped(async_redis)
    await async_redis.delete(jobs.keys.job(job_id), jobs.keys.intermediate)  # its job is gone (e.g. purged)
    waiting = [
        InboundMessage(
            dedup_key=f"wait-{i}",
            conversation=ConversationRef(agent="assistant", channel="telegram", conversation=f"77{i}"),
            sender=Sender(id="8"),
            text="later",
        )
        for i in range(3)
    ]
    for other in waiting:
        await Ingestor(async_redis, SETTINGS).ingest(other)
    assert await async_redis.llen(jobs.keys.queue) == 3
    assert await Reaper(async_redis, SETTINGS, worker_id="r").sweep() == 1
    head = text(await async_redis.lindex(jobs.keys.queue, 0))
    assert head == text(await async_redis.get(SessionKeys(message.session_key).drain)) != job_id
    assert await async_redis.llen(jobs.keys.queue) == 4


async def test_batched_repairs_survive_a_flushed_script_cache(async_redis: aioredis.Redis) -> None:
    """Repairs go out in one pipeline; a Redis that lost its script cache (restarted) refuses them all once."""
    message, jobs, job_id = await _popped(async_redis)
    await async_redis.delete(jobs.keys.job(job_id), jobs.keys.intermediate)
    await async_redis.script_flush()
    assert await Reaper(async_redis, SETTINGS, worker_id="r").sweep() == 1
    flag = text(await async_redis.get(SessionKeys(message.session_key).drain))
    assert flag != job_id and await async_redis.lpos(jobs.keys.queue, flag) == 0
