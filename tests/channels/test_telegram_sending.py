"""The Telegram adapter, outbound: every action kind against the fake Bot API, resuming, streaming, files in and out."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from html.parser import HTMLParser

import pytest

from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.core.actions import (
    AckChoice,
    Choice,
    EditText,
    OfferChoice,
    SendError,
    SendText,
    SendTyping,
    SetStatus,
    StreamDelta,
    StreamText,
)
from switchboard.core.messages import ChoiceSelected, ConversationRef
from switchboard.errors import ConfigError, DeliveryError, RateLimitedError
from tests.channels.test_telegram import BOT, SECRET, TOKEN, settings, signed
from tests.fakes.telegram_api import FakeTelegram, RecordingSend, check_html


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        yield server


@pytest.fixture
async def channel(fake: FakeTelegram) -> AsyncIterator[TelegramChannel]:
    adapter = TelegramChannel(settings(fake.base_url))
    await adapter.start()
    yield adapter
    await adapter.aclose()


def conversation(
    chat_id: int = 501, reply_to: int | None = 11, thread: int | None = None, chat_type: str | None = None
) -> ConversationRef:
    extra = {"chat_id": str(chat_id)}
    if reply_to is not None:
        extra["reply_to_message_id"] = str(reply_to)
    if thread is not None:
        extra["message_thread_id"] = str(thread)
    if chat_type is not None:
        extra["chat_type"] = chat_type
    return ConversationRef(
        channel="telegram", conversation=str(chat_id), thread=str(thread) if thread else None, extra=extra
    )


class Balance(HTMLParser):
    """Checks that every tag closes in order and nothing stays open."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.stack: list[str] = []
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack.pop() != tag:
            self.problems.append(f"unexpected </{tag}>")

    def balanced(self, markup: str) -> bool:
        self.feed(markup)
        self.close()
        return not self.problems and not self.stack


def units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


# ── text ────────────────────────────────────────────────────────────────────────────────────────


async def test_a_reply_is_rendered_to_html_and_threads_to_the_user_message(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    text = "**Done.** See [the docs](https://example.com/a?b=1&c=2) and `x < y`. <script>alert(1)</script>"
    send = RecordingSend()
    receipt = await channel.perform(SendText(text=text), conversation(reply_to=11), send)
    [call] = fake.sent(501)
    assert call.params["parse_mode"] == "HTML"
    assert call.params["text"] == (
        '<b>Done.</b> See <a href="https://example.com/a?b=1&amp;c=2">the docs</a> and <code>x &lt; y</code>. '
        "&lt;script&gt;alert(1)&lt;/script&gt;"
    )
    assert call.params["reply_parameters"] == {"message_id": 11, "allow_sending_without_reply": True}
    assert call.params["link_preview_options"] == {"is_disabled": True}
    assert receipt.parts == 1 and receipt.platform_ids == ("1",)
    assert send.recorded == ["1"] and send.paced == 1


async def test_a_20000_character_reply_arrives_complete_and_well_formed(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    paragraph = "Some **bold and _nested italic_ words** with `code` & <angle> brackets, ünïcödé 🚀. " * 10
    code = "```python\n" + "print('line < 10 & more')\n" * 300 + "```"
    blocks = [f"Section {n}: {paragraph}" for n in range(12)] + [code]
    blocks += [f"Section {n}: {paragraph}" for n in range(12, 16)]
    text = "\n\n".join(blocks)
    assert len(text) >= 20_000
    send = RecordingSend()
    receipt = await channel.perform(SendText(text=text), conversation(reply_to=11), send)
    calls = fake.sent(501)
    assert len(calls) == receipt.parts >= 5
    assert receipt.platform_ids == tuple(str(n) for n in range(1, len(calls) + 1)) == tuple(send.recorded)
    assert send.paced == len(calls)
    for call in calls:
        part = call.params["text"]
        assert units(check_html(part)) <= 4096  # what Telegram counts: the text after entity parsing
        assert Balance().balanced(part), part[:200]
    assert "reply_parameters" in calls[0].params
    assert all("reply_parameters" not in c.params for c in calls[1:])
    seen = "".join(check_html(c.params["text"]) for c in calls)
    assert seen.count("print('line < 10 & more')") == 300
    assert all(seen.count(f"Section {n}: Some bold") == 1 for n in range(16))  # every paragraph once, in order
    assert [seen.index(f"Section {n}: ") for n in range(16)] == sorted(seen.index(f"Section {n}: ") for n in range(16))


async def test_typing_is_a_chat_action(channel: TelegramChannel, fake: FakeTelegram) -> None:
    receipt = await channel.perform(SendTyping(), conversation(chat_id=-100777, thread=5), RecordingSend())
    [call] = fake.sent(-100777, method="sendChatAction")
    assert call.params == {"chat_id": -100777, "action": "typing", "message_thread_id": 5}
    assert receipt.parts == 0


async def test_forum_topic_replies_stay_in_the_topic(channel: TelegramChannel, fake: FakeTelegram) -> None:
    await channel.perform(SendText(text="word " * 2000), conversation(-100777, reply_to=40, thread=77), RecordingSend())
    calls = fake.sent(-100777)
    assert len(calls) == 3
    assert all(c.params["message_thread_id"] == 77 for c in calls)


async def test_status_and_deltas_send_nothing(channel: TelegramChannel, fake: FakeTelegram) -> None:
    before = len(fake.calls)
    assert (await channel.perform(SetStatus(status="running"), conversation(), RecordingSend())).parts == 0
    assert (await channel.perform(StreamDelta(text="par"), conversation(), RecordingSend())).parts == 0
    assert (await channel.perform(SendText(text="   \n"), conversation(), RecordingSend())).parts == 0
    assert len(fake.calls) == before


async def test_an_error_is_a_short_plain_message(channel: TelegramChannel, fake: FakeTelegram) -> None:
    action = SendError(code="model_failed", message="The model is unavailable <b>right now</b>." + "!" * 5000)
    await channel.perform(action, conversation(reply_to=11), RecordingSend())
    [call] = fake.sent(501)
    assert "parse_mode" not in call.params
    assert call.params["text"].startswith("The model is unavailable <b>right now</b>.")
    assert len(call.params["text"]) <= 1000
    assert call.params["reply_parameters"]["message_id"] == 11


# ── resuming after a failure (the outbox keeps the parts sent) ──────────────────────────────────


async def test_429_is_rate_limited_with_retry_after_and_a_retry_resumes(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    text = "\n\n".join(["paragraph " * 300] * 3)
    fake.fail_next(1, retry_after=3, method="sendMessage")
    send = RecordingSend()
    with pytest.raises(RateLimitedError) as caught:
        await channel.perform(SendText(text=text), conversation(), send)
    assert caught.value.retry_after == 3 and caught.value.retryable
    assert fake.sent(501) == [] and send.recorded == []
    receipt = await channel.perform(SendText(text=text), conversation(), send)
    assert receipt.parts == len(fake.sent(501)) == 3


async def test_a_429_in_the_middle_resumes_after_the_parts_already_sent(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    text = "\n\n".join(f"paragraph{n} " * 300 for n in range(3))
    fake.fail_next(1, retry_after=2, method="sendMessage", after=1)
    send = RecordingSend()
    with pytest.raises(RateLimitedError):
        await channel.perform(SendText(text=text), conversation(), send)
    assert len(fake.sent(501)) == 1 and send.recorded == ["1"]
    retry = RecordingSend(recorded=list(send.recorded))  # another worker, reading the outbox record
    receipt = await channel.perform(SendText(text=text), conversation(), retry)
    texts = [c.params["text"] for c in fake.sent(501)]
    assert [t.split()[0] for t in texts] == ["paragraph0", "paragraph1", "paragraph2"]
    assert receipt.parts == 3 and receipt.platform_ids == ("1", "2", "3")
    again = await channel.perform(SendText(text=text), conversation(), retry)
    assert again.platform_ids == receipt.platform_ids and len(fake.sent(501)) == 3


@pytest.mark.parametrize(
    ("status", "description", "retryable"),
    [
        (400, "Bad Request: chat not found", False),
        (403, "Forbidden: bot was blocked by the user", False),
        (500, "Internal Server Error", True),
        (502, "Bad Gateway", True),
    ],
)
async def test_platform_errors_map_to_delivery_errors(
    channel: TelegramChannel, fake: FakeTelegram, status: int, description: str, retryable: bool
) -> None:
    fake.refuse_next(1, status=status, description=description, method="sendMessage")
    with pytest.raises(DeliveryError) as caught:
        await channel.perform(SendText(text="hi"), conversation(), RecordingSend())
    assert not isinstance(caught.value, RateLimitedError)
    assert caught.value.retryable is retryable and caught.value.channel == "telegram"


async def test_an_unreachable_api_is_a_retryable_error() -> None:
    gone = FakeTelegram(token=TOKEN)
    base_url = await gone.start()
    await gone.stop()
    adapter = TelegramChannel(settings(base_url))
    try:
        with pytest.raises(DeliveryError) as caught:
            await adapter.perform(SendText(text="hi"), conversation(), RecordingSend())
    finally:
        await adapter.aclose()
    assert caught.value.retryable and TOKEN not in str(caught.value)


async def test_a_wrong_token_is_fatal_and_never_shown(fake: FakeTelegram, caplog: pytest.LogCaptureFixture) -> None:
    other = "999:another-token-value"
    adapter = TelegramChannel(settings(fake.base_url, bot_token=other))
    try:
        with caplog.at_level(logging.DEBUG), pytest.raises(DeliveryError) as caught:
            await adapter.perform(SendText(text="hi"), conversation(), RecordingSend())
    finally:
        await adapter.aclose()
    assert not caught.value.retryable
    assert [c.status for c in fake.calls] == [401]
    assert other not in str(caught.value) and other not in caplog.text


async def test_without_a_bot_token_sending_says_what_to_set() -> None:
    adapter = TelegramChannel(settings(bot_token=None))
    with pytest.raises(DeliveryError) as caught:
        await adapter.perform(SendText(text="hi"), conversation(), RecordingSend())
    assert not caught.value.retryable and "SWITCHBOARD_TELEGRAM__BOT_TOKEN" in str(caught.value)
    await adapter.aclose()


async def test_html_telegram_refuses_is_resent_as_plain_text(channel: TelegramChannel, fake: FakeTelegram) -> None:
    fake.refuse_next(1, status=400, description="Bad Request: can't parse entities: odd", method="sendMessage")
    receipt = await channel.perform(SendText(text="**odd** & more"), conversation(), RecordingSend())
    statuses = [(c.params.get("parse_mode"), c.status) for c in fake.calls if c.method == "sendMessage"]
    assert statuses == [("HTML", 400), (None, 200)]
    assert fake.sent(501)[0].params["text"] == "odd & more"
    assert receipt.parts == 1


# ── edits, streaming, choices, acks ─────────────────────────────────────────────────────────────


async def test_edit_text_replaces_a_sent_message(channel: TelegramChannel, fake: FakeTelegram) -> None:
    sent = await channel.perform(SendText(text="draft"), conversation(), RecordingSend())
    [message_id] = sent.platform_ids
    receipt = await channel.perform(EditText(message_id=message_id, text="**final**"), conversation(), RecordingSend())
    [edit] = fake.sent(501, method="editMessageText")
    assert edit.params["message_id"] == int(message_id) and edit.params["text"] == "<b>final</b>"
    assert receipt.platform_ids == (message_id,)
    # the same text again: Telegram says "not modified", which is no failure
    await channel.perform(EditText(message_id=message_id, text="**final**"), conversation(), RecordingSend())
    assert [c.status for c in fake.calls if c.method == "editMessageText"] == [200, 400]
    with pytest.raises(DeliveryError):
        await channel.perform(EditText(message_id="999", text="x"), conversation(), RecordingSend())


async def test_streaming_in_a_private_chat_uses_drafts_then_sends_the_split_reply(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    chat = conversation(chat_type="private")
    send = RecordingSend(idempotency_key="reply-key")
    opened = await channel.perform(StreamText(text="Hel"), chat, send)
    assert opened.handle is not None and opened.handle.isdigit() and int(opened.handle) != 0
    again = await channel.perform(StreamText(handle=opened.handle, text="Hello **wor**", sent=3), chat, send)
    assert again.handle == opened.handle
    assert [(c, d, t) for c, d, t in fake.state.drafts] == [
        (501, int(opened.handle), "Hel"),
        (501, int(opened.handle), "Hello <b>wor</b>"),
    ]
    final_text = "Hello **world**. " + "more words " * 800
    final = await channel.perform(StreamText(handle=opened.handle, text=final_text, sent=12, final=True), chat, send)
    messages = fake.sent(501)
    assert len(messages) == final.parts == 3 and final.platform_ids == tuple(send.recorded)
    assert messages[0].params["reply_parameters"]["message_id"] == 11
    assert (
        " ".join(check_html(m.params["text"]) for m in messages).split()
        == check_html("Hello <b>world</b>. " + "more words " * 800).split()
    )
    # a retry of the same stream on another worker opens the same draft (the id comes from the idempotency key)
    reopened = await channel.perform(StreamText(text="Hel"), chat, RecordingSend(idempotency_key="reply-key"))
    assert reopened.handle == opened.handle


async def test_streaming_in_a_group_or_where_drafts_are_refused_has_no_handle(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    group = await channel.perform(StreamText(text="Hel"), conversation(-100777), RecordingSend())
    assert group.handle is None and fake.state.drafts == []
    fake.refuse_next(1, status=400, description="Bad Request: TEXTDRAFT_PEER_INVALID", method="sendMessageDraft")
    refused = await channel.perform(StreamText(text="Hel"), conversation(), RecordingSend())
    assert refused.handle is None  # the streaming policy edits a preview instead
    assert fake.sent(501) == [] and fake.sent(-100777) == []


async def test_a_choice_is_an_inline_keyboard_whose_data_is_the_option_id(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    options = [Choice(id="env:staging", label="Staging"), Choice(id="env:prod", label="Production <EU>")]
    action = OfferChoice(question="Deploy to which **environment**?", options=options)
    receipt = await channel.perform(action, conversation(), RecordingSend())
    [call] = fake.sent(501)
    assert call.params["text"] == "Deploy to which <b>environment</b>?"
    assert call.params["reply_markup"] == {
        "inline_keyboard": [
            [{"text": "Staging", "callback_data": "env:staging"}],
            [{"text": "Production <EU>", "callback_data": "env:prod"}],
        ]
    }
    assert receipt.platform_ids == ("1",)


async def test_a_choice_whose_id_is_over_64_bytes_is_numbered_text(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    options = [Choice(id="é" * 40, label="staging"), Choice(id="p", label="production <eu>")]  # 80 bytes of UTF-8
    await channel.perform(OfferChoice(question="Where?", options=options), conversation(), RecordingSend())
    [call] = fake.sent(501)
    assert "reply_markup" not in call.params
    assert call.params["text"] == "Where?\n\n1. staging\n2. production &lt;eu&gt;"


async def test_a_choice_round_trip_offer_tap_ack(channel: TelegramChannel, fake: FakeTelegram) -> None:
    """offer → inline keyboard sent → the user taps → callback_query → ChoiceSelected(option id) → acknowledged."""
    options = [Choice(id="opt-a", label="Apples"), Choice(id="opt-b", label="Bananas")]
    sent = await channel.perform(OfferChoice(question="Which fruit?", options=options), conversation(), RecordingSend())
    [offer_id] = sent.platform_ids
    update = fake.press_button(501, int(offer_id), "opt-b", update_id=77)
    inbound = await channel.receive(signed(update))
    [draft] = inbound.messages
    assert isinstance(draft.event, ChoiceSelected)
    assert draft.event.option_id == "opt-b" and draft.event.offer_message_id == offer_id
    assert draft.text == "Bananas" and draft.dedup_key == "77"
    assert draft.event.ack_ref is not None
    ack = await channel.perform(
        AckChoice(ack_ref=draft.event.ack_ref, text="Noted"), draft.conversation, RecordingSend()
    )
    assert fake.state.answered == {draft.event.ack_ref: "Noted"} and ack.detail == {"ack": "answered"}
    late = await channel.perform(AckChoice(ack_ref=draft.event.ack_ref), draft.conversation, RecordingSend())
    assert late.detail == {"ack": "expired"}  # too old to answer: no failure, nothing to retry


# ── webhook registration ────────────────────────────────────────────────────────────────────────


async def test_set_and_delete_webhook(channel: TelegramChannel, fake: FakeTelegram) -> None:
    await channel.set_webhook("https://gateway.example/webhooks/telegram")
    assert fake.state.webhook == {"url": "https://gateway.example/webhooks/telegram", "secret_token": SECRET}
    assert (await channel.webhook_info())["url"] == "https://gateway.example/webhooks/telegram"
    await channel.delete_webhook()
    assert fake.state.webhook == {} and (await channel.webhook_info())["url"] == ""
    bare = TelegramChannel(settings(fake.base_url, secret_token=None))
    with pytest.raises(ConfigError):
        await bare.set_webhook("https://gateway.example/webhooks/telegram")
    await bare.aclose()
