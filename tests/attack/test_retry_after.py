"""A platform's 429 ``retry_after`` as an attack: absurd values and waits longer than the longest deferral.

Whatever the platform says (NaN, negative, 1e12, infinity, a day), the gateway waits a finite, non-negative time no
longer than ``SWITCHBOARD_QUEUE__MAX_DEFER_S``, keeps sending afterwards, and never holds a worker slot for the wait:
a longer wait fails the send at once (dead-lettered; the turn stays completed, the model is not re-run).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

import switchboard.channels.telegram.polling as polling
from switchboard.channels.base import Inbound
from switchboard.channels.discord.adapter import DiscordChannel
from switchboard.channels.discord.fake.platform import FakeDiscord
from switchboard.channels.discord.fake.rest import FakeDiscordApi
from switchboard.channels.registry import BuildContext
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.core.actions import SendText
from switchboard.core.messages import ConversationRef
from switchboard.errors import DeliveryError, RateLimitedError
from switchboard.outbound.deliver import ChannelDeliverer
from switchboard.outbound.outbox import Outbox
from switchboard.outbound.ratelimits import SendBuckets
from switchboard.queue.connection import async_client
from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease
from switchboard.settings import QueueSettings
from switchboard.worker.drainturn import DrainOutcome
from tests.channels._discord_fixtures import APP_ID, BOT_ID, Sending
from tests.channels._discord_fixtures import TOKEN as DISCORD_TOKEN
from tests.channels._discord_fixtures import settings as discord_settings
from tests.channels.test_telegram import BOT, TOKEN, settings
from tests.fakes.telegram_api import FakeTelegram, RecordingSend, make_update
from tests.queue.conftest import make_message
from tests.queue.test_sending import Refusing, Runner, drainer_for

ABSURD = [math.nan, -5.0, 1e12, math.inf]
IDS = ["nan", "negative", "1e12", "inf"]


def sane(seconds: float) -> bool:
    return math.isfinite(seconds) and 0.0 <= seconds <= 86_400.0


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        yield server


@pytest.fixture
async def discord() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(DISCORD_TOKEN, bot_id=BOT_ID, application_id=APP_ID) as server:
        yield server


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    redis = async_client(redis_url)
    yield redis
    await redis.aclose()


@pytest.mark.parametrize("retry_after", ABSURD, ids=IDS)
async def test_a_telegram_429_with_an_absurd_retry_after_raises_a_sane_wait(
    telegram: FakeTelegram, retry_after: float
) -> None:
    adapter = TelegramChannel(settings(telegram.base_url))
    telegram.fail_next(1, retry_after=retry_after, method="sendMessage")
    conversation = ConversationRef(channel="telegram", conversation="42")
    try:
        with pytest.raises(RateLimitedError) as caught:
            await adapter.perform(SendText(text="hello"), conversation, RecordingSend())
        assert sane(caught.value.retry_after), caught.value.retry_after
        receipt = await adapter.perform(SendText(text="hello"), conversation, RecordingSend())
        assert receipt.parts == 1
    finally:
        await adapter.aclose()


@pytest.mark.parametrize("retry_after", ABSURD, ids=IDS)
async def test_the_outbox_never_waits_a_nan_or_endless_time(
    telegram: FakeTelegram, client: aioredis.Redis, retry_after: float
) -> None:
    """A NaN ``retry_after`` reached ``asyncio.sleep`` (which then never returns) and poisoned ``waited_s``."""
    adapter = TelegramChannel(settings(telegram.base_url))
    deliverer = ChannelDeliverer({("telegram", "default"): adapter})
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    conversation = ConversationRef(agent="assistant", channel="telegram", conversation="42")
    lease = await Lease(client, worker_id="w1", lease_ms=30_000).acquire("default/assistant/telegram/default/42")
    assert lease is not None
    outbox = Outbox(
        client,
        lease,
        deliverer.perform,
        sleep=sleep,
        max_wait_s=600.0,
        buckets=SendBuckets(client, sleep=sleep),
        capabilities=deliverer.capabilities,
    )
    telegram.fail_next(1, retry_after=retry_after, method="sendMessage")
    try:
        try:
            await outbox.send(SendText(text="hello"), conversation, run_id="r1", logical="reply")
        except RateLimitedError as err:  # a wait longer than the turn may spend is handed up, sane
            assert sane(err.retry_after), err.retry_after
        assert all(sane(s) for s in sleeps), sleeps
        assert sane(outbox.waited_s), outbox.waited_s
    finally:
        await adapter.aclose()


@pytest.mark.parametrize("retry_after", ABSURD, ids=IDS)
async def test_a_telegram_poller_told_to_wait_absurdly_keeps_polling(
    telegram: FakeTelegram, monkeypatch: pytest.MonkeyPatch, retry_after: float
) -> None:
    """``getUpdates`` 429 with NaN/1e12: the poller slept for ever (the bot stopped receiving, lease still held)."""
    real_sleep = asyncio.sleep
    asked: list[float] = []

    async def recording_sleep(seconds: float, *args: Any) -> Any:
        asked.append(seconds)
        return await real_sleep(min(seconds, 0.01) if math.isfinite(seconds) else 0.01, *args)

    monkeypatch.setattr(polling.asyncio, "sleep", recording_sleep)
    adapter = TelegramChannel(settings(telegram.base_url, transport="polling"), poll_timeout=1)
    listener = adapter.listener()
    assert listener is not None
    got: list[str] = []

    async def emit(inbound: Inbound) -> None:
        got.extend(m.text for m in inbound.messages)

    telegram.fail_next(1, retry_after=retry_after, method="getUpdates")
    telegram.push_update(make_update("after the 429", chat_id=501, update_id=9100))
    task = asyncio.create_task(listener.listen(emit))
    try:
        async with asyncio.timeout(20):
            while not got:
                await real_sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await adapter.aclose()
    assert got == ["after the 429"]
    assert asked and all(math.isfinite(s) and 0 < s <= 60 for s in asked), asked  # no hot loop, no endless wait


@pytest.mark.parametrize("retry_after", ABSURD, ids=IDS)
async def test_a_discord_global_429_with_an_absurd_retry_after_does_not_stop_the_bot(
    discord: FakeDiscord, retry_after: float
) -> None:
    """A global 429 with NaN left ``_global_until`` NaN: every later request slept for ever; 1e12 blocked for ever."""
    adapter = DiscordChannel(discord_settings(discord.api_url), BuildContext(account="default"))
    conversation = ConversationRef(channel="discord", conversation="300", extra={"channel_id": "300"})
    discord.state.fail_next(1, retry_after=retry_after, is_global=True)
    try:
        with pytest.raises(RateLimitedError) as caught:
            await adapter.perform(SendText(text="hello"), conversation, Sending())
        assert math.isfinite(caught.value.retry_after) and 0 <= caught.value.retry_after <= 3600
        if not caught.value.retry_after > 1.0:  # the platform's wait, now sane, is honoured; then sends go on
            async with asyncio.timeout(20):
                receipt = await adapter.perform(SendText(text="hello"), conversation, Sending(idempotency_key="k2"))
            assert receipt.parts == 1
    finally:
        await adapter.aclose()


@pytest.mark.parametrize(
    ("remaining", "reset_after"),
    [("NaN", "1"), ("inf", "1"), ("-inf", "1"), ("0", "nan"), ("0", "1e12"), ("1e400", "1"), ("abc", "-1")],
)
async def test_a_discord_bucket_header_with_an_absurd_value_never_crashes_a_send(
    discord: FakeDiscord, monkeypatch: pytest.MonkeyPatch, remaining: str, reset_after: str
) -> None:
    """``int(float("NaN"))`` raised ValueError (``inf``: OverflowError) out of the REST client: not a DeliveryError."""
    honest = FakeDiscordApi._bucket_headers

    def hostile(self: FakeDiscordApi, route: str, major: str) -> dict[str, str]:
        headers = honest(self, route, major)
        return headers | {"X-RateLimit-Remaining": remaining, "X-RateLimit-Reset-After": reset_after}

    monkeypatch.setattr(FakeDiscordApi, "_bucket_headers", hostile)
    adapter = DiscordChannel(discord_settings(discord.api_url), BuildContext(account="default"))
    conversation = ConversationRef(channel="discord", conversation="300", extra={"channel_id": "300"})
    try:
        for index in range(2):  # the second send meets what the first answer's headers left behind
            try:
                async with asyncio.timeout(20):
                    await adapter.perform(
                        SendText(text=f"m{index}"), conversation, Sending(idempotency_key=f"k{index}")
                    )
            except RateLimitedError as err:
                assert math.isfinite(err.retry_after) and 0 <= err.retry_after <= 3600, err.retry_after
            except DeliveryError:
                pass
    finally:
        await adapter.aclose()


async def test_a_send_never_sleeps_longer_than_the_longest_deferral_in_a_worker(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    session = make_message("x").session_key
    await ingestor.ingest(make_message("hello"))
    runner, waits = Runner(), []
    flood_wait = [RateLimitedError("429: Too Many Requests", channel="telegram", retry_after=86_400.0)] * 12
    deliverer = Refusing(list(flood_wait))
    outcome = await drainer_for(client, queue_settings, deliverer, runner, waits).drain_session(session)

    assert outcome is DrainOutcome.RELEASED
    assert runner.calls == 1  # the model is never re-run for it
    assert deliverer.reply_calls == 1 and waits == []  # before: twelve sleeps of 86,400 s
    events = await read_events(client, session)
    kinds = [e["kind"] for e in events]
    assert kinds.count("run_completed") == 1 and "reply_sent" not in kinds and "run_dead_lettered" not in kinds
    (dead,) = [e for e in events if e["kind"] == "send_dead_lettered"]
    assert "telegram asked to wait 86400 s" in dead["reason"], dead
    assert f"SWITCHBOARD_QUEUE__MAX_DEFER_S ({queue_settings.max_defer_s:.0f} s)" in dead["reason"], dead
    assert await client.llen(SessionKeys(session).inbox) == 0


async def test_a_platform_wait_within_the_longest_deferral_is_still_honoured(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    settings = queue_settings.model_copy(update={"max_defer_s": 60.0})
    session = make_message("x").session_key
    await ingestor.ingest(make_message("hello"))
    runner, waits = Runner(), []
    deliverer = Refusing([RateLimitedError("429", channel="telegram", retry_after=60.0), None])
    await drainer_for(client, settings, deliverer, runner, waits).drain_session(session)

    assert runner.calls == 1 and waits == [60.0]
    assert deliverer.texts() == ["answer: hello"]
    kinds = [e["kind"] for e in await read_events(client, session)]
    assert kinds.count("reply_sent") == 1 and "send_dead_lettered" not in kinds


async def test_short_platform_waits_add_up_to_the_longest_deferral_at_most(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    settings = queue_settings.model_copy(update={"max_defer_s": 60.0})
    session = make_message("x").session_key
    await ingestor.ingest(make_message("hello"))
    runner, waits = Runner(), []
    # each wait alone is allowed, but not all of them in a row: a platform cannot hold the slot by splitting a wait
    deliverer = Refusing([RateLimitedError("429", channel="telegram", retry_after=40.0)] * 12)
    await drainer_for(client, settings, deliverer, runner, waits).drain_session(session)

    assert runner.calls == 1
    assert waits == [40.0]  # before: nine sleeps of 40 s (the outbox's and the send loop's waits, uncounted)
    events = await read_events(client, session)
    (dead,) = [e for e in events if e["kind"] == "send_dead_lettered"]
    assert "kept asking to wait (80 s in all)" in dead["reason"], dead
