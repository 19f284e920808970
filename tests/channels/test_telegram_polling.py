"""Telegram long polling against the fake Bot API: offsets move only after the router accepted, errors back off."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from switchboard.channels.base import Inbound, Listener
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.errors import QueueUnavailableError
from tests.channels.test_telegram import BOT, PAYLOADS, TOKEN, settings
from tests.fakes.telegram_api import FakeTelegram, make_update
from tests.waiting import wait_until


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        yield server


def poller(fake: FakeTelegram) -> tuple[TelegramChannel, Listener]:
    adapter = TelegramChannel(settings(fake.base_url, transport="polling"), poll_timeout=1, poll_backoff=(0.01, 0.05))
    listener = adapter.listener()
    assert listener is not None
    return adapter, listener


async def run_listener(listener: Listener, emit: Callable[[Inbound], Awaitable[None]]) -> asyncio.Task[None]:
    return asyncio.create_task(listener.listen(emit))


async def stop(task: asyncio.Task[None], adapter: TelegramChannel) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await adapter.aclose()


async def test_updates_are_emitted_in_order_and_confirmed_after(fake: FakeTelegram) -> None:
    fake.state.webhook = {"url": "https://old.example/webhooks/telegram"}  # polling deletes it first
    adapter, listener = poller(fake)
    emitted: list[tuple[str, int]] = []

    async def emit(inbound: Inbound) -> None:
        for message in inbound.messages:
            # when the router gets a message, Telegram has not been told to forget it
            emitted.append((message.dedup_key, fake.state.confirmed))

    ids = [fake.push_update(make_update(f"hello {n}", chat_id=501, update_id=5000 + n)) for n in range(3)]
    fake.push_update(make_update("group chatter", chat_id=-5, update_id=5003, chat_type="group"))
    fake.push_update({"update_id": 5004, "message": {"message_id": "not an int"}})  # unreadable: passed over
    fake.push_update(make_update("after", chat_id=501, update_id=5005))
    task = await run_listener(listener, emit)
    try:
        await wait_until(lambda: fake.state.confirmed == 5006, "every update confirmed")
    finally:
        await stop(task, adapter)
    assert [key for key, _ in emitted] == [str(i) for i in ids] + ["5005"]
    assert all(confirmed <= int(key) for key, confirmed in emitted)
    assert fake.calls[0].method == "deleteWebhook" and fake.state.webhook == {}
    assert fake.calls[1].params["allowed_updates"] == ["message", "edited_message", "callback_query"]
    assert fake.state.max_polls_in_flight == 1


async def test_an_update_the_router_did_not_accept_is_not_confirmed_and_comes_again(fake: FakeTelegram) -> None:
    adapter, listener = poller(fake)
    accepted: list[str] = []
    refusals = 2

    async def emit(inbound: Inbound) -> None:
        nonlocal refusals
        [message] = inbound.messages
        if message.dedup_key == "7001" and refusals:
            refusals -= 1
            raise QueueUnavailableError("redis did not confirm")
        accepted.append(message.dedup_key)

    fake.push_update(make_update("one", chat_id=501, update_id=7000))
    fake.push_update(make_update("two", chat_id=501, update_id=7001))
    fake.push_update(make_update("three", chat_id=501, update_id=7002))
    task = await run_listener(listener, emit)
    try:
        await wait_until(lambda: fake.state.confirmed == 7003, "every update confirmed")
    finally:
        await stop(task, adapter)
    assert accepted == ["7000", "7001", "7002"]  # 7001 came again until it was accepted; nothing was skipped
    polls = [o for c, o in zip(fake.calls, _offsets(fake), strict=True) if c.method == "getUpdates"]
    assert polls[:3] == [None, 7001, 7001]  # the failed update was asked for again, never passed over
    assert max(o or 0 for o in polls[:3]) <= 7001


def _offsets(fake: FakeTelegram) -> list[int | None]:
    return [c.params.get("offset") if c.method == "getUpdates" else None for c in fake.calls]


async def test_polling_backs_off_through_5xx_429_and_a_webhook_set_again(fake: FakeTelegram) -> None:
    adapter, listener = poller(fake)
    got: list[str] = []

    async def emit(inbound: Inbound) -> None:
        got.extend(m.text for m in inbound.messages)

    fake.refuse_next(2, status=502, description="Bad Gateway", method="getUpdates")
    fake.fail_next(1, retry_after=0.05, method="getUpdates")
    fake.push_update(make_update("through it all", chat_id=501, update_id=9000))
    task = await run_listener(listener, emit)
    try:
        await wait_until(lambda: got == ["through it all"], "the update after the failures")
        fake.state.webhook = {"url": "https://someone.example/hook"}  # an operator set a webhook meanwhile
        await wait_until(
            lambda: any(c.status == 409 for c in fake.calls), "getUpdates refused while the webhook is set"
        )
        fake.push_update(make_update("after the webhook", chat_id=501, update_id=9001))
        await wait_until(lambda: got == ["through it all", "after the webhook"], "polling deleted the webhook again")
    finally:
        await stop(task, adapter)
    statuses = [c.status for c in fake.calls if c.method == "getUpdates"]
    assert statuses[:3] == [502, 502, 429] and 409 in statuses
    assert [c.method for c in fake.calls].count("deleteWebhook") == 2


async def test_a_second_poller_conflicts_and_the_fake_notices(fake: FakeTelegram) -> None:
    """Two pollers for one bot is what the listener host prevents: Telegram (and the fake) answer 409."""
    first, one = poller(fake)
    second, two = poller(fake)

    async def emit(inbound: Inbound) -> None:
        return None

    tasks = [await run_listener(one, emit), await run_listener(two, emit)]
    try:
        await wait_until(lambda: any(c.status == 409 for c in fake.calls), "a conflict")
    finally:
        await stop(tasks[0], first)
        await stop(tasks[1], second)
    assert fake.state.max_polls_in_flight == 2


async def test_a_tap_no_turn_will_answer_is_answered_by_the_poller(fake: FakeTelegram) -> None:
    adapter, listener = poller(fake)
    emitted: list[Inbound] = []

    async def emit(inbound: Inbound) -> None:
        emitted.append(inbound)

    inline = PAYLOADS / "callback_query_inline_mode.json"  # a button on an inline-mode message: no chat to run in
    fake.push_update(json.loads(inline.read_text()) | {"update_id": 6000})
    fake.push_update(make_update("hello", chat_id=501, update_id=6001))
    task = await run_listener(listener, emit)
    try:
        await wait_until(lambda: fake.state.confirmed == 6002, "both updates confirmed")
    finally:
        await stop(task, adapter)
    assert fake.state.answered == {"5512cb-inline": None}
    assert [m.dedup_key for i in emitted for m in i.messages] == ["6001"]
