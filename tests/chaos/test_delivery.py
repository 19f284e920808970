"""Invariant 4 (platform retries are dropped) and poison messages (reliability R10), with real worker processes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web

from switchboard.channels.telegram.fake.platform import FakeTelegram
from switchboard.queue.keys import SessionKeys
from tests.shardindexes import entries_of
from tests.waiting import wait_until

from .checker import check, message_text
from .harness import BOT_TOKEN, Gateway, WorkerPool, chaos_env, chat_of, collect, event_log, key_of, replies

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]

POISON = "poison-pill"
MAX_ATTEMPTS = 3
NEXT_MESSAGE_BOUND_S = 10.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def poison_fake() -> AsyncIterator[FakeTelegram]:
    """The fake Bot API, refusing the poison (see :func:`_refuse_poison`)."""
    server = FakeTelegram(token=BOT_TOKEN)
    _refuse_poison(server)
    await server.start()
    yield server
    await server.stop()


def _refuse_poison(fake: FakeTelegram) -> None:
    """Make a fake Bot API (not started yet) answer 400 to every ``sendMessage`` whose text contains :data:`POISON`.

    The offline model repeats the user's text, so a message containing it can never be answered: its run fails
    at the send, every time, the way a reply Telegram keeps refusing does. Other messages are untouched.
    """

    @web.middleware
    async def refuse(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)  # the fake records the call before returning; nothing runs in between
        call = fake.calls[-1] if fake.calls else None
        if call is not None and call.method == "sendMessage" and POISON in str(call.params.get("text", "")):
            call.status = 400
            body = {"ok": False, "error_code": 400, "description": "Bad Request: chat not found"}
            return web.json_response(body, status=400)
        return response

    fake.app.middlewares.append(refuse)


async def test_the_same_delivery_twice_is_answered_once(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
    gateways: Callable[[dict[str, str]], Gateway],
) -> None:
    env = chaos_env(base_env, fake.base_url)
    gateway = gateways(env)
    await gateway.start()
    pool = pools(env, 2)
    await pool.ready()
    # session 0: the same update four times at once, then once more later; session 1: the same, one by one
    together = await asyncio.gather(*(gateway.send(0, 0) for _ in range(4)))
    one_by_one = [await gateway.send(1, 0) for _ in range(3)]
    # a sentinel behind each: FIFO means a second copy, had it been queued, would be answered before it
    await gateway.send(0, 1)
    await gateway.send(1, 1)
    await wait_until(lambda: len(replies(fake)) >= 4, timeout=30, what="replies to the sentinels")
    await gateway.send(0, 0)  # a platform retry after the reply went out
    await gateway.send(0, 2)
    await wait_until(lambda: len(replies(fake)) >= 5, timeout=30, what="the last sentinel's reply")
    history = await collect(async_redis, range(2), fake, gateway.posted, pool.signals)
    report = check(history)
    print("\n[dedup] " + report.summary())
    assert all(p.status == 200 for p in [*together, *one_by_one]), gateway.posted
    assert report.answered == 5 and not report.duplicates and not report.inversions, report.summary()
    assert [r.text for r in replies(fake)].count(next(r.text for r in replies(fake) if "s0-m0" in r.text)) == 1
    assert report.counters["accepted"] == 5 and report.counters["deduplicated"] == 6, report.summary()
    received = await event_log(async_redis, 0)
    assert sum(1 for e in received if e["kind"] == "message_received") == 3


async def test_a_reply_the_platform_refuses_is_dead_lettered_without_rerunning_the_model(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    poison_fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
    gateways: Callable[[dict[str, str]], Gateway],
    record_property: Callable[[str, Any], None],
) -> None:
    """A permanent refusal of the reply dead-letters the *send*: one model run, one refused call, the turn completed.

    (It used to re-run the model ``max_attempts`` times, metering usage each time, before dead-lettering the message.)
    """
    fake = poison_fake
    env = chaos_env(base_env, fake.base_url, QUEUE__MAX_ATTEMPTS=str(MAX_ATTEMPTS))
    gateway = gateways(env)
    await gateway.start()
    pool = pools(env, 2)
    await pool.ready()
    poisoned = await gateway.send(0, 0, text=f"{message_text(0, 0)} {POISON}")
    sent_next = time.time()
    following = await gateway.send(0, 1)
    assert poisoned.status == 200 and following.status == 200

    def next_answered() -> bool:
        return any(message_text(0, 1) in r.text for r in replies(fake))

    waited = await wait_until(next_answered, timeout=30, interval=0.05, what="the message after the poison")
    answered_at = next(r.at for r in replies(fake) if message_text(0, 1) in r.text)
    keys = SessionKeys(key_of(0))
    events = await event_log(async_redis, 0)
    kinds = [e["kind"] for e in events]
    operators: Any = await entries_of(async_redis)
    history = await collect(async_redis, range(1), fake, gateway.posted, pool.signals)
    report = check(history)
    refused = [c for c in fake.calls if c.method == "sendMessage" and c.status == 400]
    notices = [r.text for r in replies(fake) if r.chat_id == chat_of(0) and "s0-m" not in r.text]
    undelivered = [e for e in events if e["kind"] == "send_dead_lettered"]
    print(
        f"\n[refused reply] send dead-lettered after {undelivered[0]['attempts'] if undelivered else '?'} attempt(s) "
        f"(reason: {undelivered[0]['reason'] if undelivered else '?'}); model runs: {kinds.count('usage_metered')} "
        f"for 2 messages; next message answered {answered_at - sent_next:.2f}s after it was sent\n" + report.summary()
    )
    record_property("refused_reply_next_message_s", round(answered_at - sent_next, 3))
    assert len(undelivered) == 1 and undelivered[0]["attempts"] == 1, undelivered
    assert "telegram refused" in undelivered[0]["reason"] and "chat not found" in undelivered[0]["reason"].lower()
    first_run = next(e["message_id"] for e in events if e["kind"] == "run_started")
    assert undelivered[0]["message_id"] == first_run  # the poison's reply, not the next one's
    assert kinds.count("run_started") == 2 and kinds.count("run_completed") == 2, kinds
    assert kinds.count("usage_metered") == 2 and "run_failed" not in kinds and "run_dead_lettered" not in kinds
    assert len(refused) == 1, [c.params for c in refused]  # neither the model nor a refused send is re-run
    assert len(notices) == 1 and "could not be delivered" in notices[0], notices
    assert await async_redis.llen(keys.dead) == 0 and len(operators) == 0
    assert answered_at - sent_next <= NEXT_MESSAGE_BOUND_S and waited <= NEXT_MESSAGE_BOUND_S
    # the poison has no reply (refused) and no message dead letter: its send dead letter accounts for it
    assert report.answered == 1 and report.lost == [(0, 0)] and not report.duplicates, report.summary()
    assert await async_redis.llen(keys.inbox) == 0
