from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
import redis.asyncio as aioredis

from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.errors import ConfigError
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys, ShardKeys
from switchboard.queue.reaper import live_workers
from switchboard.settings import QueueSettings
from switchboard.worker.worker import SessionWorker
from tests.shardindexes import count_of
from tests.waiting import wait_until

from .conftest import RecordingDeliverer, echo_runner, make_drainer, make_message


def _worker(
    redis_url: str, client: aioredis.Redis, settings: QueueSettings, deliverer, runner=echo_runner, wid="w1", **kw
):  # type: ignore[no-untyped-def]
    return SessionWorker(
        redis_url,
        settings,
        drainer_factory=lambda redis, worker_id: make_drainer(redis, settings, deliverer, runner, worker_id),
        worker_id=wid,
        **kw,
    )


async def test_many_sessions_concurrently_in_one_worker(
    redis_url: str, client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings
) -> None:
    deliverer = RecordingDeliverer()
    running = 0
    peak = 0

    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return await echo_runner(request, sink, store)

    stop = asyncio.Event()
    worker = _worker(redis_url, client, queue_settings, deliverer, runner)
    task = asyncio.create_task(worker.run(stop))
    for i in range(3):
        for s in range(40):
            await ingestor.ingest(make_message(f"s{s}-m{i}", conversation=f"conv{s}"))

    async def all_answered() -> bool:
        return len(deliverer.texts()) == 120

    await wait_until(all_answered, "every message answered", timeout=30)
    assert await live_workers(client, 5.0) == 1
    stop.set()
    await task
    by_session: dict[str, list[str]] = defaultdict(list)
    for sent in deliverer.sent:
        if sent.action.kind == "text":
            by_session[sent.conversation.conversation].append(sent.action.text)  # type: ignore[union-attr]
    assert len(by_session) == 40
    for s, texts in by_session.items():
        n = s.removeprefix("conv")
        assert texts == [f"echo: s{n}-m{i}" for i in range(3)]  # FIFO per session, each once
    assert peak > 1  # sessions ran side by side
    async with client.pipeline(transaction=False) as pipe:
        for shard in ShardKeys.every():
            pipe.llen(shard.drainq).zcard(shard.wip)
        assert not any(await pipe.execute())  # every drain queue empty, no drain left running
    assert await count_of(client, lambda s: s.runnable) == 0
    assert await live_workers(client, 5.0) == 0  # deregistered on stop


async def test_worker_picks_up_a_stranded_session_through_the_reaper(
    redis_url: str, client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings
) -> None:
    msg = make_message("stranded")
    await ingestor.ingest(msg)
    await client.delete(SessionKeys(msg.session_key).shard.drainq)  # its drain entry vanished
    deliverer = RecordingDeliverer()
    stop = asyncio.Event()
    task = asyncio.create_task(_worker(redis_url, client, queue_settings, deliverer).run(stop))

    async def answered() -> bool:
        return deliverer.texts() == ["echo: stranded"]

    await wait_until(answered, "the answer", timeout=15)
    stop.set()
    await task


async def test_stopping_worker_hands_running_session_to_another(
    redis_url: str, client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings
) -> None:
    started = asyncio.Event()

    async def hangs(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        started.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    msg = make_message("long one")
    await ingestor.ingest(msg)
    first = RecordingDeliverer()
    stop_first = asyncio.Event()
    t1 = asyncio.create_task(
        _worker(redis_url, client, queue_settings, first, hangs, shutdown_grace_s=0.1).run(stop_first)
    )
    await started.wait()
    stop_first.set()
    await t1
    keys = SessionKeys(msg.session_key)
    assert await client.exists(keys.lease) == 0  # given up, not left to expire
    assert await client.hget(keys.attempts, (await client.lindex(keys.inbox, 0))) == b"0"  # attempt handed back

    second = RecordingDeliverer()
    stop_second = asyncio.Event()
    t2 = asyncio.create_task(_worker(redis_url, client, queue_settings, second, wid="w2").run(stop_second))

    async def answered() -> bool:
        return second.texts() == ["echo: long one"]

    await wait_until(answered, "the answer", timeout=15)
    stop_second.set()
    await t2


@pytest.mark.parametrize(
    ("settings", "kw", "field"),
    [
        (QueueSettings(name="a,b"), {}, "queue.name"),
        (QueueSettings(name="one two"), {}, "queue.name"),
        (QueueSettings(lease_ms=1000), {"heartbeat_s": 1.0}, "queue.lease_ms"),
        (QueueSettings(lease_ms=1000, reaper_interval_s=60), {}, "queue.reaper_interval_s"),
    ],
)
def test_check_config_refuses_a_bad_setup(settings: QueueSettings, kw: dict[str, float], field: str) -> None:
    worker = SessionWorker("redis://127.0.0.1:1/0", settings, drainer_factory=lambda r, w: None, **kw)  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigError) as err:
        worker.check_config()
    assert err.value.field == field


def test_check_config_accepts_the_defaults() -> None:
    SessionWorker("redis://127.0.0.1:1/0", QueueSettings(), drainer_factory=lambda r, w: None).check_config()  # type: ignore[arg-type,return-value]


async def test_messages_racing_with_release_are_never_stranded(
    redis_url: str, client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings
) -> None:
    """Trickle messages into a few sessions while a worker keeps draining them empty and releasing."""
    import random

    deliverer = RecordingDeliverer()
    stop = asyncio.Event()
    settings = queue_settings.model_copy(update={"reaper_interval_s": 20.0})  # no repair: release alone must hold
    task = asyncio.create_task(_worker(redis_url, client, settings, deliverer).run(stop))
    rng = random.Random(7)
    sent: dict[str, list[str]] = defaultdict(list)
    for i in range(150):
        conv = f"r{rng.randrange(3)}"
        await ingestor.ingest(make_message(f"{conv}-{i}", conversation=conv))
        sent[conv].append(f"echo: {conv}-{i}")
        await asyncio.sleep(rng.choice([0, 0, 0.001, 0.003]))

    async def all_answered() -> bool:
        return len(deliverer.texts()) == 150

    await wait_until(all_answered, "every message answered", timeout=30)
    stop.set()
    await task
    got: dict[str, list[str]] = defaultdict(list)
    for s in deliverer.sent:
        if s.action.kind == "text":
            got[s.conversation.conversation].append(s.action.text)  # type: ignore[union-attr]
    assert got == sent
    assert await count_of(client, lambda s: s.runnable) == 0
