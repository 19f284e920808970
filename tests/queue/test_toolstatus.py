"""Tool calls' status messages with the real Telegram adapter against the fake Bot API, over real Redis.

The edit budget is tiny and counted (two tokens, the next in hours), so the test counts edits without timing anything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import redis.asyncio as aioredis

from switchboard.channels.base import Rate
from switchboard.channels.telegram import adapter as telegram_module
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.core.messages import ConversationRef
from switchboard.core.tools.status import StatusMessages
from switchboard.outbound.deliver import ChannelDeliverer
from switchboard.outbound.outbox import Outbox
from switchboard.outbound.ratelimits import SendBuckets
from switchboard.outbound.toolstatus import FINAL_HOLD_WAIT_S, FINAL_TOKEN_WAIT_S, INTERRUPTED_TEXT, StatusBoard
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease, LeaseToken
from tests.channels.test_telegram import BOT, TOKEN, settings
from tests.fakes.telegram_api import FakeTelegram

BUDGET = Rate(0.0001, 2)
"""Two edits, the next token in hours."""
ROOMY = Rate(1000.0, 1000)
CHAT = -100777
CONVERSATION = ConversationRef(
    agent="assistant",
    channel="telegram",
    conversation=str(CHAT),
    extra={"chat_id": str(CHAT), "chat_type": "supergroup"},
)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        yield server


@pytest.fixture
async def channel(fake: FakeTelegram, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[TelegramChannel]:
    for name in ("CAPABILITIES", "GROUP_CAPABILITIES"):
        caps = getattr(telegram_module, name)
        monkeypatch.setattr(telegram_module, name, replace(caps, edit_rate=BUDGET, chat_rate=ROOMY, bot_rate=ROOMY))
    adapter = TelegramChannel(settings(fake.base_url), account="default")
    yield adapter
    await adapter.aclose()


@pytest.fixture
async def lease(async_redis: aioredis.Redis) -> LeaseToken:
    token = await Lease(async_redis, worker_id="w1", lease_ms=30_000).acquire(CONVERSATION.session_key)
    assert token is not None
    return token


class Sleeps:
    """The board's sleep: counts what it was asked to wait, waits for nothing."""

    def __init__(self) -> None:
        self.total = 0.0

    async def __call__(self, seconds: float) -> None:
        self.total += seconds


def board(redis: aioredis.Redis, lease: LeaseToken, channel: TelegramChannel, sleeps: Sleeps) -> StatusBoard:
    """The status messages of run ``run-1`` as one attempt at it sees them (a new outbox each attempt)."""
    deliverer = ChannelDeliverer({("telegram", "default"): channel})
    buckets = SendBuckets(redis)
    outbox = Outbox(redis, lease, deliverer.perform, buckets=buckets, capabilities=deliverer.capabilities)
    caps = deliverer.capabilities(CONVERSATION)
    return StatusBoard(
        caps, CONVERSATION, outbox=outbox, perform=deliverer.perform, buckets=buckets, run_id="run-1", sleep=sleeps
    )


async def test_updates_are_skipped_without_an_edit_token_and_the_final_state_is_made_anyway(
    async_redis: aioredis.Redis, lease: LeaseToken, channel: TelegramChannel, fake: FakeTelegram
) -> None:
    sleeps = Sleeps()
    statuses = board(async_redis, lease, channel, sleeps)
    assert isinstance(statuses, StatusBoard)
    conforming: StatusMessages = statuses  # what the tool context takes
    status = conforming.open("status:call-1")
    assert status.edits
    assert await status.post("⏳ Running `make` — 5 s")
    shown = [await status.edit(f"⏳ Running `make` — {s} s") for s in (10, 15, 20, 25)]
    assert shown == [True, True, False, False]  # the budget's two tokens, then skipped without a call
    assert sleeps.total == 0  # an update never waits
    assert await status.edit("✅ Done in 27 s: `make` (exit 0)", final=True)
    assert sleeps.total >= FINAL_TOKEN_WAIT_S  # the final state waited for a token, then was made anyway

    [post] = fake.sent(CHAT, "sendMessage")
    assert post.params["text"] == "⏳ Running <code>make</code> — 5 s"
    edits = fake.sent(CHAT, "editMessageText")
    assert [e.params["text"] for e in edits] == [
        "⏳ Running <code>make</code> — 10 s",
        "⏳ Running <code>make</code> — 15 s",
        "✅ Done in 27 s: <code>make</code> (exit 0)",
    ]
    [edited] = {e.params["message_id"] for e in edits}
    assert fake.state.messages[(CHAT, int(edited))] == "✅ Done in 27 s: <code>make</code> (exit 0)"


async def test_a_rerun_of_the_call_edits_the_message_an_earlier_attempt_posted(
    async_redis: aioredis.Redis, lease: LeaseToken, channel: TelegramChannel, fake: FakeTelegram
) -> None:
    first = board(async_redis, lease, channel, Sleeps()).open("status:call-1")
    assert await first.post("⏳ Running `make` — 5 s")
    again = board(async_redis, lease, channel, Sleeps()).open("status:call-1")  # the same run, on a later attempt
    assert await again.post("⏳ Running `make` — 5 s")
    assert again.message_id == first.message_id is not None
    assert await again.edit("✅ Done in 9 s: `make` (exit 0)", final=True)
    assert len(fake.sent(CHAT, "sendMessage")) == 1  # posted once
    [edit] = fake.sent(CHAT, "editMessageText")
    assert str(edit.params["message_id"]) == first.message_id

    other = board(async_redis, lease, channel, Sleeps()).open("status:call-2")  # another call: its own message
    assert await other.post("⏳ Running `test` — 5 s")
    assert other.message_id != first.message_id and len(fake.sent(CHAT, "sendMessage")) == 2


async def test_the_final_state_is_never_made_into_a_chat_the_platform_holds(
    async_redis: aioredis.Redis, lease: LeaseToken, channel: TelegramChannel, fake: FakeTelegram
) -> None:
    """The final edit skips the local edit budget, never a 429's hold: held past its wait, it is not made at all."""
    sleeps = Sleeps()
    statuses = board(async_redis, lease, channel, sleeps)
    status = statuses.open("status:call-1")
    assert await status.post("⏳ Running `make` — 5 s")
    await statuses.outbox.hold(CONVERSATION, FINAL_HOLD_WAIT_S * 10)  # another worker's send was answered 429
    assert not await status.edit("✅ Done in 9 s: `make` (exit 0)", final=True)
    assert fake.sent(CHAT, "editMessageText") == []  # no call into the hold
    assert sleeps.total <= FINAL_TOKEN_WAIT_S + FINAL_HOLD_WAIT_S  # the wait is bounded


async def test_a_message_the_user_deleted_is_not_edited_again(
    async_redis: aioredis.Redis, lease: LeaseToken, channel: TelegramChannel, fake: FakeTelegram
) -> None:
    status = board(async_redis, lease, channel, Sleeps()).open("status:call-1")
    assert await status.post("⏳ Running `make` — 5 s")
    assert status.message_id is not None
    del fake.state.messages[(CHAT, int(status.message_id))]  # the user deleted it
    assert not await status.edit("⏳ Running `make` — 10 s")  # Telegram: 400, message to edit not found
    assert status.gone
    assert not await status.edit("⏳ Running `make` — 15 s")
    assert not await status.edit("✅ Done in 16 s: `make` (exit 0)", final=True)
    edits = [c.status for c in fake.calls if c.method == "editMessageText"]
    assert edits == [400]  # only the one that found it gone


async def test_nothing_is_sent_for_a_turn_once_its_board_is_settled(
    async_redis: aioredis.Redis, lease: LeaseToken, channel: TelegramChannel, fake: FakeTelegram
) -> None:
    statuses = board(async_redis, lease, channel, Sleeps())
    status = statuses.open("status:call-1")
    assert await status.post("⏳ Running `make` — 5 s")
    await statuses.settle()
    assert not await status.edit("✅ Done in 9 s: `make` (exit 0)", final=True)
    assert not await statuses.open("status:call-2").post("⏳ Running `test` — 5 s")
    assert len(fake.sent(CHAT, "sendMessage")) == 1 and fake.sent(CHAT, "editMessageText") == []


async def test_a_later_attempt_ends_the_status_messages_an_earlier_one_left_open(
    async_redis: aioredis.Redis, lease: LeaseToken, channel: TelegramChannel, fake: FakeTelegram
) -> None:
    """A worker lost mid-call leaves its status open; the next attempt ends it as interrupted, and only it."""
    first = board(async_redis, lease, channel, Sleeps())
    ended, left = first.open("status:call-1"), first.open("status:call-2")
    assert await ended.post("⏳ Running `make` — 5 s") and await left.post("⏳ Running `test` — 5 s")
    assert await ended.edit("✅ Done in 9 s: `make` (exit 0)", final=True)
    key = SessionKeys(CONVERSATION.session_key).tool_statuses
    assert await async_redis.hlen(key) == 1  # the one still open

    await board(async_redis, lease, channel, Sleeps()).settle_leftovers()  # the next attempt at the turn
    assert ended.message_id is not None and left.message_id is not None
    assert fake.state.messages[(CHAT, int(ended.message_id))] == "✅ Done in 9 s: <code>make</code> (exit 0)"
    assert fake.state.messages[(CHAT, int(left.message_id))] == INTERRUPTED_TEXT
    assert await async_redis.hlen(key) == 0
