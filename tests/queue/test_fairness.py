"""Fairness between sessions (and tenants): a busy session yields its worker slot between turns while others wait."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
import redis.asyncio as aioredis

from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.errors import FencedWriteError
from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.queue.jobs import DrainJobs, entry
from switchboard.queue.keys import SessionKeys, ShardKeys
from switchboard.queue.lease import Lease
from switchboard.queue.shards import shard_of
from switchboard.queue.stats import fenced_total
from switchboard.settings import QueueSettings
from switchboard.worker.drainturn import DrainOutcome
from switchboard.worker.worker import SessionWorker
from tests.shardindexes import count_of
from tests.waiting import wait_until

from .conftest import (
    RecordingDeliverer,
    conversation_in_shard,
    echo_runner,
    make_drainer,
    make_message,
    queued_entries,
)

FLOODS = 3
FLOOD_MESSAGES = 20
CONCURRENCY = 2


async def slow_runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
    await asyncio.sleep(0.05)
    return await echo_runner(request, sink, store)


def _tenant_message(text: str, *, tenant: str, conversation: str) -> InboundMessage:
    return InboundMessage(
        dedup_key=f"{tenant}-{text}",
        conversation=ConversationRef(tenant=tenant, agent="assistant", channel="telegram", conversation=conversation),
        sender=Sender(id="u2", name="Newcomer"),
        text=text,
    )


def _floods(shard: int | None) -> list[str]:
    """The flooding conversations: ``flood0``... (on different shards), or all on ``shard``."""
    if shard is None:
        return [f"flood{s}" for s in range(FLOODS)]
    return [conversation_in_shard(shard, f"flood{s}-") for s in range(FLOODS)]


async def _flood_then_newcomer(
    redis_url: str,
    client: aioredis.Redis,
    ingestor: Ingestor,
    settings: QueueSettings,
    newcomer: InboundMessage,
    floods: list[str] | None = None,
) -> tuple[list[tuple[str, str]], int]:
    """Flood ``FLOODS`` sessions, then ``newcomer`` once busy; returns (replies, how many came before it)."""
    floods = floods or _floods(None)
    settings = settings.model_copy(update={"concurrency": CONCURRENCY})
    deliverer = RecordingDeliverer()
    worker = SessionWorker(
        redis_url,
        settings,
        drainer_factory=lambda redis, wid: make_drainer(redis, settings, deliverer, slow_runner, wid),
        worker_id="w1",
    )
    for i in range(FLOOD_MESSAGES):
        for s in range(FLOODS):
            await ingestor.ingest(make_message(f"f{s}-{i}", conversation=floods[s]))
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))

    async def busy() -> bool:
        return len(deliverer.texts()) >= 2 * CONCURRENCY

    await wait_until(busy, "the busy session running", timeout=20)
    await ingestor.ingest(newcomer)
    at_ingest = len(deliverer.texts())

    async def all_answered() -> bool:  # and released (a drain stopped between its reply and release hands over)
        return len(deliverer.texts()) == FLOODS * FLOOD_MESSAGES + 1 and not await count_of(
            client, lambda s: s.runnable
        )

    await wait_until(all_answered, "every session answered", timeout=60)
    stop.set()
    await task
    replies = [(s.conversation.conversation, s.action.text) for s in deliverer.sent if s.action.kind == "text"]  # type: ignore[union-attr]
    return replies, at_ingest


def _check_fair(replies: list[tuple[str, str]], at_ingest: int, newcomer: str, floods: list[str] | None = None) -> None:
    floods = floods or _floods(None)
    position = [i for i, (conv, _) in enumerate(replies) if conv == newcomer]
    assert len(position) == 1
    by_session: dict[str, list[str]] = defaultdict(list)
    last: dict[str, int] = {}
    for i, (conv, text) in enumerate(replies):
        by_session[conv].append(text)
        last[conv] = i
    for s in range(FLOODS):  # FIFO per session, each message once, despite the yields
        assert by_session[floods[s]] == [f"echo: f{s}-{i}" for i in range(FLOOD_MESSAGES)]
    # answered before every flooding session finished; today's worker keeps a slot until the inbox is empty, so
    # the newcomer would wait for whole floods (dozens of replies)
    assert all(position[0] < last[floods[s]] for s in range(FLOODS)), replies
    # only the turns already running or queued ahead of it come first: at most a round over the slots and the
    # one flooding session that was waiting
    ahead = position[0] - at_ingest
    assert ahead <= CONCURRENCY + 2, replies


async def test_newcomer_is_answered_while_busy_sessions_flood(
    redis_url: str, client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings
) -> None:
    """The floods and the newcomer on four different shards: the worker serves its shards with work in turn."""
    newcomer = make_message("hello", conversation="newcomer")
    shards = {shard_of(make_message("x", conversation=c).session_key) for c in [*_floods(None), "newcomer"]}
    assert len(shards) == FLOODS + 1
    replies, at_ingest = await _flood_then_newcomer(redis_url, client, ingestor, queue_settings, newcomer)
    _check_fair(replies, at_ingest, "newcomer")
    async with client.pipeline(transaction=False) as pipe:
        for shard in ShardKeys.every():
            pipe.llen(shard.drainq).zcard(shard.wip)
        assert not any(await pipe.execute())
    assert await count_of(client, lambda s: s.runnable) == 0


async def test_newcomer_is_answered_while_sessions_of_its_own_shard_flood(
    redis_url: str, client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings
) -> None:
    """Within one shard: its queue's order, a yielding drain at the back."""
    newcomer_conversation = conversation_in_shard(7, "newcomer")
    floods = _floods(7)
    newcomer = make_message("hello", conversation=newcomer_conversation)
    replies, at_ingest = await _flood_then_newcomer(redis_url, client, ingestor, queue_settings, newcomer, floods)
    _check_fair(replies, at_ingest, newcomer_conversation, floods)


async def test_one_tenant_cannot_starve_another(
    redis_url: str, client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings
) -> None:
    newcomer = _tenant_message("hi", tenant="other", conversation="newcomer")
    replies, at_ingest = await _flood_then_newcomer(redis_url, client, ingestor, queue_settings, newcomer)
    _check_fair(replies, at_ingest, "newcomer")


async def test_fair_turns_zero_keeps_the_slot_until_the_inbox_is_empty(
    redis_url: str, client: aioredis.Redis, ingestor: Ingestor, queue_settings: QueueSettings
) -> None:
    """The opt-out (and today's behaviour, the benchmark's baseline): the newcomer waits for whole floods."""
    settings = queue_settings.model_copy(update={"fair_turns": 0})
    newcomer = make_message("hello", conversation="newcomer")
    replies, _ = await _flood_then_newcomer(redis_url, client, ingestor, settings, newcomer)
    position = next(i for i, (conv, _) in enumerate(replies) if conv == "newcomer")
    finished = [s for s in range(FLOODS) if [c for c, _ in replies[:position]].count(f"flood{s}") == FLOOD_MESSAGES]
    assert len(finished) >= CONCURRENCY


async def test_yield_frees_the_slot_and_requeues_the_session_at_the_back(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    b_conversation = conversation_in_shard(shard_of(make_message("x", conversation="a").session_key), "b")
    ids = [(await ingestor.ingest(make_message(f"a{i}", conversation="a"))).message_id for i in range(3)]
    await ingestor.ingest(make_message("b0", conversation=b_conversation))
    a = make_message("x", conversation="a").session_key
    b = make_message("x", conversation=b_conversation).session_key
    keys = SessionKeys(a)
    first_job = (await client.get(keys.drain)).decode()
    await client.lpop(keys.shard.drainq)  # as a worker's take would: only b's drain waits in the shard now
    drainer = make_drainer(client, queue_settings, deliverer)
    drainer.slots_full = lambda: True

    assert await drainer.drain_session(a) is DrainOutcome.YIELDED
    assert deliverer.texts() == ["echo: a0"]  # one turn, then the slot went to the session waiting
    queued = await queued_entries(client, a)
    flag = (await client.get(keys.drain)).decode()
    assert queued[-1] == entry(a, flag) and flag != first_job and len(queued) == 2  # at the back, behind b's
    assert await client.exists(keys.lease) == 0
    assert [m.decode() for m in await client.lrange(keys.inbox, 0, -1)] == ids[1:]  # untouched, in order
    assert await client.zscore(SessionKeys(a).shard.runnable, a) is not None

    await client.delete(keys.shard.drainq)  # nobody waits any more: the drain keeps its slot to the end
    assert await drainer.drain_session(a) is DrainOutcome.RELEASED
    assert deliverer.texts() == ["echo: a0", "echo: a1", "echo: a2"]
    assert await drainer.drain_session(b) is DrainOutcome.RELEASED
    starts = [e for e in await read_events(client, a) if e["kind"] == "run_started"]
    assert starts[1]["epoch"] > starts[0]["epoch"]  # the yielded lease was given up, the next drain took a new one


async def test_a_drain_yields_to_other_shards_only_when_the_worker_says_they_wait(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    """Its own shard's queue empty, a drain keeps its slot unless drains of the worker's other shards wait."""
    for i in range(3):
        await ingestor.ingest(make_message(f"a{i}", conversation="a"))
    a = make_message("x", conversation="a").session_key
    keys = SessionKeys(a)
    await client.delete(keys.shard.drainq)
    drainer = make_drainer(client, queue_settings, deliverer)
    drainer.slots_full = lambda: True
    elsewhere: list[str] = []

    def waiting(session: str) -> bool:
        elsewhere.append(session)
        return len(elsewhere) > 1  # nothing waits elsewhere after the first turn; then something does

    drainer.waiting_elsewhere = waiting  # type: ignore[assignment]
    assert await drainer.drain_session(a) is DrainOutcome.YIELDED
    assert deliverer.texts() == ["echo: a0", "echo: a1"]
    assert await queued_entries(client, a) == [entry(a, (await client.get(keys.drain)).decode())]


async def test_yield_is_fenced(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    b_conversation = conversation_in_shard(shard_of(make_message("x", conversation="a").session_key), "b")
    await ingestor.ingest(make_message("a0", conversation="a"))
    await ingestor.ingest(make_message("b0", conversation=b_conversation))
    a = make_message("x", conversation="a").session_key
    keys = SessionKeys(a)
    lease = await Lease(client, worker_id="w1", lease_ms=10_000).acquire(a)
    assert lease is not None
    await client.delete(keys.lease)
    assert await Lease(client, worker_id="w2", lease_ms=10_000).acquire(a)  # another epoch holds it now
    flag = await client.get(keys.drain)
    with pytest.raises(FencedWriteError):
        await DrainJobs().yield_slot(client, lease)
    assert await client.get(keys.drain) == flag and len(await queued_entries(client, a)) == 2
    assert await fenced_total(client) == 1


async def test_a_turn_ending_its_share_yields_in_its_own_completion_and_closes_its_job(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    b_conversation = conversation_in_shard(shard_of(make_message("x", conversation="a").session_key), "b")
    for i in range(2):
        await ingestor.ingest(make_message(f"a{i}", conversation="a"))
    await ingestor.ingest(make_message("b0", conversation=b_conversation))
    a = make_message("x", conversation="a").session_key
    first_job = (await client.get(SessionKeys(a).drain)).decode()
    job, left = await DrainJobs().take(client, shard_of(a))  # as the worker does
    assert job is not None and job.session == a and job.job_id == first_job and left == 1
    drainer = make_drainer(client, queue_settings, deliverer)
    drainer.slots_full = lambda: True
    yields = (await client.info("commandstats")).get("cmdstat_evalsha", {}).get("calls", 0)

    assert await drainer.drain_session(a, job) is DrainOutcome.YIELDED
    assert deliverer.texts() == ["echo: a0"]
    assert await client.zscore(SessionKeys(a).shard.wip, job.entry) is None  # its entry closed in the same step
    flag = (await client.get(SessionKeys(a).drain)).decode()
    assert (await queued_entries(client, a))[-1] == entry(a, flag) and flag != first_job
    # the turn's steps: take (lease + begin), the reply's claim and sent record, and a completion that yielded
    assert (await client.info("commandstats"))["cmdstat_evalsha"]["calls"] - yields == 4
