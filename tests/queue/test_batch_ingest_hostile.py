"""Hostile checks of ``Ingestor.ingest_all`` on real Redis: one delivery sent in one write must end in the same
Redis state as the same messages sent one by one through ``Ingestor.ingest`` (order, dedup, drops, stops)."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.errors import QueueUnavailableError
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys, ShardKeys
from switchboard.settings import LimitsSettings, QueueSettings
from switchboard.types import BusyPolicy
from tests.shardindexes import stats_sync

Delivery = list[tuple[InboundMessage, BusyPolicy]]


def _limits(session: int = 0, sender: int = 0, depth: int = 0) -> LimitsSettings:
    return LimitsSettings(
        sessions_per_address_per_hour=0,
        messages_per_session_per_minute=session,
        messages_per_sender_per_minute=sender,
        inbox_depth=depth,
        streams_per_session=0,
        streams_per_address=0,
    )


def _ingestor(r: aioredis.Redis, limits: LimitsSettings | None = None, timeout: float = 0.5) -> Ingestor:
    return Ingestor(r, QueueSettings(ingest_timeout_s=timeout), limits)


def _msg(conv: str, dedup: str, sender: str = "u1", text: str = "hi") -> InboundMessage:
    return InboundMessage(
        dedup_key=dedup,
        conversation=ConversationRef(agent="a", channel="telegram", account="default", conversation=conv),
        sender=Sender(id=sender),
        text=text,
    )


def _keys(conv: str) -> SessionKeys:
    return SessionKeys(_msg(conv, "x").session_key)


def _state(r: Any, convs: Sequence[str]) -> dict[str, Any]:
    """What a delivery left in Redis, independent of message ids and timing."""
    state: dict[str, Any] = {}
    for conv in convs:
        keys = _keys(conv)
        records = {k.decode(): json.loads(v) for k, v in r.hgetall(keys.messages).items()}
        inbox = [records[i.decode()]["dedup_key"] for i in r.lrange(keys.inbox, 0, -1)]
        events = [(e[b"kind"].decode(), json.loads(e[b"data"]).get("reason")) for _id, e in r.xrange(keys.events)]
        dedups = sorted(k.decode().rsplit(":", 1)[-1] for k in r.scan_iter(keys.dedup("*")))
        state[conv] = {"inbox": inbox, "events": events, "dedup": dedups, "cancel": bool(r.exists(keys.cancel))}
    stats = {k.decode(): int(v) for k, v in stats_sync(r).items()}
    state["stats"] = {k: stats.get(k, 0) for k in ("accepted", "messages_dropped", "deduplicated")}
    return state


def _summary(results: Sequence[Any]) -> list[tuple[bool, Any]]:
    return [(x.duplicate, x.limited) for x in results]


async def _compare(
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
    delivery: Delivery,
    convs: Sequence[str],
    limits: LimitsSettings | None = None,
    setup: Any = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``delivery`` one by one, then (on a flushed database) in one write; return both states."""
    states, summaries = [], []
    for batched in (False, True):
        sync_redis.flushall()
        ingestor = _ingestor(async_redis, limits)
        if setup is not None:
            await setup(ingestor)
        if batched:
            results = await ingestor.ingest_all(delivery)
        else:
            results = [await ingestor.ingest(m, busy_policy=p) for m, p in delivery]
        summaries.append(_summary(results))
        states.append(_state(sync_redis, convs))
    assert summaries[1] == summaries[0]
    assert states[1] == states[0]
    return states[0], states[1]


async def test_mixed_sessions_with_a_failure_in_the_middle_then_a_retry_stores_each_once_in_order(
    async_redis: aioredis.Redis, sync_redis: redis.Redis
) -> None:
    order = [("A", "a1"), ("B", "b1"), ("A", "a2"), ("A", "a3"), ("B", "b2"), ("A", "a4"), ("B", "b3")]
    delivery: Delivery = [(_msg(c, d), "sequential") for c, d in order]
    sync_redis.hset(_keys("A").dedup("a2"), "not", "a string")
    ingestor = _ingestor(async_redis)
    with pytest.raises(QueueUnavailableError):
        await ingestor.ingest_all(delivery)
    await asyncio.sleep(0.1)
    state = _state(sync_redis, ["A", "B"])
    assert state["A"]["inbox"] == ["a1"]  # nothing of A after the failed a2
    assert state["B"]["inbox"] in (["b1"], ["b1", "b2"], ["b1", "b2", "b3"])  # a prefix of B, in order
    sync_redis.delete(_keys("A").dedup("a2"))
    results = await ingestor.ingest_all(delivery)
    assert [r.duplicate for r in results] == [d in ("a1", *state["B"]["inbox"]) for _c, d in order]
    state = _state(sync_redis, ["A", "B"])
    assert state["A"]["inbox"] == ["a1", "a2", "a3", "a4"]
    assert state["B"]["inbox"] == ["b1", "b2", "b3"]


async def test_a_failure_on_the_first_of_a_long_same_session_run_writes_none_of_the_run(
    async_redis: aioredis.Redis, sync_redis: redis.Redis
) -> None:
    delivery: Delivery = [(_msg("A", f"a{i}"), "sequential") for i in range(20)]
    sync_redis.hset(_keys("A").dedup("a0"), "x", "y")
    with pytest.raises(QueueUnavailableError):
        await _ingestor(async_redis).ingest_all(delivery)
    await asyncio.sleep(0.1)
    assert sync_redis.llen(_keys("A").inbox) == 0
    assert _state(sync_redis, ["A"])["A"]["dedup"] == ["a0"]  # only the injected fault


async def test_duplicates_inside_one_delivery_are_answered_as_one_by_one(
    async_redis: aioredis.Redis, sync_redis: redis.Redis
) -> None:
    order = [("A", "d1"), ("A", "d1"), ("B", "d1"), ("A", "d2"), ("A", "d1"), ("B", "d1"), ("A", "d3")]
    delivery: Delivery = [(_msg(c, d), "sequential") for c, d in order]
    _seq, batch = await _compare(async_redis, sync_redis, delivery, ["A", "B"])
    assert batch["A"]["inbox"] == ["d1", "d2", "d3"]
    assert batch["stats"]["deduplicated"] == 3


async def test_a_predecessor_that_is_a_duplicate_from_an_earlier_delivery_lets_the_rest_in(
    async_redis: aioredis.Redis, sync_redis: redis.Redis
) -> None:
    delivery: Delivery = [(_msg("A", d), "sequential") for d in ("old", "n1", "old", "n2")]

    async def earlier(ingestor: Ingestor) -> None:
        await ingestor.ingest(_msg("A", "old"))

    _seq, batch = await _compare(async_redis, sync_redis, delivery, ["A"], setup=earlier)
    assert batch["A"]["inbox"] == ["old", "n1", "n2"]


@pytest.mark.parametrize(
    "limits",
    [_limits(depth=3), _limits(session=2), _limits(session=3, depth=2), _limits(depth=1)],
    ids=["depth3", "session2", "session3-depth2", "depth1"],
)
async def test_limits_with_long_same_session_runs_match_one_by_one(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, limits: LimitsSettings
) -> None:
    order = ["A"] * 6 + ["B", "A", "A", "B", "B", "B", "A"]
    delivery: Delivery = [(_msg(c, f"{c}{i}"), "sequential") for i, c in enumerate(order)]
    _seq, batch = await _compare(async_redis, sync_redis, delivery, ["A", "B"], limits)
    assert batch["stats"]["messages_dropped"] > 0


async def test_a_sender_limit_shared_across_sessions_matches_one_by_one(
    async_redis: aioredis.Redis, sync_redis: redis.Redis
) -> None:
    """X is over its limit: A1 (X) is refused; A2 (Y) lands one by one and Y's budget is spent, so B1 (Y) is refused.
    In one write A2 waits for A1 (refused, so A2 is sent again later): B1 must not take Y's budget before it."""
    delivery: Delivery = [
        (_msg("A", "a1", sender="X"), "sequential"),
        (_msg("A", "a2", sender="Y"), "sequential"),
        (_msg("B", "b1", sender="Y"), "sequential"),
    ]

    async def spend_x(ingestor: Ingestor) -> None:
        await ingestor.ingest(_msg("C", "c0", sender="X"))

    seq, _batch = await _compare(async_redis, sync_redis, delivery, ["A", "B"], _limits(sender=1), spend_x)
    assert seq["A"]["inbox"] == ["a2"] and seq["B"]["inbox"] == []


async def test_noscript_before_a_multi_message_delivery(async_redis: aioredis.Redis, sync_redis: redis.Redis) -> None:
    order = ["A", "B", "A", "A", "B", "A"]
    delivery: Delivery = [(_msg(c, f"{c}{i}"), "sequential") for i, c in enumerate(order)]

    async def flush(ingestor: Ingestor) -> None:
        await ingestor.ingest(_msg("Z", "warm"))  # the script is loaded, then lost
        await async_redis.script_flush()

    _seq, batch = await _compare(async_redis, sync_redis, delivery, ["A", "B"], _limits(depth=3), flush)
    assert batch["A"]["inbox"] == ["A0", "A2", "A3"]


async def test_writes_paused_mid_delivery_then_retried_store_each_once_in_order(
    async_redis: aioredis.Redis, sync_redis: redis.Redis
) -> None:
    order = ["A", "B", "A", "A", "B", "A", "A"]
    delivery: Delivery = [(_msg(c, f"{c}{i}"), "sequential") for i, c in enumerate(order)]
    ingestor = _ingestor(async_redis, timeout=0.2)
    sync_redis.execute_command("CLIENT", "PAUSE", 600, "WRITE")  # type: ignore[no-untyped-call]
    with pytest.raises(QueueUnavailableError):
        await ingestor.ingest_all(delivery)
    await asyncio.sleep(0.8)
    results = await _ingestor(async_redis).ingest_all(delivery)
    state = _state(sync_redis, ["A", "B"])
    assert state["A"]["inbox"] == ["A0", "A2", "A3", "A5", "A6"]
    assert state["B"]["inbox"] == ["B1", "B4"]
    assert state["stats"]["accepted"] == 7
    assert len(results) == 7


async def test_two_hundred_messages_of_three_sessions_keep_each_sessions_order(
    async_redis: aioredis.Redis, sync_redis: redis.Redis
) -> None:
    order = [("ABC"[(i * 7 + i // 3) % 3]) for i in range(200)]
    delivery: Delivery = [(_msg(c, f"{c}{i}"), "collect") for i, c in enumerate(order)]
    _seq, batch = await _compare(async_redis, sync_redis, delivery, ["A", "B", "C"], _limits(session=40, depth=50))
    for conv in "ABC":
        assert (
            batch[conv]["inbox"] == [f"{c}{i}" for i, c in enumerate(order) if c == conv][: len(batch[conv]["inbox"])]
        )


async def _stops_published(
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
    delivery: Delivery,
    limits: LimitsSettings,
    prepare: Callable[[Ingestor], Awaitable[object]] | None = None,
    convs: Sequence[str] = ("A",),
) -> list[tuple[int, list[tuple[bool, Any]], dict[str, Any]]]:
    """One by one, then in one write, each on a flushed Redis after ``prepare``: the stops published on the cancel
    channel, the results' summary and the state of ``convs``."""
    runs = []
    for batched in (False, True):
        sync_redis.flushall()
        ingestor = _ingestor(async_redis, limits)
        if prepare is not None:
            await prepare(ingestor)
        pubsub = async_redis.pubsub()
        channels = [shard.cancel for shard in ShardKeys.every()]
        await pubsub.ssubscribe(*channels)
        confirmed = 0
        while confirmed < len(channels):  # every shard's cancel channel subscribed before the delivery
            message = await pubsub.get_message(timeout=1.0)
            assert message is not None
            confirmed += message["type"] == "ssubscribe"
        if batched:
            results = await ingestor.ingest_all(delivery)
        else:
            results = [await ingestor.ingest(m, busy_policy=p) for m, p in delivery]
        heard = 0
        while (message := await pubsub.get_message(timeout=0.3)) is not None:
            heard += message["type"] == "smessage"
        runs.append((heard, _summary(results), _state(sync_redis, convs)))
        await pubsub.aclose()  # type: ignore[no-untyped-call]
    return runs


async def test_a_stop_inside_a_same_session_run_is_requested_once_before_the_rest(
    async_redis: aioredis.Redis, sync_redis: redis.Redis
) -> None:
    """A /stop right after a message refused by the inbox depth is sent again on its own: one stop, one publish."""
    texts = ["one", "two", "/stop", "three", "four"]
    delivery: Delivery = [(_msg("A", f"s{i}", text=t), "sequential") for i, t in enumerate(texts)]
    one_by_one, batch = await _stops_published(async_redis, sync_redis, delivery, _limits(depth=1))
    assert (batch[0], batch[2]) == (one_by_one[0], one_by_one[2])


async def test_a_stop_after_a_refused_message_is_requested_once(
    async_redis: aioredis.Redis, sync_redis: redis.Redis
) -> None:
    """s0 lands, s1 is refused (depth 1), the /stop (s2) guarded by s1 comes back as status 4 and is sent on its own:
    its stop must be requested once, as one by one (a /stop gets in although the inbox is full? it is refused too)."""
    delivery: Delivery = [(_msg("A", "s0"), "sequential"), (_msg("A", "s1"), "sequential")]
    delivery.append((_msg("A", "s2", text="/stop"), "sequential"))

    async def one_slot_left(_ingestor: Ingestor) -> object:  # s0 lands, s1 is refused, s2 too
        return sync_redis.rpush(_keys("A").inbox, "pre")

    one_by_one, batch = await _stops_published(
        async_redis,
        sync_redis,
        delivery,
        _limits(depth=2),
        one_slot_left,
        convs=(),  # its inbox holds a stand-in
    )
    assert batch[:2] == one_by_one[:2]


async def test_a_stop_after_a_refused_message_that_lands_on_its_own_publishes_once(
    async_redis: aioredis.Redis, sync_redis: redis.Redis
) -> None:
    """s1 (sender X, over its limit) is refused; the /stop from Y after it is sent again on its own and lands:
    one by one its stop is requested once, so one publish."""
    delivery: Delivery = [
        (_msg("A", "s1", sender="X"), "sequential"),
        (_msg("A", "s2", sender="Y", text="/stop"), "sequential"),
    ]

    async def x_used_its_one(ingestor: Ingestor) -> object:
        return await ingestor.ingest(_msg("C", "c0", sender="X"))

    one_by_one, batch = await _stops_published(async_redis, sync_redis, delivery, _limits(sender=1), x_used_its_one)
    assert batch[:2] == one_by_one[:2] == (1, [(False, "sender_rate"), (False, None)])


@pytest.mark.parametrize("policy", ["interrupt", "steer", "collect"])
async def test_busy_policies_on_a_running_session_match_one_by_one(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, policy: BusyPolicy
) -> None:
    order = ["A", "A", "B", "A", "B", "A"]
    delivery: Delivery = [(_msg(c, f"{c}{i}"), policy) for i, c in enumerate(order)]

    async def running(_ingestor: Ingestor) -> None:
        sync_redis.hset(_keys("A").meta, "status", "running")

    _seq, batch = await _compare(async_redis, sync_redis, delivery, ["A", "B"], _limits(depth=3), running)
    assert batch["A"]["cancel"] is (policy == "interrupt")
    assert sync_redis.hget(_keys("A").meta, "busy_policy") == policy.encode()


@pytest.mark.parametrize("seed", range(12))
async def test_random_deliveries_with_every_limit_match_one_by_one(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, seed: int
) -> None:
    """Sessions, senders, duplicates and /stops mixed at random, under tight session, sender and depth limits."""
    rng = random.Random(seed)
    delivery: Delivery = []
    for i in range(rng.randint(5, 30)):
        conv, sender = rng.choice("ABC"), rng.choice("XYZ")
        dedup = f"d{rng.randint(0, i)}" if rng.random() < 0.2 else f"n{i}"
        text = "/stop" if rng.random() < 0.1 else "hi"
        delivery.append((_msg(conv, dedup, sender=sender, text=text), "sequential"))
    limits = _limits(session=rng.randint(0, 4), sender=rng.randint(1, 4), depth=rng.randint(0, 5))

    async def spend(ingestor: Ingestor) -> None:
        await ingestor.ingest(_msg("Q", "q0", sender="X"))

    await _compare(async_redis, sync_redis, delivery, ["A", "B", "C"], limits, spend)
