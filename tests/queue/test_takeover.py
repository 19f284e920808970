"""Takeover after a crash: a worker whose liveness key expired loses its sessions at once; a busy one never does."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.errors import FencedWriteError
from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.queue.jobs import DrainJobs
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.lease import Lease, fenced_xadd
from switchboard.queue.reaper import Reaper
from switchboard.queue.stats import fenced_total
from switchboard.settings import QueueSettings
from switchboard.worker.worker import ALIVE_BEATS, SessionWorker
from tests.waiting import wait_until

from .conftest import RecordingDeliverer, echo_runner, make_drainer, make_message, queued_entries

_GLOBAL = GlobalKeys()


async def _register(client: aioredis.Redis, worker: str, *, alive: bool) -> None:
    await client.zadd(_GLOBAL.workers, {worker: time.time() * 1000})
    if alive:
        await client.set(_GLOBAL.worker_alive(worker), "1", px=60_000)


async def test_dead_workers_sessions_are_taken_over_before_the_lease_lapses(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    dead_msg = make_message("held by the dead", conversation="d")
    live_msg = make_message("held by the living", conversation="l")
    await ingestor.ingest(dead_msg)
    await ingestor.ingest(live_msg)
    for msg in (dead_msg, live_msg):  # both drains were taken by their workers
        await client.delete(SessionKeys(msg.session_key).shard.drainq)
    ghost = await Lease(client, worker_id="ghost", lease_ms=60_000).acquire(dead_msg.session_key)
    alive = await Lease(client, worker_id="alive", lease_ms=60_000).acquire(live_msg.session_key)
    assert ghost is not None and alive is not None
    await _register(client, "ghost", alive=False)  # SIGKILLed: its liveness key expired
    await _register(client, "alive", alive=True)

    reaper = Reaper(client, queue_settings, worker_id="me")
    assert await reaper.take_over_dead_workers() == 1
    dead_keys, live_keys = SessionKeys(dead_msg.session_key), SessionKeys(live_msg.session_key)
    assert await client.exists(dead_keys.lease) == 0  # freed now, not in 60 s
    flag = (await client.get(dead_keys.drain)).decode()
    assert await queued_entries(client, dead_msg.session_key) == [f"{dead_msg.session_key}|{flag}"]
    assert (await client.get(live_keys.lease)).decode() == alive.token  # a live holder is left alone
    assert [w.decode() for w in await client.zrange(_GLOBAL.workers, 0, -1)] == ["alive"]
    # the lease stays the fence: the dead worker, were it only frozen, is refused its next write
    with pytest.raises(FencedWriteError):
        await fenced_xadd(client, ghost, dead_keys.events, {"kind": "zombie"}, 100)
    assert await reaper.take_over_dead_workers() == 0  # forgotten: no second takeover


async def test_takeover_leaves_a_lease_that_changed_meanwhile(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    msg = make_message("x")
    await ingestor.ingest(msg)
    lease = await Lease(client, worker_id="ghost", lease_ms=60_000).acquire(msg.session_key)
    assert lease is not None
    jobs = DrainJobs()
    assert await jobs.take_over(client, msg.session_key, "999:ghost") is None
    assert (await client.get(SessionKeys(msg.session_key).lease)).decode() == lease.token


async def test_a_dead_workers_session_is_answered_by_another_worker(
    redis_url: str, ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    """End to end in one process: a 'crashed' holder (lease for a minute, no heartbeat) is replaced in seconds."""
    settings = queue_settings.model_copy(update={"lease_ms": 60_000, "reaper_interval_s": 30.0})
    msg = make_message("orphaned")
    await ingestor.ingest(msg)
    await client.delete(SessionKeys(msg.session_key).shard.drainq)
    assert await Lease(client, worker_id="crashed", lease_ms=60_000).acquire(msg.session_key)
    await _register(client, "crashed", alive=False)
    deliverer = RecordingDeliverer()
    stop = asyncio.Event()
    worker = SessionWorker(
        redis_url,
        settings,
        drainer_factory=lambda redis, wid: make_drainer(redis, settings, deliverer, echo_runner, wid),
        worker_id="rescuer",
        heartbeat_s=0.1,
    )
    task = asyncio.create_task(worker.run(stop))

    async def answered() -> bool:
        return deliverer.texts() == ["echo: orphaned"]

    try:
        await wait_until(
            answered, "the answer from the new worker", timeout=20
        )  # neither the lease (60 s) nor the sweep (30 s) could explain it
    finally:
        stop.set()
        await task


async def test_a_busy_worker_is_never_taken_for_dead(
    redis_url: str, ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    """A turn lasting five liveness TTLs, with a second worker checking for dead ones all along: no takeover.

    (The chaos suite runs the ten-second turn against real processes with the default heartbeat.)
    """
    beat_s = 0.2
    turn_s = 5 * ALIVE_BEATS * beat_s
    settings = queue_settings.model_copy(update={"lease_ms": 60_000})
    started = asyncio.Event()

    async def long_turn(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        started.set()
        await asyncio.sleep(turn_s)  # a long model call: awaits, the loop stays free
        return await echo_runner(request, sink, store)

    busy_out, idle_out = RecordingDeliverer(), RecordingDeliverer()

    def worker(wid: str, deliverer: RecordingDeliverer) -> SessionWorker:
        return SessionWorker(
            redis_url,
            settings,
            drainer_factory=lambda redis, w: make_drainer(redis, settings, deliverer, long_turn, w),
            worker_id=wid,
            heartbeat_s=beat_s,
        )

    stop = asyncio.Event()
    busy = asyncio.create_task(worker("busy", busy_out).run(stop))
    msg = make_message("take your time")
    await ingestor.ingest(msg)
    await started.wait()
    idle = asyncio.create_task(worker("idle", idle_out).run(stop))

    async def answered() -> bool:
        return busy_out.texts() == ["echo: take your time"]

    try:
        await wait_until(answered, "the answer from the new worker", timeout=30)
    finally:
        stop.set()
        await asyncio.gather(busy, idle)
    starts = [e for e in await read_events(client, msg.session_key) if e["kind"] == "run_started"]
    assert [e["worker"] for e in starts] == ["busy"]  # one start, under the busy worker's one lease
    assert idle_out.sent == [] and await fenced_total(client) == 0
