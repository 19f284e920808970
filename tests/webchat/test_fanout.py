"""The process's one multiplexed web stream reader: fan-out, slow subscribers, reconnects, shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from switchboard.outbound.webstream import WebEvent
from switchboard.queue.connection import async_client
from switchboard.queue.keys import SessionKeys
from switchboard.types import SessionKey
from switchboard.web.webchat.fanout import StreamFanout, Subscription, SubscriptionClosedError

A = SessionKey("default/assistant/web/default/a")
B = SessionKey("default/assistant/web/default/b")
GUARD_S = 10.0
"""Upper bound on any wait: a guard against hanging, not a timing assertion."""


@pytest.fixture
async def fanout(redis_url: str) -> AsyncIterator[StreamFanout]:
    template = async_client(redis_url)
    running = StreamFanout(template, block_ms=30_000)  # longer than GUARD_S: only an unblock is in time
    running.start()
    yield running
    await running.aclose()
    await template.aclose()


async def _add(redis: aioredis.Redis, session: SessionKey, text: str) -> str:
    entry = await redis.xadd(SessionKeys(session).web, {"type": "delta", "data": f'{{"text":"{text}"}}'})
    return entry.decode()


async def _next(sub: Subscription) -> list[WebEvent]:
    async with asyncio.timeout(GUARD_S):
        while not (batch := await sub.next(GUARD_S)):
            pass
    return batch


async def test_every_subscriber_of_a_session_gets_its_events_and_only_those(
    fanout: StreamFanout, async_redis: aioredis.Redis
) -> None:
    first, second, other = fanout.subscribe(A, None)[0], fanout.subscribe(A, None)[0], fanout.subscribe(B, None)[0]
    entry = await _add(async_redis, A, "for A")
    for sub in (first, second):
        [event] = await _next(sub)
        assert (event.id, event.type, event.data) == (entry, "delta", {"text": "for A"})
    fanout.unsubscribe(first)
    await _add(async_redis, B, "for B")
    [event] = await _next(other)
    assert event.data == {"text": "for B"}
    assert await second.next(0) == []
    assert fanout.subscriptions == 2


async def test_a_session_added_while_the_reader_blocks_is_read_at_once(
    fanout: StreamFanout, async_redis: aioredis.Redis
) -> None:
    fanout.subscribe(A, None)
    await asyncio.sleep(0.1)  # the reader is now blocked on A alone (for up to its 10 s block time)
    late, _ = fanout.subscribe(B, None)
    await _add(async_redis, B, "hello")
    [event] = await _next(late)  # within the guard: the reader was unblocked, not left to time out
    assert event.data == {"text": "hello"}


async def test_a_subscriber_that_falls_behind_is_closed_not_buffered_forever() -> None:
    sub = Subscription(A, limit=2, closing=None)
    batches = [[WebEvent(f"{n}-0", "delta", {"text": str(n)})] for n in range(3)]
    for batch in batches:
        sub.deliver(batch)
    assert sub.reason == "overflow"
    assert [await sub.next(0), await sub.next(0)] == batches[:2]  # what was queued is still handed out
    with pytest.raises(SubscriptionClosedError):
        await sub.next(0)


async def test_the_reader_survives_a_lost_connection(fanout: StreamFanout, async_redis: aioredis.Redis) -> None:
    sub, _ = fanout.subscribe(A, None)
    await _add(async_redis, A, "before")
    await _next(sub)
    async with asyncio.timeout(GUARD_S):
        while not (readers := [c for c in await async_redis.client_list() if c.get("cmd") == "xread"]):
            await asyncio.sleep(0.02)
    await async_redis.client_kill_filter(_id=readers[0]["id"])
    entry = await _add(async_redis, A, "after")
    [event] = await _next(sub)
    assert event.id == entry  # nothing lost: the reader resumed from its cursor


async def test_shutdown_closes_current_and_later_subscriptions(fanout: StreamFanout) -> None:
    sub, _ = fanout.subscribe(A, None)
    fanout.shutdown()
    with pytest.raises(SubscriptionClosedError):
        await sub.next(GUARD_S)
    with pytest.raises(SubscriptionClosedError):
        await fanout.subscribe(B, None)[0].next(GUARD_S)


async def test_a_gone_client_is_swept(fanout: StreamFanout) -> None:
    gone = False
    sub, _ = fanout.subscribe(A, None, closing=lambda: gone)
    gone = True
    with pytest.raises(SubscriptionClosedError):
        async with asyncio.timeout(GUARD_S):
            while True:
                await sub.next(GUARD_S)
    assert sub.reason == "gone"
