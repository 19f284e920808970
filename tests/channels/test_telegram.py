"""The Telegram adapter: secret check, Update normalisation, sends against the fake Bot API."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Literal

import aiohttp
import pytest
import redis.asyncio as aioredis
from multidict import CIMultiDict, CIMultiDictProxy

from switchboard.channels import telegram as telegram_module
from switchboard.channels._telegram_files import MAX_DOCUMENT_BYTES, MAX_PHOTO_BYTES
from switchboard.channels.base import RawRequest
from switchboard.channels.telegram import TelegramChannel
from switchboard.core.actions import (
    Action,
    OfferChoice,
    SendError,
    SendFile,
    SendText,
    SendTyping,
    SetStatus,
    StreamDelta,
)
from switchboard.core.gateway import workspace_for
from switchboard.core.messages import ConversationRef
from switchboard.core.replay import ReplayModel
from switchboard.errors import ConfigError, DeliveryError, MalformedBodyError, RateLimitedError, SignatureError
from switchboard.queue.keys import SessionKeys
from switchboard.settings import TelegramSettings
from switchboard.types import SessionKey
from tests.core.turns import MemorySink, MemoryStore, answer_step, calls_step
from tests.core.turns import agent as make_agent
from tests.core.turns import request as turn_request
from tests.core.turns import runtime as make_runtime
from tests.fakes.telegram_api import SECRET_HEADER, FakeTelegram, check_html, make_update, sign_update

TOKEN = "123456:TEST-token-abcdefghijklmnopqrstuv"
SECRET = "s3cret-Token_value"
BOT = "switchboard_test_bot"
PAYLOADS = Path(__file__).resolve().parent.parent / "payloads" / "telegram"


def request(body: bytes, headers: dict[str, str] | CIMultiDict[str] | None = None) -> RawRequest:
    return RawRequest("POST", "/webhooks/telegram", CIMultiDictProxy(CIMultiDict(headers or {})), {}, body)


def signed(update: dict[str, Any], secret: str = SECRET) -> RawRequest:
    body, headers = sign_update(update, secret)
    return request(body, headers)


def settings(base_url: str = "http://127.0.0.1:9", **overrides: Any) -> TelegramSettings:
    values: dict[str, Any] = {"bot_token": TOKEN, "secret_token": SECRET, "api_base_url": base_url, **overrides}
    return TelegramSettings.model_validate(values)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        yield server


@pytest.fixture
async def channel(fake: FakeTelegram) -> AsyncIterator[TelegramChannel]:
    adapter = TelegramChannel(settings(fake.base_url), agent="assistant", tenant="acme", account="default")
    await adapter.start()
    yield adapter
    await adapter.aclose()


def private_conversation(chat_id: int = 501, reply_to: int | None = 11, thread: int | None = None) -> ConversationRef:
    extra = {"chat_id": str(chat_id)}
    if reply_to is not None:
        extra["reply_to_message_id"] = str(reply_to)
    if thread is not None:
        extra["message_thread_id"] = str(thread)
    return ConversationRef(
        agent="assistant",
        channel="telegram",
        conversation=str(chat_id),
        thread=str(thread) if thread else None,
        extra=extra,
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


# ── the case table: every sample payload, and what the adapter makes of it ─────────────────────────


@dataclass(frozen=True)
class Draft:
    text: str
    chat: int
    sender: int
    chat_type: str
    thread: str | None = None
    mentioned: bool = False
    replied: bool = False


MALFORMED = "malformed"
IGNORED = None
GROUP, SMALL_GROUP, FORUM = -1001234567890, -4200, -1009876543210

CASES: dict[str, Draft | Literal["malformed"] | None] = {
    "private_text": Draft("Hello there, what can you do?", 501, 501, "private"),
    "private_command": Draft("/start", 501, 501, "private"),
    "private_photo_caption": Draft("What is in this picture?", 501, 501, "private"),
    "private_photo_no_caption": IGNORED,
    "private_sticker": IGNORED,
    "private_from_bot": IGNORED,
    "group_mention": Draft("what's the deploy status?", GROUP, 501, "supergroup", mentioned=True),
    "group_mention_middle": Draft("hey summarise this thread", GROUP, 501, "supergroup", mentioned=True),
    "group_mention_after_emoji": Draft("🚀 ship it?", GROUP, 501, "supergroup", mentioned=True),
    "group_no_mention": IGNORED,
    "group_mention_other_bot": IGNORED,
    "group_text_mention": Draft("please translate this", SMALL_GROUP, 501, "group", mentioned=True),
    "group_command_to_bot": Draft("/ask how many users signed up?", GROUP, 501, "supergroup", mentioned=True),
    "group_command_to_other_bot": IGNORED,
    "group_reply_to_bot": Draft("and what about staging?", GROUP, 501, "supergroup", replied=True),
    "group_reply_to_other_bot": IGNORED,
    "group_reply_to_human": IGNORED,
    "group_mention_from_bot": IGNORED,
    "forum_topic_mention": Draft("reset my password", FORUM, 501, "supergroup", thread="77", mentioned=True),
    "forum_topic_in_bot_topic_no_mention": IGNORED,
    "edited_message": IGNORED,
    "callback_query": IGNORED,
    "channel_post": IGNORED,
    "my_chat_member": IGNORED,
    "malformed_chat_id_string": MALFORMED,
    "malformed_update_id_missing": MALFORMED,
    "malformed_update_id_negative": MALFORMED,
    "malformed_message_not_object": MALFORMED,
    "malformed_entity_offset": MALFORMED,
    "malformed_date_missing": MALFORMED,
}


def test_the_case_table_covers_every_sample_payload() -> None:
    assert sorted(p.stem for p in PAYLOADS.glob("*.json")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
async def test_sample_payload(channel: TelegramChannel, name: str) -> None:
    body = (PAYLOADS / f"{name}.json").read_bytes()
    raw = request(body, {SECRET_HEADER: SECRET, "Content-Type": "application/json"})
    channel.verify(raw)
    expected = CASES[name]
    if expected == MALFORMED:
        with pytest.raises(MalformedBodyError) as caught:
            channel.parse(raw)
        assert caught.value.status == 400
        return
    drafts = channel.parse(raw)
    if expected is IGNORED:
        assert drafts == []
        return
    assert isinstance(expected, Draft)
    data = json.loads(body)
    message = data["message"]
    [draft] = drafts
    assert draft.id == ""
    assert draft.dedup_key == str(data["update_id"])
    assert draft.text == expected.text
    assert draft.platform_message_id == str(message["message_id"])
    assert draft.sender.id == str(expected.sender) and draft.sender.name == "Ada Lovelace" and not draft.sender.is_bot
    ref = draft.conversation
    assert (ref.tenant, ref.agent, ref.channel, ref.account) == ("acme", "assistant", "telegram", "default")
    assert ref.conversation == str(expected.chat) and ref.thread == expected.thread
    assert ref.extra["chat_id"] == str(expected.chat)
    assert ref.extra["reply_to_message_id"] == str(message["message_id"])
    assert ref.extra.get("message_thread_id") == expected.thread
    assert draft.meta == {
        "chat_type": expected.chat_type,
        "mentioned": expected.mentioned,
        "replied_to_bot": expected.replied,
    }
    thread = f"/{expected.thread}" if expected.thread else ""
    assert draft.session_key == f"acme/assistant/telegram/default/{expected.chat}{thread}"


# ── the secret header ───────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({SECRET_HEADER: "wrong"}, 403),
        ({SECRET_HEADER: SECRET.upper()}, 403),
        ({SECRET_HEADER: SECRET.swapcase()}, 403),
        ({SECRET_HEADER: SECRET[:-1]}, 403),
        ({SECRET_HEADER: SECRET + "x"}, 403),
        ({SECRET_HEADER: ""}, 403),
        ({"X-Telegram-Bot-Api-Secret": SECRET}, 401),
    ],
)
def test_a_missing_or_wrong_secret_is_refused_before_the_body_is_read(headers: dict[str, str], status: int) -> None:
    adapter = TelegramChannel(settings(), agent="assistant")
    raw = request(b"{ this is not JSON", headers)  # parsing it would raise MalformedBodyError, not SignatureError
    with pytest.raises(SignatureError) as caught:
        adapter.verify(raw)
    assert caught.value.status == status
    assert SECRET not in str(caught.value)


def test_a_repeated_secret_header_is_refused() -> None:
    adapter = TelegramChannel(settings(), agent="assistant")
    headers: CIMultiDict[str] = CIMultiDict([(SECRET_HEADER, SECRET), (SECRET_HEADER, "other")])
    with pytest.raises(SignatureError) as caught:
        adapter.verify(request(b"{}", headers))
    assert caught.value.status == 403


def test_the_header_name_is_case_insensitive_even_in_a_plain_dict() -> None:
    adapter = TelegramChannel(settings(), agent="assistant")
    body, _ = sign_update(make_update("hi", chat_id=1, update_id=1), SECRET)
    adapter.verify(RawRequest("POST", "/", {SECRET_HEADER.lower(): SECRET}, {}, body))
    adapter.verify(request(body, {SECRET_HEADER.upper(): SECRET}))


def test_the_secret_is_compared_in_constant_time_on_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[object, object]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(telegram_module.hmac, "compare_digest", spy)
    adapter = TelegramChannel(settings(), agent="assistant")
    adapter.verify(signed(make_update("hi", chat_id=1, update_id=1)))
    assert seen == [(SECRET.encode(), SECRET.encode())]


def test_without_a_configured_secret_every_request_is_refused() -> None:
    adapter = TelegramChannel(settings(secret_token=None), agent="assistant")
    with pytest.raises(SignatureError) as caught:
        adapter.verify(signed(make_update("hi", chat_id=1, update_id=1), secret="anything"))
    assert caught.value.status == 403
    assert "SWITCHBOARD_TELEGRAM__SECRET_TOKEN" in str(caught.value)


def test_handshake_is_none() -> None:
    adapter = TelegramChannel(settings(), agent="assistant")
    assert adapter.handshake(signed(make_update("hi", chat_id=1, update_id=1))) is None


# ── parsing rules beyond the sample payloads ────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"[1, 2]", b'"text"', b"\xff\xfe\x00", b'{"update_id": true}', b'{"update_id": "12"}'],
)
def test_malformed_bodies_are_a_400(body: bytes) -> None:
    adapter = TelegramChannel(settings(), agent="assistant")
    with pytest.raises(MalformedBodyError) as caught:
        adapter.parse(request(body, {SECRET_HEADER: SECRET}))
    assert caught.value.status == 400 and caught.value.channel == "telegram"


def test_the_dedup_key_is_the_update_id() -> None:
    adapter = TelegramChannel(settings(), agent="assistant")
    first = adapter.parse(signed(make_update("same", chat_id=501, update_id=424242)))
    again = adapter.parse(signed(make_update("same", chat_id=501, update_id=424242)))
    other = adapter.parse(signed(make_update("same", chat_id=501, update_id=424243)))
    assert first[0].dedup_key == again[0].dedup_key == "424242"
    assert other[0].dedup_key == "424243"


def test_with_the_username_configured_mentions_work_without_getme() -> None:
    adapter = TelegramChannel(settings(bot_username="@Switchboard_Test_Bot"), agent="assistant")
    [draft] = adapter.parse(signed(make_update("status?", chat_id=-5, update_id=1, chat_type="group", mention=BOT)))
    assert draft.text == "status?"


async def test_getme_teaches_the_username(fake: FakeTelegram) -> None:
    adapter = TelegramChannel(settings(fake.base_url), agent="assistant")
    group = make_update("status?", chat_id=-5, update_id=1, chat_type="group", mention=BOT)
    try:
        assert adapter.bot_username is None
        assert adapter.parse(signed(group)) == []  # the mention cannot be recognised yet
        await adapter.start()
        assert adapter.bot_username == BOT and adapter.bot_id == 123456
        assert [d.text for d in adapter.parse(signed(group))] == ["status?"]
    finally:
        await adapter.aclose()
    assert [c.method for c in fake.calls] == ["getMe"]


async def test_an_unreachable_api_at_start_leaves_replies_working(caplog: pytest.LogCaptureFixture) -> None:
    gone = FakeTelegram(token=TOKEN)
    base_url = await gone.start()
    await gone.stop()
    adapter = TelegramChannel(settings(base_url, bot_token="not-a-numeric-token"), agent="assistant")
    try:
        with caplog.at_level(logging.WARNING, logger="switchboard.channels.telegram"):
            await adapter.start()
    finally:
        await adapter.aclose()
    assert "getMe failed" in caplog.text
    assert adapter.bot_username is None and adapter.bot_id is None
    mention = make_update("hi", chat_id=-5, update_id=1, chat_type="group", mention=BOT)
    reply = make_update("and then?", chat_id=-5, update_id=2, chat_type="group", reply_to_bot="some_bot", bot_id=9)
    assert adapter.parse(signed(mention)) == []
    assert [d.text for d in adapter.parse(signed(reply))] == ["and then?"]


def test_a_reply_to_another_bot_does_not_count_once_the_bot_id_is_known() -> None:
    adapter = TelegramChannel(settings(), agent="assistant")  # the id comes from the token: 123456
    other = make_update("x", chat_id=-5, update_id=1, chat_type="group", reply_to_bot="ci_bot", bot_id=99)
    ours = make_update("y", chat_id=-5, update_id=2, chat_type="group", reply_to_bot="whatever", bot_id=123456)
    assert adapter.parse(signed(other)) == []
    assert [d.text for d in adapter.parse(signed(ours))] == ["y"]


def test_a_bare_mention_with_nothing_to_say_is_dropped() -> None:
    adapter = TelegramChannel(settings(bot_username=BOT), agent="assistant")
    update = make_update("", chat_id=-5, update_id=1, chat_type="group", mention=BOT)
    update["message"]["text"] = update["message"]["text"].strip()
    assert adapter.parse(signed(update)) == []


def test_messages_from_the_bot_itself_are_dropped() -> None:
    adapter = TelegramChannel(settings(), agent="assistant")
    own = make_update("echo", chat_id=501, update_id=1, user_id=123456, is_bot=True)
    assert adapter.parse(signed(own)) == []


# ── sending ─────────────────────────────────────────────────────────────────────────────────────


async def test_a_reply_is_rendered_to_html_and_threads_to_the_user_message(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    text = "**Done.** See [the docs](https://example.com/a?b=1&c=2) and `x < y`. <script>alert(1)</script>"
    receipt = await channel.perform(SendText(text=text), private_conversation(reply_to=11), idempotency_key="r1")
    [call] = fake.sent(501)
    assert call.params["parse_mode"] == "HTML"
    assert call.params["text"] == (
        '<b>Done.</b> See <a href="https://example.com/a?b=1&amp;c=2">the docs</a> and <code>x &lt; y</code>. '
        "&lt;script&gt;alert(1)&lt;/script&gt;"
    )
    assert call.params["reply_parameters"] == {"message_id": 11, "allow_sending_without_reply": True}
    assert call.params["link_preview_options"] == {"is_disabled": True}
    assert receipt.parts == 1 and receipt.platform_ids == ("1",)


async def test_a_long_reply_is_split_into_balanced_parts_sent_in_order(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    paragraph = "Some **bold and _nested italic_ words** with `code` & <angle> brackets, " * 12
    code = "```python\n" + "print('line < 10 & more')\n" * 300 + "```"
    text = "\n\n".join([paragraph] * 10 + [code] + [paragraph] * 5)
    receipt = await channel.perform(SendText(text=text), private_conversation(reply_to=11), idempotency_key="long")
    calls = fake.sent(501)
    assert len(calls) == receipt.parts >= 4
    assert receipt.platform_ids == tuple(str(n) for n in range(1, len(calls) + 1))  # the fake's message ids
    for call in calls:
        part = call.params["text"]
        assert len(part.encode("utf-16-le")) // 2 <= 4096
        assert Balance().balanced(part), part[:200]
        check_html(part)
    assert "reply_parameters" in calls[0].params
    assert all("reply_parameters" not in c.params for c in calls[1:])
    code_parts = [c.params["text"] for c in calls if "language-python" in c.params["text"]]
    assert len(code_parts) >= 2  # the code block crossed a cut and was reopened with its language
    seen = "".join(check_html(c.params["text"]) for c in calls)
    assert seen.count("print('line < 10 & more')") == 300


async def test_typing_is_a_chat_action(channel: TelegramChannel, fake: FakeTelegram) -> None:
    receipt = await channel.perform(SendTyping(), private_conversation(chat_id=-100777, thread=5), idempotency_key="t")
    [call] = fake.sent(-100777, method="sendChatAction")
    assert call.params == {"chat_id": -100777, "action": "typing", "message_thread_id": 5}
    assert receipt.parts == 0


async def test_forum_topic_replies_stay_in_the_topic(channel: TelegramChannel, fake: FakeTelegram) -> None:
    conversation = private_conversation(chat_id=-100777, reply_to=40, thread=77)
    await channel.perform(SendText(text="word " * 2000), conversation, idempotency_key="topic")
    calls = fake.sent(-100777)
    assert len(calls) == 3
    assert all(c.params["message_thread_id"] == 77 for c in calls)


async def test_status_and_deltas_send_nothing(channel: TelegramChannel, fake: FakeTelegram) -> None:
    before = len(fake.calls)
    assert (await channel.perform(SetStatus(status="running"), private_conversation(), idempotency_key="s")).parts == 0
    assert (await channel.perform(StreamDelta(text="par"), private_conversation(), idempotency_key="d")).parts == 0
    assert (await channel.perform(SendText(text="   \n"), private_conversation(), idempotency_key="e")).parts == 0
    assert len(fake.calls) == before


async def test_an_error_is_a_short_plain_message(channel: TelegramChannel, fake: FakeTelegram) -> None:
    action = SendError(code="model_failed", message="The model is unavailable <b>right now</b>." + "!" * 5000)
    await channel.perform(action, private_conversation(reply_to=11), idempotency_key="err")
    [call] = fake.sent(501)
    assert "parse_mode" not in call.params
    assert call.params["text"].startswith("The model is unavailable <b>right now</b>.")
    assert len(call.params["text"]) <= 1000
    assert call.params["reply_parameters"]["message_id"] == 11


async def test_a_choice_is_numbered_options(channel: TelegramChannel, fake: FakeTelegram) -> None:
    action = OfferChoice(question="Deploy to which **environment**?", options=["staging", "production <eu>"])
    await channel.perform(action, private_conversation(), idempotency_key="choice")
    [call] = fake.sent(501)
    assert call.params["text"] == "Deploy to which <b>environment</b>?\n\n1. staging\n2. production &lt;eu&gt;"


PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


async def test_an_image_goes_up_as_a_photo_with_its_caption(
    channel: TelegramChannel, fake: FakeTelegram, tmp_path: Path
) -> None:
    (tmp_path / "q3.png").write_bytes(PNG)
    action = SendFile(path=str(tmp_path / "q3.png"), caption="Sales **Q3**", mime_type="image/png")
    receipt = await channel.perform(action, private_conversation(reply_to=11), idempotency_key="f1")
    [upload] = fake.files
    assert (upload.method, upload.filename, upload.content_type, upload.content) == (
        "sendPhoto",
        "q3.png",
        "image/png",
        PNG,
    )
    assert upload.chat_id == 501 and upload.caption == "Sales <b>Q3</b>"
    [call] = fake.sent(501, method="sendPhoto")
    assert call.params["parse_mode"] == "HTML" and call.params["reply_parameters"]["message_id"] == 11
    assert call.params["photo"] == {"filename": "q3.png", "content_type": "image/png", "size": len(PNG)}
    assert receipt.platform_ids == (str(upload.message_id),) and receipt.detail["method"] == "sendPhoto"
    assert fake.sent(501) == []  # no stray text message


async def test_other_files_go_up_as_documents(channel: TelegramChannel, fake: FakeTelegram, tmp_path: Path) -> None:
    body = b"%PDF-1.7\n" + b"x" * 5000
    (tmp_path / "report.pdf").write_bytes(body)
    await channel.perform(SendFile(path=str(tmp_path / "report.pdf")), private_conversation(), idempotency_key="f2")
    [upload] = fake.files
    assert (upload.method, upload.filename, upload.content_type, upload.content) == (
        "sendDocument",
        "report.pdf",
        "application/pdf",
        body,
    )
    assert upload.caption is None


async def test_a_photo_telegram_cannot_process_goes_again_as_a_document(
    channel: TelegramChannel, fake: FakeTelegram, tmp_path: Path
) -> None:
    (tmp_path / "tall.png").write_bytes(PNG)
    fake.refuse_next(1, status=400, description="Bad Request: PHOTO_INVALID_DIMENSIONS", method="sendPhoto")
    await channel.perform(SendFile(path=str(tmp_path / "tall.png")), private_conversation(), idempotency_key="f3")
    [upload] = fake.files
    assert upload.method == "sendDocument" and upload.content == PNG


async def test_an_image_over_the_photo_cap_goes_as_a_document(
    channel: TelegramChannel, fake: FakeTelegram, tmp_path: Path
) -> None:
    big = tmp_path / "poster.jpg"
    with big.open("wb") as out:
        out.truncate(MAX_PHOTO_BYTES + 1)
    await channel.perform(SendFile(path=str(big)), private_conversation(), idempotency_key="f4")
    [upload] = fake.files
    assert upload.method == "sendDocument" and upload.size == MAX_PHOTO_BYTES + 1


async def test_files_over_50_mb_or_missing_are_refused_for_good(
    channel: TelegramChannel, fake: FakeTelegram, tmp_path: Path
) -> None:
    huge = tmp_path / "huge.zip"
    with huge.open("wb") as out:
        out.truncate(MAX_DOCUMENT_BYTES + 1)
    with pytest.raises(DeliveryError, match="50000000 bytes") as caught:
        await channel.perform(SendFile(path=str(huge)), private_conversation(), idempotency_key="f5")
    assert not caught.value.retryable
    with pytest.raises(DeliveryError, match="cannot read") as missing:
        await channel.perform(SendFile(path=str(tmp_path / "gone.pdf")), private_conversation(), idempotency_key="f6")
    assert not missing.value.retryable
    assert fake.files == [] and fake.calls[-1].method == "getMe"


async def test_a_long_caption_keeps_its_rest_as_a_message(
    channel: TelegramChannel, fake: FakeTelegram, tmp_path: Path
) -> None:
    (tmp_path / "a.txt").write_text("hello")
    caption = " ".join(f"word{n}" for n in range(200))  # ~1,400 characters, over Telegram's 1,024
    receipt = await channel.perform(
        SendFile(path=str(tmp_path / "a.txt"), caption=caption), private_conversation(), idempotency_key="f7"
    )
    [upload] = fake.files
    [rest] = fake.sent(501)
    assert upload.caption is not None and len(upload.caption) <= 1024
    assert (upload.caption + " " + rest.params["text"]).split() == caption.split()
    assert receipt.parts == 2


async def test_send_file_tool_delivers_the_workspace_file_to_telegram(
    channel: TelegramChannel, fake: FakeTelegram, tmp_path: Path
) -> None:
    """The real tool, through the tool gateway and the runtime, to the fake Bot API: the bytes arrive."""
    conversation = private_conversation(reply_to=11)
    workspace = workspace_for(tmp_path / "ws", conversation.session_key)
    workspace.mkdir(parents=True)
    (workspace / "chart.png").write_bytes(PNG)

    class ChannelSink(MemorySink):
        async def act(self, action: Action) -> None:
            await channel.perform(action, conversation, idempotency_key="act-1")

    model = ReplayModel(
        [calls_step(("send_file", {"path": "chart.png", "caption": "Your chart"}), step=1), answer_step("Sent.")]
    )
    sink = ChannelSink()
    turn = turn_request("chart please", agent_=make_agent(tools=["send_file"]))
    turn = turn.model_copy(update={"session_key": conversation.session_key})
    result = await make_runtime(tmp_path, model=model).run_turn(turn, sink, MemoryStore())
    assert result.text == "Sent."
    [upload] = fake.files
    assert upload.content == PNG and upload.filename == "chart.png" and upload.caption == "Your chart"
    [called] = sink.of("tool_called")
    assert called.ok and called.tool == "send_file"
    tool_reply = model.requests[1].messages[-1]
    assert tool_reply.role == "tool" and '"sent":"chart.png"' in tool_reply.content.replace(" ", "")


async def test_429_is_rate_limited_with_retry_after_and_a_retry_resumes(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    text = "\n\n".join(["paragraph " * 300] * 3)
    conversation = private_conversation()
    fake.fail_next(1, retry_after=3, method="sendMessage")
    with pytest.raises(RateLimitedError) as caught:
        await channel.perform(SendText(text=text), conversation, idempotency_key="k")
    assert caught.value.retry_after == 3 and caught.value.retryable
    assert fake.sent(501) == []
    receipt = await channel.perform(SendText(text=text), conversation, idempotency_key="k")
    first_run = fake.sent(501)
    assert receipt.parts == len(first_run) == 3


async def test_a_429_in_the_middle_resumes_after_the_parts_already_sent(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    text = "\n\n".join(f"paragraph{n} " * 300 for n in range(3))
    conversation = private_conversation()
    fake.fail_next(1, retry_after=2, method="sendMessage", after=1)
    with pytest.raises(RateLimitedError) as caught:
        await channel.perform(SendText(text=text), conversation, idempotency_key="mid")
    assert caught.value.retry_after == 2
    assert len(fake.sent(501)) == 1
    receipt = await channel.perform(SendText(text=text), conversation, idempotency_key="mid")
    texts = [c.params["text"] for c in fake.sent(501)]
    assert [t.split()[0] for t in texts] == ["paragraph0", "paragraph1", "paragraph2"]
    assert receipt.parts == 3 and receipt.platform_ids == ("1", "2", "3")
    again = await channel.perform(SendText(text=text), conversation, idempotency_key="mid")
    assert again.platform_ids == receipt.platform_ids and len(fake.sent(501)) == 3


async def test_the_same_key_with_a_different_message_is_refused(channel: TelegramChannel) -> None:
    await channel.perform(SendText(text="one"), private_conversation(), idempotency_key="same")
    with pytest.raises(DeliveryError) as caught:
        await channel.perform(SendText(text="two"), private_conversation(), idempotency_key="same")
    assert not caught.value.retryable


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
        await channel.perform(SendText(text="hi"), private_conversation(), idempotency_key=f"e{status}")
    assert not isinstance(caught.value, RateLimitedError)
    assert caught.value.retryable is retryable and caught.value.channel == "telegram"


async def test_an_unreachable_api_is_a_retryable_error() -> None:
    gone = FakeTelegram(token=TOKEN)
    base_url = await gone.start()
    await gone.stop()
    adapter = TelegramChannel(settings(base_url), agent="assistant")
    try:
        with pytest.raises(DeliveryError) as caught:
            await adapter.perform(SendText(text="hi"), private_conversation(), idempotency_key="x")
    finally:
        await adapter.aclose()
    assert caught.value.retryable and TOKEN not in str(caught.value)


async def test_a_wrong_token_is_fatal_and_never_shown(fake: FakeTelegram, caplog: pytest.LogCaptureFixture) -> None:
    other = "999:another-token-value"
    adapter = TelegramChannel(settings(fake.base_url, bot_token=other), agent="assistant")
    try:
        with caplog.at_level(logging.DEBUG), pytest.raises(DeliveryError) as caught:
            await adapter.perform(SendText(text="hi"), private_conversation(), idempotency_key="x")
    finally:
        await adapter.aclose()
    assert not caught.value.retryable
    assert [c.status for c in fake.calls] == [401]
    assert other not in str(caught.value) and other not in caplog.text


async def test_without_a_bot_token_sending_says_what_to_set() -> None:
    adapter = TelegramChannel(settings(bot_token=None), agent="assistant")
    with pytest.raises(DeliveryError) as caught:
        await adapter.perform(SendText(text="hi"), private_conversation(), idempotency_key="x")
    assert not caught.value.retryable and "SWITCHBOARD_TELEGRAM__BOT_TOKEN" in str(caught.value)
    await adapter.aclose()


async def test_html_telegram_refuses_is_resent_as_plain_text(channel: TelegramChannel, fake: FakeTelegram) -> None:
    receipt = await channel._send(["<blink>odd</blink> &amp; more"], private_conversation(), "raw", "HTML")
    statuses = [(c.params.get("parse_mode"), c.status) for c in fake.calls if c.method == "sendMessage"]
    assert statuses == [("HTML", 400), (None, 200)]
    assert fake.sent(501)[0].params["text"] == "odd & more"
    assert receipt.parts == 1


async def test_set_webhook_registers_the_secret(channel: TelegramChannel, fake: FakeTelegram) -> None:
    await channel.set_webhook("https://gateway.example/webhooks/telegram")
    assert fake.state.webhook == {"url": "https://gateway.example/webhooks/telegram", "secret_token": SECRET}
    bare = TelegramChannel(settings(fake.base_url, secret_token=None), agent="assistant")
    with pytest.raises(ConfigError):
        await bare.set_webhook("https://gateway.example/webhooks/telegram")


# ── the fake Bot API itself (it serves `switchboard simulate` and the benchmarks too) ───────────


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_fake_answers_with_telegrams_error_shapes(fake: FakeTelegram, http: aiohttp.ClientSession) -> None:
    async with http.post(f"{fake.base_url}/bot999:nope/getMe") as resp:
        assert resp.status == 401
        assert await resp.json() == {"ok": False, "error_code": 401, "description": "Unauthorized"}
    async with http.post(f"{fake.base_url}/bot{TOKEN}/sendTelepathy") as resp:
        assert resp.status == 404
        assert await resp.json() == {"ok": False, "error_code": 404, "description": "Not Found"}
    fake.fail_next(1, retry_after=7)
    async with http.post(f"{fake.base_url}/bot{TOKEN}/getMe") as resp:
        assert resp.status == 429
        assert await resp.json() == {
            "ok": False,
            "error_code": 429,
            "description": "Too Many Requests: retry after 7",
            "parameters": {"retry_after": 7},
        }
    async with http.get(f"{fake.base_url}/bot{TOKEN}/getMe") as resp:
        me = await resp.json()
    assert me["result"]["username"] == BOT and me["result"]["id"] == 123456
    assert [(c.method, c.status) for c in fake.calls] == [
        ("getMe", 401),
        ("sendTelepathy", 404),
        ("getMe", 429),
        ("getMe", 200),
    ]


async def test_fake_send_message_accepts_json_and_form_bodies(fake: FakeTelegram, http: aiohttp.ClientSession) -> None:
    url = f"{fake.base_url}/bot{TOKEN}/sendMessage"
    async with http.post(url, json={"chat_id": 42, "text": "<b>hi</b>", "parse_mode": "HTML"}) as resp:
        first = (await resp.json())["result"]
    form = {"chat_id": "42", "text": "plain", "reply_parameters": json.dumps({"message_id": 3})}
    async with http.post(url, data=form) as resp:
        second = (await resp.json())["result"]
    assert (first["message_id"], second["message_id"]) == (1, 2)
    assert first["chat"] == {"id": 42, "type": "private"} and first["text"] == "hi" and first["from"]["is_bot"]
    assert isinstance(first["date"], int)
    assert fake.sent(42)[1].params == {"chat_id": 42, "text": "plain", "reply_parameters": {"message_id": 3}}


@pytest.mark.parametrize(
    ("params", "description"),
    [
        ({"text": "<script>alert(1)</script>", "parse_mode": "HTML"}, 'Unsupported start tag "script"'),
        ({"text": "1 < 2", "parse_mode": "HTML"}, "Unescaped"),
        ({"text": "<b>open", "parse_mode": "HTML"}, "Can't find end tag"),
        ({"text": "<b><i>x</b></i>", "parse_mode": "HTML"}, "Can't find end tag"),
        ({"text": "&nbsp;x", "parse_mode": "HTML"}, "Unsupported HTML entity"),
        ({"text": "<a href='https://x.y'><code>x</code></a>", "parse_mode": "HTML"}, "inside a link"),
        ({"text": "x" * 4097}, "message is too long"),
        ({"text": "  "}, "message text is empty"),
    ],
)
async def test_fake_refuses_what_telegram_refuses(
    fake: FakeTelegram, http: aiohttp.ClientSession, params: dict[str, Any], description: str
) -> None:
    async with http.post(f"{fake.base_url}/bot{TOKEN}/sendMessage", json={"chat_id": 1, **params}) as resp:
        body = await resp.json()
    assert resp.status == 400 and body["ok"] is False and description in body["description"]
    assert fake.sent(1) == []


async def test_fake_counts_length_after_entity_parsing(fake: FakeTelegram, http: aiohttp.ClientSession) -> None:
    text = "<b>" + "&amp;" * 4096 + "</b>"
    async with http.post(
        f"{fake.base_url}/bot{TOKEN}/sendMessage", json={"chat_id": 1, "text": text, "parse_mode": "HTML"}
    ) as resp:
        assert resp.status == 200


async def test_fake_edits_messages(fake: FakeTelegram, http: aiohttp.ClientSession) -> None:
    base = f"{fake.base_url}/bot{TOKEN}"
    async with http.post(f"{base}/sendMessage", json={"chat_id": 5, "text": "draft"}) as resp:
        message_id = (await resp.json())["result"]["message_id"]
    async with http.post(
        f"{base}/editMessageText", json={"chat_id": 5, "message_id": message_id, "text": "final"}
    ) as resp:
        assert resp.status == 200 and (await resp.json())["result"]["text"] == "final"
    async with http.post(
        f"{base}/editMessageText", json={"chat_id": 5, "message_id": message_id, "text": "final"}
    ) as resp:
        assert resp.status == 400 and "message is not modified" in (await resp.json())["description"]
    async with http.post(f"{base}/editMessageText", json={"chat_id": 5, "message_id": 999, "text": "x"}) as resp:
        assert resp.status == 400 and "message to edit not found" in (await resp.json())["description"]


async def test_fake_webhook_methods(fake: FakeTelegram, http: aiohttp.ClientSession) -> None:
    base = f"{fake.base_url}/bot{TOKEN}"
    async with http.post(f"{base}/setWebhook", data={"url": "https://h/webhooks/telegram", "secret_token": "abc"}):
        pass
    async with http.post(f"{base}/getWebhookInfo") as resp:
        assert (await resp.json())["result"]["url"] == "https://h/webhooks/telegram"
    async with http.post(f"{base}/deleteWebhook") as resp:
        assert (await resp.json())["result"] is True
    async with http.post(f"{base}/getWebhookInfo") as resp:
        assert (await resp.json())["result"]["url"] == ""


async def test_fake_inspection_routes(fake: FakeTelegram, http: aiohttp.ClientSession) -> None:
    base = f"{fake.base_url}/bot{TOKEN}"
    for chat, text in [(1, "a"), (2, "b"), (1, "c")]:
        async with http.post(f"{base}/sendMessage", json={"chat_id": chat, "text": text}):
            pass
    async with http.get(f"{fake.base_url}/_fake/calls", params={"chat_id": "1"}) as resp:
        calls = await resp.json()
    assert [(c["seq"], c["method"], c["params"]["text"]) for c in calls] == [
        (1, "sendMessage", "a"),
        (3, "sendMessage", "c"),
    ]
    async with http.get(f"{fake.base_url}/_fake/calls", params={"since": "1"}) as resp:
        assert [c["params"]["text"] for c in await resp.json()] == ["b", "c"]

    async def later() -> None:
        async with http.post(f"{base}/sendMessage", json={"chat_id": 9, "text": "late"}):
            pass

    waiting = asyncio.ensure_future(http.get(f"{fake.base_url}/_fake/calls", params={"chat_id": "9", "wait": "20"}))
    await asyncio.sleep(0)
    await later()
    async with await waiting as resp:
        assert [c["params"]["text"] for c in await resp.json()] == ["late"]

    async with http.post(f"{fake.base_url}/_fake/rate_limit", json={"count": 1, "retry_after": 4}) as resp:
        assert resp.status == 200
    async with http.post(f"{base}/sendMessage", json={"chat_id": 9, "text": "x"}) as resp:
        assert resp.status == 429 and (await resp.json())["parameters"] == {"retry_after": 4}
    async with http.get(f"{fake.base_url}/_fake/calls", params={"chat_id": "9", "include_failed": "1"}) as resp:
        assert [c["status"] for c in await resp.json()] == [200, 429]


def test_sign_update_is_what_telegram_sends() -> None:
    update = make_update("héllo", chat_id=-5, update_id=77, chat_type="group", mention=BOT, thread_id=3)
    body, headers = sign_update(update, SECRET)
    assert json.loads(body) == update
    assert headers == {"Content-Type": "application/json", SECRET_HEADER: SECRET}
    message = update["message"]
    assert message["text"] == f"@{BOT} héllo"
    assert message["entities"] == [{"type": "mention", "offset": 0, "length": len(BOT) + 1}]
    assert message["message_thread_id"] == 3 and message["is_topic_message"] is True


# ── through the real gateway: webhook route, durable ingest, worker, reply on the fake ──────────


@pytest.fixture
def gateway_env(base_env: dict[str, str], fake: FakeTelegram) -> dict[str, str]:
    return {
        **base_env,
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": TOKEN,
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": fake.base_url,
    }


async def keyspace(redis_url: str) -> list[bytes]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        return sorted(await client.keys("*"))
    finally:
        await client.aclose()


async def test_the_webhook_route_checks_the_secret_then_ingests_once(
    aiohttp_client: Any, gateway_env: dict[str, str], redis_url: str
) -> None:
    from switchboard.app import create_app
    from switchboard.settings import load_settings

    client = await aiohttp_client(create_app(load_settings(gateway_env)))
    update = make_update("hello gateway", chat_id=501, update_id=31337)
    body, headers = sign_update(update, SECRET)
    before = await keyspace(redis_url)
    for bad in ({}, {SECRET_HEADER: "wrong"}, {SECRET_HEADER: SECRET.upper()}):
        resp = await client.post("/webhooks/telegram", data=body, headers={"Content-Type": "application/json", **bad})
        assert resp.status in (401, 403)
    resp = await client.post("/webhooks/telegram", data=b"{not json", headers=headers)
    assert resp.status == 400
    group = make_update("chatter", chat_id=-5, update_id=31338, chat_type="group")
    resp = await client.post("/webhooks/telegram", data=sign_update(group, SECRET)[0], headers=headers)
    assert resp.status == 200
    assert await keyspace(redis_url) == before  # refused and ignored requests wrote nothing

    for _ in range(2):  # Telegram retrying the same update
        resp = await client.post("/webhooks/telegram", data=body, headers=headers)
        assert resp.status == 200
    session = "default/assistant/telegram/default/501"
    redis = aioredis.Redis.from_url(redis_url)
    try:
        inbox = await redis.lrange(SessionKeys(SessionKey(session)).inbox, 0, -1)
        assert len(inbox) == 1
    finally:
        await redis.aclose()


async def test_a_private_message_is_answered_on_telegram(
    aiohttp_client: Any, gateway_env: dict[str, str], fake: FakeTelegram
) -> None:
    from switchboard.app import create_app
    from switchboard.settings import load_settings
    from switchboard.worker import run_worker

    slow = {**gateway_env, "SWITCHBOARD_OFFLINE__DELAY_MS": "1500"}  # a run long enough to show typing
    client = await aiohttp_client(create_app(load_settings(slow)))
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(load_settings(slow), stop))
    update = make_update("ping **from** telegram", chat_id=501, update_id=5, message_id=44)
    body, headers = sign_update(update, SECRET)
    resp = await client.post("/webhooks/telegram", data=body, headers=headers)
    assert resp.status == 200

    async def first_reply() -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as http:
            params = {"chat_id": "501", "wait": "30"}
            async with http.get(f"{fake.base_url}/_fake/calls", params=params) as reply:
                found: list[dict[str, Any]] = await reply.json()
                return found

    poll = asyncio.ensure_future(first_reply())
    try:
        await asyncio.wait({poll, worker}, return_when=asyncio.FIRST_COMPLETED)
        if worker.done():
            worker.result()  # the worker died: show why
        calls = await poll
    finally:
        stop.set()
        poll.cancel()
        await asyncio.wait_for(asyncio.gather(worker, return_exceptions=True), 30)
    [call] = calls
    assert "ping from telegram" in check_html(call["params"]["text"])
    assert call["params"]["parse_mode"] == "HTML"
    assert call["params"]["reply_parameters"]["message_id"] == 44
    typing = fake.sent(501, method="sendChatAction")
    assert typing, "a typing action while the run was in progress"
    assert typing[0].seq < fake.sent(501)[0].seq, "typing shows before the reply"
