"""Workers and shards: rendezvous assignment, joining and dead workers, lost wake-ups (real workers in process)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict

import redis.asyncio as aioredis

from switchboard.queue.ingest import Ingestor
from switchboard.queue.jobs import DrainJobs
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.lease import Lease
from switchboard.queue.shards import SHARDS, shard_of
from switchboard.queue.shardwork import ShardRota, owned_shards
from switchboard.settings import QueueSettings
from switchboard.worker.worker import SessionWorker
from tests.shardindexes import count_of
from tests.waiting import wait_until

from .conftest import RecordingDeliverer, conversation_in_shard, echo_runner, make_drainer, make_message

_GLOBAL = GlobalKeys()


def _worker(redis_url: str, settings: QueueSettings, deliverer: RecordingDeliverer, wid: str) -> SessionWorker:
    return SessionWorker(
        redis_url,
        settings,
        drainer_factory=lambda redis, worker_id: make_drainer(redis, settings, deliverer, echo_runner, worker_id),
        worker_id=wid,
        heartbeat_s=0.1,
    )


def _replies(*deliverers: RecordingDeliverer) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for deliverer in deliverers:
        for sent in deliverer.sent:
            if sent.action.kind == "text":
                out[sent.conversation.conversation].append(sent.action.text)  # type: ignore[union-attr]
    return out


def test_rendezvous_splits_every_shard_among_the_workers_and_a_newcomer_moves_only_its_share() -> None:
    three = ["w1", "w2", "w3"]
    owned = {w: owned_shards(w, three) for w in three}
    assert sum(len(s) for s in owned.values()) == SHARDS and set().union(*owned.values()) == set(range(SHARDS))
    assert all(250 < len(s) < 440 for s in owned.values())  # about a third each
    four = [*three, "w4"]
    moved = {w: owned[w] - owned_shards(w, four) for w in three}
    assert set().union(*moved.values()) == owned_shards("w4", four)  # only the newcomer's shards move
    assert owned_shards("w1", ["w1"]) == owned_shards("w1", []) == frozenset(range(SHARDS))


def test_the_rota_serves_each_shard_with_work_once_per_round() -> None:
    rota = ShardRota()
    for shard in (5, 9, 5, 2):
        rota.add(shard)
    assert [rota.next(), rota.next()] == [5, 9]
    rota.add(5)  # 5 still has work: behind 2
    assert rota.waiting() == {2, 5} and rota.others_than(5)
    assert [rota.next(), rota.next(), rota.next()] == [2, 5, None]


async def test_two_workers_drain_sessions_on_many_shards_in_order_exactly_once(
    redis_url: str, client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings
) -> None:
    settings = queue_settings.model_copy(update={"concurrency": 4})
    out1, out2 = RecordingDeliverer(), RecordingDeliverer()
    stop = asyncio.Event()
    workers = [_worker(redis_url, settings, out1, "w1"), _worker(redis_url, settings, out2, "w2")]
    tasks = [asyncio.create_task(w.run(stop)) for w in workers]

    async def split() -> bool:
        return len(workers[0].owned) + len(workers[1].owned) == SHARDS and 0 < len(workers[0].owned) < SHARDS

    await wait_until(split, "the two workers splitting the shards", timeout=15)
    sessions = [f"many{n}" for n in range(40)]
    assert len({shard_of(make_message("x", conversation=s).session_key) for s in sessions}) > 30
    for i in range(3):
        for s in sessions:
            await ingestor.ingest(make_message(f"{s}-{i}", conversation=s))

    async def answered() -> bool:  # and released (a drain stopped between its reply and release hands over)
        replied = sum(len(t) for t in _replies(out1, out2).values()) == 3 * len(sessions)
        return replied and not await count_of(client, lambda s: s.runnable)

    try:
        await wait_until(answered, "every message answered", timeout=30)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    replies = _replies(out1, out2)
    assert replies == {s: [f"echo: {s}-{i}" for i in range(3)] for s in sessions}  # in order, each once
    assert _replies(out1) and _replies(out2)  # both consumed


async def test_a_joining_worker_takes_its_shards_and_both_consume(
    redis_url: str, client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings
) -> None:
    out1, out2 = RecordingDeliverer(), RecordingDeliverer()
    stop = asyncio.Event()
    first = _worker(redis_url, queue_settings, out1, "w1")
    tasks = [asyncio.create_task(first.run(stop))]

    async def all_shards() -> bool:
        return len(first.owned) == SHARDS

    await wait_until(all_shards, "the only worker consuming every shard", timeout=15)
    joining = _worker(redis_url, queue_settings, out2, "w2")
    tasks.append(asyncio.create_task(joining.run(stop)))

    async def rebalanced() -> bool:
        return first.owned == owned_shards("w1", ["w1", "w2"]) and joining.owned == owned_shards("w2", ["w1", "w2"])

    await wait_until(rebalanced, "the newcomer taking its shards (rendezvous)", timeout=15)
    assert not first.owned & joining.owned
    one = conversation_in_shard(min(first.owned), "join")
    two = conversation_in_shard(min(joining.owned), "join")
    for conversation in (one, two):
        await ingestor.ingest(make_message(f"hello {conversation}", conversation=conversation))

    async def answered() -> bool:
        return sum(len(t) for t in _replies(out1, out2).values()) == 2

    try:
        await wait_until(answered, "both answered", timeout=15)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert _replies(out1) == {one: [f"echo: hello {one}"]} and _replies(out2) == {two: [f"echo: hello {two}"]}


async def test_a_dead_workers_shards_and_running_drain_are_taken_over(
    redis_url: str, client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings
) -> None:
    """A SIGKILLed worker stays in the live list until its liveness key expires; then its shards are reassigned and
    the drain it was running (its lease and running entry) is pushed back at the head of its shard's queue."""
    settings = queue_settings.model_copy(update={"lease_ms": 60_000, "reaper_interval_s": 60.0})
    await client.zadd(_GLOBAL.workers, {"ghost": time.time() * 1000})  # heartbeated, then killed: no liveness key
    ghost_shards = sorted(owned_shards("ghost", ["ghost", "rescuer"]))
    running = make_message("was running", conversation=conversation_in_shard(ghost_shards[0], "dead"))
    waiting = make_message("was waiting", conversation=conversation_in_shard(ghost_shards[1], "dead"))
    await ingestor.ingest(running)
    await ingestor.ingest(waiting)
    job, _ = await DrainJobs().take(client, ghost_shards[0])  # the ghost took this drain ...
    assert job is not None and job.session == running.session_key
    assert await Lease(client, worker_id="ghost", lease_ms=60_000).acquire(running.session_key)  # ... and its lease

    out = RecordingDeliverer()
    stop = asyncio.Event()
    rescuer = _worker(redis_url, settings, out, "rescuer")
    task = asyncio.create_task(rescuer.run(stop))

    async def answered() -> bool:
        return sorted(out.texts()) == ["echo: was running", "echo: was waiting"]

    try:
        await wait_until(answered, "the dead worker's sessions answered", timeout=20)  # not the 60 s lease or sweep
    finally:
        stop.set()
        await task
    assert rescuer.owned == frozenset(range(SHARDS))
    assert await client.zscore(SessionKeys(running.session_key).shard.wip, job.entry) is None


async def test_a_lost_wake_up_is_covered_by_the_safety_pass(
    redis_url: str, client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings
) -> None:
    settings = queue_settings.model_copy(update={"reaper_interval_s": 20.0})  # no repair: the safety pass alone
    out = RecordingDeliverer()
    stop = asyncio.Event()
    worker = _worker(redis_url, settings, out, "w1")
    heard: Counter[int] = Counter()
    worker._woken = lambda shard: heard.update([shard])  # type: ignore[method-assign]  # deaf: every wake-up lost
    task = asyncio.create_task(worker.run(stop))

    async def listening() -> bool:
        return len(worker.owned) == SHARDS

    await wait_until(listening, "the worker listening", timeout=15)
    await asyncio.sleep(0.3)  # its start-up safety pass is over
    sessions = [f"deaf{n}" for n in range(5)]
    for s in sessions:
        await ingestor.ingest(make_message(f"{s}-0", conversation=s))
        await ingestor.ingest(make_message(f"{s}-1", conversation=s))

    async def answered() -> bool:
        return sum(len(t) for t in _replies(out).values()) == 2 * len(sessions)

    try:
        await wait_until(answered, "every message answered without a wake-up", timeout=15)
    finally:
        stop.set()
        await task
    assert heard and _replies(out) == {s: [f"echo: {s}-0", f"echo: {s}-1"] for s in sessions}
    for s in sessions:
        assert not await client.llen(SessionKeys(make_message("x", conversation=s).session_key).shard.drainq)
