"""The Telegram adapter, inbound: the secret check and every sample Update normalised into an inbound event."""

from __future__ import annotations

import hmac
import json
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from switchboard.channels.base import OK_JSON, RawRequest
from switchboard.channels.telegram import adapter as telegram_module
from switchboard.channels.telegram.adapter import CAPABILITIES, GROUP_CAPABILITIES, TelegramChannel
from switchboard.channels.telegram.settings import TelegramSettings
from switchboard.core.inbound import event_text, plan_turn
from switchboard.core.messages import (
    Attachment,
    ChoiceSelected,
    CommandIssued,
    Contact,
    ConversationRef,
    InboundEvent,
    InboundMessage,
    Location,
    MessageEdited,
    Posted,
)
from switchboard.errors import MalformedBodyError, SignatureError
from tests.fakes.telegram_api import SECRET_HEADER, FakeTelegram, make_update, sign_update

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


async def drafts(adapter: TelegramChannel, raw: RawRequest) -> list[InboundMessage]:
    inbound = await adapter.receive(raw)
    assert inbound.answer == OK_JSON
    return list(inbound.messages)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        yield server


@pytest.fixture
async def channel(fake: FakeTelegram) -> AsyncIterator[TelegramChannel]:
    adapter = TelegramChannel(settings(fake.base_url), account="default")
    await adapter.start()
    yield adapter
    await adapter.aclose()


# ── the case table: every sample payload, and what the adapter makes of it ─────────────────────────


@dataclass(frozen=True)
class Expect:
    text: str
    chat: int
    chat_type: str
    event: InboundEvent = field(default_factory=Posted)
    thread: str | None = None
    mentioned: bool = False
    replied: bool = False
    sender_name: str = "Ada Lovelace"


MALFORMED = "malformed"
IGNORED = None
GROUP, SMALL_GROUP, FORUM = -1001234567890, -4200, -1009876543210


def photo(ref: str, size: int | None) -> Posted:
    return Posted(attachments=(Attachment(kind="image", ref=ref, mime_type="image/jpeg", size=size),))


CASES: dict[str, Expect | Literal["malformed"] | None] = {
    "private_text": Expect("Hello there, what can you do?", 501, "private"),
    "private_command": Expect("", 501, "private", CommandIssued(name="start")),
    "private_command_ask": Expect("what is the time in Tokyo?", 501, "private", CommandIssued(name="ask")),
    "private_command_stop": Expect("", 501, "private", CommandIssued(name="stop")),
    "private_photo_caption": Expect("What is in this picture?", 501, "private", photo("AgAD2", 52000)),
    "private_photo_no_caption": Expect("", 501, "private", photo("AgAD3", None)),
    "private_document": Expect(
        "Summarise this",
        501,
        "private",
        Posted(
            attachments=(
                Attachment(kind="document", ref="BQAD-doc", name="report.pdf", mime_type="application/pdf", size=48213),
            )
        ),
    ),
    "private_voice": Expect(
        "",
        501,
        "private",
        Posted(attachments=(Attachment(kind="voice", ref="AwAD-voice", mime_type="audio/ogg", size=9120),)),
    ),
    "private_audio": Expect(
        "",
        501,
        "private",
        Posted(
            attachments=(
                Attachment(kind="audio", ref="CQAD-audio", name="interview.mp3", mime_type="audio/mpeg", size=2880000),
            )
        ),
    ),
    "private_video_caption": Expect(
        "What happens at the end?",
        501,
        "private",
        Posted(attachments=(Attachment(kind="video", ref="BAAD-video", mime_type="video/mp4", size=1500000),)),
    ),
    "private_location": Expect("", 501, "private", Posted(shared=(Location(latitude=52.520008, longitude=13.404954),))),
    "private_venue": Expect(
        "",
        501,
        "private",
        Posted(
            shared=(
                Location(
                    latitude=52.521918,
                    longitude=13.413215,
                    name="Alexanderplatz",
                    address="Alexanderplatz, 10178 Berlin",
                ),
            )
        ),
    ),
    "private_contact": Expect(
        "", 501, "private", Posted(shared=(Contact(name="Grace Hopper", phones=("+4915112345678",)),))
    ),
    "edited_live_location": IGNORED,
    "private_sticker": IGNORED,
    "private_from_bot": IGNORED,
    "group_mention": Expect("what's the deploy status?", GROUP, "supergroup", mentioned=True),
    "group_mention_middle": Expect("hey summarise this thread", GROUP, "supergroup", mentioned=True),
    "group_mention_after_emoji": Expect("🚀 ship it?", GROUP, "supergroup", mentioned=True),
    "group_no_mention": IGNORED,
    "group_mention_other_bot": IGNORED,
    "group_text_mention": Expect("please translate this", SMALL_GROUP, "group", mentioned=True),
    "group_command_to_bot": Expect(
        "how many users signed up?", GROUP, "supergroup", CommandIssued(name="ask"), mentioned=True
    ),
    "group_bare_command": IGNORED,
    "group_bare_command_for_other_bot": IGNORED,
    "group_command_to_other_bot": IGNORED,
    "group_reply_to_bot": Expect("and what about staging?", GROUP, "supergroup", replied=True),
    "group_photo_reply_to_bot": Expect("", GROUP, "supergroup", photo("AgAD-l", 120000), replied=True),
    "group_reply_to_other_bot": IGNORED,
    "group_reply_to_human": IGNORED,
    "group_mention_from_bot": IGNORED,
    "group_edited_mention": Expect(
        "what's the deploy status now?", GROUP, "supergroup", MessageEdited(original_id="68"), mentioned=True
    ),
    "forum_topic_mention": Expect("reset my password", FORUM, "supergroup", thread="77", mentioned=True),
    "forum_topic_in_bot_topic_no_mention": IGNORED,
    "edited_message": Expect("Hello there (edited)", 501, "private", MessageEdited(original_id="11")),
    "callback_query": Expect(
        "ap:123",
        501,
        "private",
        ChoiceSelected(option_id="ap:123", offer_message_id="50", ack_ref="4382bfdwdsb323b2d9"),
    ),
    "callback_query_in_topic": Expect(
        "Production (EU)",
        FORUM,
        "supergroup",
        ChoiceSelected(option_id="env:prod", offer_message_id="90", ack_ref="5512cb-topic"),
        thread="77",
    ),
    "callback_query_game": IGNORED,
    "callback_query_inline_mode": IGNORED,
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


def _message_of(data: dict[str, Any]) -> dict[str, Any]:
    for kind in ("message", "edited_message"):
        if kind in data:
            found: dict[str, Any] = data[kind]
            return found
    message: dict[str, Any] = data["callback_query"]["message"]
    return message


@pytest.mark.parametrize("name", sorted(CASES))
async def test_sample_payload(channel: TelegramChannel, name: str) -> None:
    body = (PAYLOADS / f"{name}.json").read_bytes()
    raw = request(body, {SECRET_HEADER: SECRET, "Content-Type": "application/json"})
    await channel.verify(raw)
    expected = CASES[name]
    if expected == MALFORMED:
        with pytest.raises(MalformedBodyError) as caught:
            await channel.receive(raw)
        assert caught.value.status == 400
        return
    if expected is IGNORED:
        inbound = await channel.receive(raw)
        assert inbound.messages == ()
        query = json.loads(body).get("callback_query")
        if query is None:
            assert inbound.answer == OK_JSON
        else:  # a tap no turn will answer (a game's, an inline-mode message's): answered with the webhook's answer
            answer = json.loads(inbound.answer.body)
            assert answer == {"method": "answerCallbackQuery", "callback_query_id": query["id"]}
            assert inbound.answer.status == 200 and inbound.answer.content_type == "application/json"
        return
    found = await drafts(channel, raw)  # a tap that is queued is answered by the worker: the plain OK here
    assert isinstance(expected, Expect)
    data = json.loads(body)
    message = _message_of(data)
    [draft] = found
    assert draft.id == ""
    assert draft.dedup_key == str(data["update_id"])
    assert draft.event == expected.event
    assert draft.text == expected.text
    assert draft.platform_message_id == str(message["message_id"])
    assert draft.sender.id == "501" and draft.sender.name == expected.sender_name and not draft.sender.is_bot
    ref = draft.conversation
    assert (ref.tenant, ref.agent, ref.channel, ref.account) == ("default", "", "telegram", "default")
    assert ref.conversation == str(expected.chat) and ref.thread == expected.thread
    assert ref.extra["chat_id"] == str(expected.chat)
    assert ref.extra["chat_type"] == expected.chat_type
    assert ref.extra["reply_to_message_id"] == str(message["message_id"])
    assert ref.extra.get("message_thread_id") == expected.thread
    assert draft.meta == {
        "chat_type": expected.chat_type,
        "mentioned": expected.mentioned,
        "replied_to_bot": expected.replied,
    }
    thread = f"/{expected.thread}" if expected.thread else ""
    routed = draft.conversation.model_copy(update={"agent": "assistant", "tenant": "acme"})
    assert routed.session_key == f"acme/assistant/telegram/default/{expected.chat}{thread}"


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
async def test_a_missing_or_wrong_secret_is_refused_before_the_body_is_read(
    headers: dict[str, str], status: int
) -> None:
    adapter = TelegramChannel(settings())
    raw = request(b"{ this is not JSON", headers)  # parsing it would raise MalformedBodyError, not SignatureError
    with pytest.raises(SignatureError) as caught:
        await adapter.verify(raw)
    assert caught.value.status == status
    assert SECRET not in str(caught.value)


async def test_thousands_of_mutated_secrets_are_all_refused() -> None:
    """Bit flips, truncations, extensions, case changes and stray bytes: every one is 401/403, none is accepted."""
    adapter = TelegramChannel(settings())
    body, _ = sign_update(make_update("hi", chat_id=1, update_id=1), SECRET)
    rng = random.Random(8)
    secret = SECRET.encode()
    mutants: set[str] = set()
    for index in range(len(secret) * 8):  # every single-bit flip
        flipped = bytearray(secret)
        flipped[index // 8] ^= 1 << (index % 8)
        mutants.add(flipped.decode("latin-1"))
    while len(mutants) < 3000:
        raw = bytearray(secret)
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(4)
            if op == 0 and raw:
                raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
            elif op == 1 and raw:
                del raw[rng.randrange(len(raw))]
            elif op == 2:
                raw.insert(rng.randrange(len(raw) + 1), rng.randrange(256))
            else:  # change the case of one letter
                letters = [i for i, c in enumerate(raw) if chr(c).isascii() and chr(c).isalpha()]
                if letters:
                    raw[rng.choice(letters)] ^= 0x20
        mutants.add(raw.decode("latin-1"))
        mutants.discard(SECRET)
    statuses: dict[int, int] = {}
    for mutant in mutants:
        with pytest.raises(SignatureError) as caught:
            await adapter.verify(request(body, {SECRET_HEADER: mutant}))
        statuses[caught.value.status] = statuses.get(caught.value.status, 0) + 1
    assert set(statuses) == {403} and sum(statuses.values()) == len(mutants) >= 3000
    await adapter.verify(request(body, {SECRET_HEADER: SECRET}))  # the real one still passes


async def test_a_repeated_secret_header_is_refused() -> None:
    adapter = TelegramChannel(settings())
    headers: CIMultiDict[str] = CIMultiDict([(SECRET_HEADER, SECRET), (SECRET_HEADER, "other")])
    with pytest.raises(SignatureError) as caught:
        await adapter.verify(request(b"{}", headers))
    assert caught.value.status == 403


async def test_the_header_name_is_case_insensitive_even_in_a_plain_dict() -> None:
    adapter = TelegramChannel(settings())
    body, _ = sign_update(make_update("hi", chat_id=1, update_id=1), SECRET)
    await adapter.verify(RawRequest("POST", "/", {SECRET_HEADER.lower(): SECRET}, {}, body))
    await adapter.verify(request(body, {SECRET_HEADER.upper(): SECRET}))


async def test_the_secret_is_compared_in_constant_time_on_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[object, object]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(telegram_module.hmac, "compare_digest", spy)
    adapter = TelegramChannel(settings())
    await adapter.verify(signed(make_update("hi", chat_id=1, update_id=1)))
    assert seen == [(SECRET.encode(), SECRET.encode())]


async def test_without_a_configured_secret_every_request_is_refused() -> None:
    adapter = TelegramChannel(settings(secret_token=None))
    with pytest.raises(SignatureError) as caught:
        await adapter.verify(signed(make_update("hi", chat_id=1, update_id=1), secret="anything"))
    assert caught.value.status == 403
    assert "SWITCHBOARD_TELEGRAM__SECRET_TOKEN" in str(caught.value)


# ── parsing rules beyond the sample payloads ────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'"text"',
        b"\xff\xfe\x00",
        b'{"update_id": true}',
        b'{"update_id": "12"}',
        b'{"update_id": 1, "callback_query": {"id": "", "from": {"id": 1, "is_bot": false, "first_name": "A"}}}',
        b'{"update_id": 1, "message": {"message_id": 1, "date": 1, "chat": {"id": 1, "type": "private"}, '
        b'"photo": [{"file_id": 7}]}}',
    ],
)
async def test_malformed_bodies_are_a_400(body: bytes) -> None:
    adapter = TelegramChannel(settings())
    with pytest.raises(MalformedBodyError) as caught:
        await adapter.receive(request(body, {SECRET_HEADER: SECRET}))
    assert caught.value.status == 400 and caught.value.channel == "telegram"


async def test_the_dedup_key_is_the_update_id() -> None:
    adapter = TelegramChannel(settings())
    first = await drafts(adapter, signed(make_update("same", chat_id=501, update_id=424242)))
    again = await drafts(adapter, signed(make_update("same", chat_id=501, update_id=424242)))
    other = await drafts(adapter, signed(make_update("same", chat_id=501, update_id=424243)))
    assert first[0].dedup_key == again[0].dedup_key == "424242"
    assert other[0].dedup_key == "424243"


async def test_with_the_username_configured_mentions_work_without_getme() -> None:
    adapter = TelegramChannel(settings(bot_username="@Switchboard_Test_Bot"))
    group = make_update("status?", chat_id=-5, update_id=1, chat_type="group", mention=BOT)
    [draft] = await drafts(adapter, signed(group))
    assert draft.text == "status?"


async def test_without_require_mention_every_group_message_counts() -> None:
    adapter = TelegramChannel(settings(), require_mention=False)
    [draft] = await drafts(adapter, signed(make_update("lunch?", chat_id=-5, update_id=1, chat_type="group")))
    assert draft.text == "lunch?" and draft.meta["mentioned"] is False
    strict = TelegramChannel(settings())
    assert await drafts(strict, signed(make_update("lunch?", chat_id=-5, update_id=1, chat_type="group"))) == []


async def test_getme_teaches_the_username(fake: FakeTelegram) -> None:
    adapter = TelegramChannel(settings(fake.base_url))
    group = make_update("status?", chat_id=-5, update_id=1, chat_type="group", mention=BOT)
    try:
        assert adapter.bot_username is None
        assert await drafts(adapter, signed(group)) == []  # the mention cannot be recognised yet
        await adapter.start()
        assert adapter.bot_username == BOT and adapter.bot_id == 123456
        assert [d.text for d in await drafts(adapter, signed(group))] == ["status?"]
    finally:
        await adapter.aclose()
    assert [c.method for c in fake.calls] == ["getMe"]


async def test_an_unreachable_api_at_start_leaves_replies_working(caplog: pytest.LogCaptureFixture) -> None:
    gone = FakeTelegram(token=TOKEN)
    base_url = await gone.start()
    await gone.stop()
    adapter = TelegramChannel(settings(base_url, bot_token="not-a-numeric-token"))
    try:
        with caplog.at_level(logging.WARNING, logger="switchboard.channels.telegram.adapter"):
            await adapter.start()
    finally:
        await adapter.aclose()
    assert "getMe failed" in caplog.text
    assert adapter.bot_username is None and adapter.bot_id is None
    mention = make_update("hi", chat_id=-5, update_id=1, chat_type="group", mention=BOT)
    reply = make_update("and then?", chat_id=-5, update_id=2, chat_type="group", reply_to_bot="some_bot", bot_id=9)
    assert await drafts(adapter, signed(mention)) == []
    assert [d.text for d in await drafts(adapter, signed(reply))] == ["and then?"]


async def test_a_reply_to_another_bot_does_not_count_once_the_bot_id_is_known() -> None:
    adapter = TelegramChannel(settings())  # the id comes from the token: 123456
    other = make_update("x", chat_id=-5, update_id=1, chat_type="group", reply_to_bot="ci_bot", bot_id=99)
    ours = make_update("y", chat_id=-5, update_id=2, chat_type="group", reply_to_bot="whatever", bot_id=123456)
    assert await drafts(adapter, signed(other)) == []
    assert [d.text for d in await drafts(adapter, signed(ours))] == ["y"]


async def test_a_bare_mention_with_nothing_to_say_is_dropped() -> None:
    adapter = TelegramChannel(settings(bot_username=BOT))
    update = make_update("", chat_id=-5, update_id=1, chat_type="group", mention=BOT)
    update["message"]["text"] = update["message"]["text"].strip()
    assert await drafts(adapter, signed(update)) == []


async def test_messages_and_taps_from_the_bot_itself_are_dropped() -> None:
    adapter = TelegramChannel(settings())
    own = make_update("echo", chat_id=501, update_id=1, user_id=123456, is_bot=True)
    assert await drafts(adapter, signed(own)) == []
    data = json.loads((PAYLOADS / "callback_query.json").read_bytes())
    data["callback_query"]["from"] = {"id": 123456, "is_bot": True, "first_name": "Bot"}
    assert (await adapter.receive(signed(data))).messages == ()  # (its spinner stopped by the webhook's answer)


async def test_a_command_with_a_mention_after_it_strips_both() -> None:
    adapter = TelegramChannel(settings(bot_username=BOT))
    text = f"/ask@{BOT} what does @{BOT} know?"
    entities = [
        {"type": "bot_command", "offset": 0, "length": len(f"/ask@{BOT}")},
        {"type": "mention", "offset": text.index("@", 5), "length": len(BOT) + 1},
    ]
    update = make_update(text, chat_id=-5, update_id=1, chat_type="group")
    update["message"]["entities"] = entities
    [draft] = await drafts(adapter, signed(update))
    assert draft.event == CommandIssued(name="ask") and draft.text == "what does know?"


async def test_a_bare_group_command_follows_the_rule_of_any_group_message() -> None:
    data = json.loads((PAYLOADS / "group_bare_command.json").read_bytes())  # a bare /reset in a supergroup
    strict, open_group = TelegramChannel(settings()), TelegramChannel(settings(), require_mention=False)
    assert await drafts(strict, signed(data)) == []  # may be for any bot of the group
    [taken] = await drafts(open_group, signed(data))
    assert taken.event == CommandIssued(name="reset")
    data["message"]["reply_to_message"] = {"message_id": 60, "from": {"id": 123456, "is_bot": True, "first_name": "B"}}
    [reply] = await drafts(strict, signed(data))  # a reply to this bot addresses it
    assert reply.event == CommandIssued(name="reset") and reply.meta["replied_to_bot"] is True
    other = json.loads((PAYLOADS / "group_command_to_other_bot.json").read_bytes())
    assert await drafts(open_group, signed(other)) == []  # /cmd@otherbot is never ours, whatever the setting


@pytest.mark.parametrize(
    ("name", "reads"),
    [
        ("private_location", "[location: 52.520008, 13.404954]"),
        ("private_venue", "[location: 52.521918, 13.413215 — Alexanderplatz, Alexanderplatz, 10178 Berlin]"),
        ("private_contact", "[contact: Grace Hopper, +4915112345678]"),
    ],
)
async def test_a_shared_place_or_contact_is_what_the_agent_reads(name: str, reads: str) -> None:
    [draft] = await drafts(TelegramChannel(settings()), request((PAYLOADS / f"{name}.json").read_bytes()))
    assert event_text(draft) == reads and plan_turn([draft]).kind == "model"


# ── capabilities ────────────────────────────────────────────────────────────────────────────────


def test_capabilities_depend_on_the_kind_of_chat() -> None:
    adapter = TelegramChannel(settings())
    private = ConversationRef(channel="telegram", conversation="501", extra={"chat_id": "501", "chat_type": "private"})
    group = ConversationRef(channel="telegram", conversation="-100", extra={"chat_id": "-100"})
    assert adapter.capabilities == CAPABILITIES == adapter.capabilities_for(private)
    assert adapter.capabilities_for(group) == GROUP_CAPABILITIES
    assert CAPABILITIES.streaming == "native" and GROUP_CAPABILITIES.streaming == "edits"
    assert (CAPABILITIES.max_text, CAPABILITIES.text_unit, CAPABILITIES.edits) == (4096, "utf16", True)
    assert GROUP_CAPABILITIES.chat_rate.per_s < CAPABILITIES.chat_rate.per_s
    assert adapter.name == "telegram" and adapter.account == "default"
    assert adapter.listener() is None
    assert TelegramChannel(settings(transport="polling")).listener() is not None
