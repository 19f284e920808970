"""The streaming policy with the real Telegram adapter against the fake Bot API: a 20,000-character reply, streamed.

A group streams by editing a preview under the shared edit budget; a private chat streams with drafts. Either way
the final reply arrives complete, each message within Telegram's limit, and the budget is never exceeded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import redis.asyncio as aioredis

from switchboard.channels.base import Rate
from switchboard.channels.render.telegram import visible_text
from switchboard.channels.telegram import adapter as telegram_module
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.outbound.deliver import ChannelDeliverer
from switchboard.queue.cancellation import listen_for_stops
from switchboard.queue.ingest import Ingestor
from switchboard.settings import QueueSettings
from switchboard.worker.drain import Drainer
from tests.channels.test_telegram import BOT, TOKEN, settings
from tests.fakes.telegram_api import FakeTelegram

from .conftest import agent_for

BUDGET = Rate(0.0001, 3)
"""Three edits, the next token in hours: what a test can count without timing anything."""
ROOMY = Rate(1000.0, 1000)
REPLY = " ".join(f"word{n}" for n in range(3000))[:20_000]


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        yield server


@pytest.fixture
async def channel(fake: FakeTelegram, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[TelegramChannel]:
    # Telegram's real rates, but a tiny edit budget (counted) and send rates that keep the test quick
    for name in ("CAPABILITIES", "GROUP_CAPABILITIES"):
        caps = getattr(telegram_module, name)
        monkeypatch.setattr(telegram_module, name, replace(caps, edit_rate=BUDGET, chat_rate=ROOMY, bot_rate=ROOMY))
    adapter = TelegramChannel(settings(fake.base_url), account="default")
    await adapter.start()
    yield adapter
    await adapter.aclose()


def _message(chat_id: int, chat_type: str) -> InboundMessage:
    extra = {"chat_id": str(chat_id), "chat_type": chat_type, "reply_to_message_id": "11"}
    conversation = ConversationRef(agent="assistant", channel="telegram", conversation=str(chat_id), extra=extra)
    return InboundMessage(dedup_key=f"tg-{chat_id}", conversation=conversation, sender=Sender(id="u1"), text="go")


async def _stream(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
    for start in range(0, len(REPLY), 40):  # 500 deltas
        await sink.delta(REPLY[start : start + 40])
    return TurnResult(text=REPLY, steps=1)


async def _drain(
    client: aioredis.Redis, queue: QueueSettings, channel: TelegramChannel, message: InboundMessage
) -> None:
    await Ingestor(client, queue).ingest(message)
    deliverer = ChannelDeliverer({("telegram", "default"): channel})
    drainer = Drainer(client, queue, runner=_stream, deliverer=deliverer, agent_for=agent_for, worker_id="w1")
    await drainer.drain(message.session_key)


def _visible_messages(fake: FakeTelegram, chat_id: int) -> list[str]:
    ids = [call for call in fake.sent(chat_id) if call.method == "sendMessage"]
    assert ids
    state = fake.state
    return [visible_text(text) for (chat, _), text in sorted(state.messages.items()) if chat == chat_id]


async def test_a_group_streams_a_long_reply_by_edits_within_the_budget(
    fake: FakeTelegram, channel: TelegramChannel, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    chat = -100123
    await _drain(client, queue_settings, channel, _message(chat, "supergroup"))
    edits = fake.sent(chat, "editMessageText")
    previews = fake.sent(chat, "sendMessage")
    print(f"\n20,000-character reply in a group: {len(edits)} edits, {len(previews)} messages")
    assert len(edits) <= BUDGET.burst + 1  # the streamed edits, and the one making the preview part 1
    messages = _visible_messages(fake, chat)
    assert " ".join(messages).split() == REPLY.split()  # complete, in order, nothing twice
    assert all(len(m.encode("utf-16-le")) // 2 <= 4096 for m in messages)


async def test_a_private_chat_streams_a_long_reply_with_drafts_within_the_budget(
    fake: FakeTelegram, channel: TelegramChannel, client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    chat = 777
    await _drain(client, queue_settings, channel, _message(chat, "private"))
    drafts = fake.sent(chat, "sendMessageDraft")
    print(f"\n20,000-character reply in a private chat: {len(drafts)} drafts, {len(fake.sent(chat))} messages")
    assert 1 <= len(drafts) <= BUDGET.burst
    assert fake.sent(chat, "editMessageText") == []
    messages = _visible_messages(fake, chat)
    assert " ".join(messages).split() == REPLY.split()


@pytest.mark.parametrize(("chat", "chat_type"), [(-100777, "supergroup"), (777, "private")])
async def test_stop_leaves_one_notice_in_the_chat(
    fake: FakeTelegram,
    channel: TelegramChannel,
    client: aioredis.Redis,
    queue_settings: QueueSettings,
    chat: int,
    chat_type: str,
) -> None:
    started = asyncio.Event()

    async def slow(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        await sink.delta("Let me think")
        started.set()
        await asyncio.sleep(60)
        return TurnResult(text="never", steps=1)

    ingestor = Ingestor(client, queue_settings)
    question = _message(chat, chat_type)
    deliverer = ChannelDeliverer({("telegram", "default"): channel})
    drainer = Drainer(client, queue_settings, runner=slow, deliverer=deliverer, agent_for=agent_for, worker_id="w1")
    stop_listening = asyncio.Event()
    listener = asyncio.create_task(listen_for_stops(client, drainer.cancel, stop_listening))
    try:
        await ingestor.ingest(question)
        drain = asyncio.create_task(drainer.drain(question.session_key))
        await asyncio.wait_for(started.wait(), 10)
        await ingestor.ingest(question.model_copy(update={"dedup_key": f"tg-stop-{chat}", "text": "/stop"}))
        await asyncio.wait_for(drain, 10)
    finally:
        stop_listening.set()
        await listener
    shown = _visible_messages(fake, chat)
    assert len(shown) == 1 and shown[0].endswith("You stopped this reply."), shown  # one message says it, once
    assert shown[0].startswith("Let me think")
