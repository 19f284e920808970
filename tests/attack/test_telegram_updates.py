"""Hostile Telegram updates: wire types read strictly, the same by the webhook and by polling.

A wrongly typed update is a 400 on the webhook (nothing enqueued) and refused by polling; an update the gateway does
not read makes no message and no error. Real sockets, real Redis, the real models.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis
from multidict import CIMultiDict, CIMultiDictProxy
from pydantic import ValidationError

from switchboard.channels.base import OK_JSON, RawRequest
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.channels.telegram.fake.platform import SECRET_HEADER, FakeTelegram, make_update, sign_update
from switchboard.channels.telegram.settings import TelegramSettings
from switchboard.core.messages import Attachment, CommandIssued
from switchboard.errors import MalformedBodyError
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from tests.attack.test_metrics import series

TOKEN, BOT_ID, BOT, SECRET = "123456:TEST-token-abcdefghijklmnopqrstuv", 123456, "hostile_bot", "hostile-Secret_1"
PAYLOADS = Path(__file__).resolve().parent.parent / "payloads" / "telegram"
DELETE = object()
BASE = make_update("hi there", chat_id=501, update_id=7)
HUMAN, OUR_BOT = {"id": 501, "is_bot": False, "first_name": "Ada"}, {"id": BOT_ID, "is_bot": True, "first_name": "B"}
GROUP = {"id": -5, "type": "group"}
INGEST = ("switchboard_messages_accepted_", "switchboard_messages_deduplicated_")


def adapter() -> TelegramChannel:
    values = {"bot_token": TOKEN, "secret_token": SECRET, "api_base_url": "http://127.0.0.1:9", "bot_username": BOT}
    return TelegramChannel(TelegramSettings.model_validate(values))


def changed(*edits: tuple[tuple[Any, ...], Any], base: dict[str, Any] = BASE) -> dict[str, Any]:
    update = copy.deepcopy(base)
    for path, value in edits:
        parent = update
        for key in path[:-1]:
            parent = parent[key]
        if value is DELETE:
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
    return update


async def received(channel: TelegramChannel, body: bytes) -> list[dict[str, Any]] | None:
    """The drafts of a webhook body, or ``None`` for a 400; any other exception fails the test."""
    headers = CIMultiDictProxy(CIMultiDict({SECRET_HEADER: SECRET}))
    try:
        inbound = await channel.receive(RawRequest("POST", "/webhooks/telegram", headers, {}, body))
    except MalformedBodyError as err:
        assert err.status == 400 and err.channel == "telegram"
        return None
    if inbound.answer != OK_JSON:  # a tap no turn will answer is acknowledged in the webhook's own answer
        query = json.loads(body)["callback_query"]
        assert not inbound.messages
        assert json.loads(inbound.answer.body) == {"method": "answerCallbackQuery", "callback_query_id": query["id"]}
    return [m.model_dump(exclude={"received_at"}) for m in inbound.messages]


def polled(channel: TelegramChannel, update: Any) -> list[dict[str, Any]] | None:
    """The drafts of a ``getUpdates`` item, or ``None`` when it is refused (``ValidationError``, nothing else)."""
    try:
        return [m.model_dump(exclude={"received_at"}) for m in channel.read_update(update)]
    except ValidationError:
        return None


MSG, CB = ("message",), ("callback_query",)
CALLBACK = {"update_id": 8, "callback_query": {"id": "q1", "from": HUMAN, "data": "yes"}}
MALFORMED = {
    "update_id bool": changed((("update_id",), True)),
    "update_id float": changed((("update_id",), 7.0)),
    "update_id negative": changed((("update_id",), -1)),
    "message is a list": changed((MSG, [])),
    "chat null": changed(((*MSG, "chat"), None)),
    "date string": changed(((*MSG, "date"), "1")),
    "sender id bool": changed(((*MSG, "from", "id"), True)),
    "is_bot string": changed(((*MSG, "from", "is_bot"), "false")),
    "text int": changed(((*MSG, "text"), 5)),
    "entity offset negative": changed(((*MSG, "entities"), [{"type": "mention", "offset": -1, "length": 1}])),
    "entity length float": changed(((*MSG, "entities"), [{"type": "mention", "offset": 0, "length": 1.0}])),
    "entity user bool": changed(((*MSG, "entities"), [{"type": "text_mention", "offset": 0, "length": 1, "user": 1}])),
    "photo size without file_id": changed(((*MSG, "photo"), [{"file_id": "a"}, {"width": 9, "height": 9}])),
    "photo empty file_id": changed(((*MSG, "photo"), [{"file_id": ""}])),
    "document negative size": changed(((*MSG, "document"), {"file_id": "d", "file_size": -1})),
    "topic flag int": changed(((*MSG, "is_topic_message"), 1)),
    "button text int": changed(((*MSG, "reply_markup"), {"inline_keyboard": [[{"text": 1}]]})),
    "forum_topic_created list": changed(((*MSG, "forum_topic_created"), [1])),
    "callback from null": changed(((*CB, "from"), None), base=CALLBACK),
    "callback from_ only": changed(((*CB, "from_"), HUMAN), ((*CB, "from"), DELETE), base=CALLBACK),
    "callback message without chat": changed(((*CB, "message"), {"message_id": 1, "date": 0}), base=CALLBACK),
}


@pytest.mark.parametrize("update", MALFORMED.values(), ids=MALFORMED.keys())
async def test_a_wrongly_typed_update_is_a_400_on_the_webhook_and_refused_by_polling(update: dict[str, Any]) -> None:
    channel = adapter()
    assert await received(channel, json.dumps(update).encode()) is None
    assert polled(channel, update) is None


BASE_JSON, DEEP = json.dumps(BASE).encode(), b'{"a":' * 400 + b"1" + b"}" * 400
BAD_BYTES = {
    "empty": b"",
    "trailing garbage": BASE_JSON + b" x",
    "byte order mark": b"\xef\xbb\xbf" + BASE_JSON,
    "not utf-8": BASE_JSON.replace(b'"hi there"', b'"\xff\xfe hi"'),
    "lone high surrogate": BASE_JSON.replace(b'"hi there"', b'"\\ud800 hi"'),
    "nan": b'{"update_id": NaN}',
    "exponent int": b'{"update_id": 1e2}',
    "five thousand digits": b'{"update_id": ' + b"9" * 5000 + b"}",
    "deep array in an ignored key": b'{"update_id": 1, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "deep object in forum_topic_created": BASE_JSON[:-2] + b', "forum_topic_created": ' + DEEP + b"}}",
    "duplicate update_id, last negative": b'{"update_id": 1, "update_id": -1}',
}


@pytest.mark.parametrize("body", BAD_BYTES.values(), ids=BAD_BYTES.keys())
async def test_bytes_that_are_no_update_are_a_400(body: bytes) -> None:
    assert await received(adapter(), body) is None


async def test_a_body_that_is_not_an_object_is_told_so() -> None:
    """A body that is valid JSON but no object is told so (the adapter reports ``dict_type``, not ``model_type``)."""
    told = []
    for body in (b"[]", b"null", b"1", b'"update"', b"[{}]"):
        with pytest.raises(MalformedBodyError) as caught:
            await adapter().receive(RawRequest("POST", "/webhooks/telegram", CIMultiDictProxy(CIMultiDict()), {}, body))
        told.append(str(caught.value))
    assert told == ["body must be a JSON object (a Telegram Update)"] * 5


IGNORED = {
    "sender under from_": changed(((*MSG, "from_"), HUMAN), ((*MSG, "from"), DELETE)),
    "sender null": changed(((*MSG, "from"), None)),
    "message null": changed((MSG, None)),
    "unknown kinds only": {"update_id": 9, "channel_post": {"chat": 1}, "my_chat_member": {}, "from": HUMAN},
    "huge update_id and nothing else": {"update_id": 10**40},
    "photo list empty, no text": changed(((*MSG, "text"), DELETE), ((*MSG, "photo"), [])),
    "edit carrying only a photo": {
        "update_id": 3,
        "edited_message": changed(((*MSG, "text"), DELETE), ((*MSG, "photo"), [{"file_id": "p"}]))["message"],
    },
    "tap without message": CALLBACK,
    "tap with message null": changed(((*CB, "message"), None), base=CALLBACK),
    "tap by our own bot": changed(((*CB, "from"), OUR_BOT), ((*CB, "message"), BASE["message"]), base=CALLBACK),
    "mention entity far past the text": changed(
        ((*MSG, "chat"), GROUP),
        ((*MSG, "text"), "hello"),
        ((*MSG, "entities"), [{"type": "mention", "offset": 10**30, "length": 10**30}]),
    ),
}


@pytest.mark.parametrize("update", IGNORED.values(), ids=IGNORED.keys())
async def test_an_update_the_gateway_does_not_read_makes_no_message_and_no_error(update: dict[str, Any]) -> None:
    channel = adapter()
    assert await received(channel, json.dumps(update).encode()) == []
    assert polled(channel, update) == []


async def test_a_from_underscore_key_on_the_wire_never_speaks_for_the_sender() -> None:
    channel = adapter()
    spoofed = changed(((*MSG, "from_"), OUR_BOT))  # the human still sent it
    [draft] = await received(channel, json.dumps(spoofed).encode()) or [None]
    assert draft is not None and draft["sender"]["id"] == "501" and draft["text"] == "hi there"
    own = changed(((*MSG, "from"), OUR_BOT), ((*MSG, "from_"), HUMAN))  # the bot's own message stays dropped
    assert await received(channel, json.dumps(own).encode()) == [] == polled(channel, own)
    group = changed(((*MSG, "chat"), GROUP))
    fake_reply = changed(((*MSG, "reply_to_message"), {"from_": OUR_BOT}), base=group)
    real_reply = changed(((*MSG, "reply_to_message"), {"from": OUR_BOT}), base=group)
    assert await received(channel, json.dumps(fake_reply).encode()) == []
    [answered] = await received(channel, json.dumps(real_reply).encode()) or [None]
    assert answered is not None and answered["meta"]["replied_to_bot"] is True
    dup = BASE_JSON.replace(b'"from": {', b'"from": {"id": 123456, "is_bot": true, "first_name": "B"}, "from": {', 1)
    webhook = await received(channel, dup)  # a repeated key: the last wins, as json.loads has it for polling
    assert webhook == polled(channel, json.loads(dup)) and [d["sender"]["id"] for d in webhook or []] == ["501"]


async def test_a_valid_photo_command_normalises_as_before() -> None:
    caption = f"/Ask@{BOT} look"
    sizes = [
        {"file_id": "small", "width": 90, "height": 90, "file_size": 10},
        {"file_id": "large", "width": 800, "height": 600, "file_size": 9000, "file_unique_id": "u"},
        {"file_id": "middle", "width": 320, "height": 240},
    ]
    update = changed(
        ((*MSG, "text"), DELETE),
        ((*MSG, "photo"), sizes),
        ((*MSG, "caption"), caption),
        ((*MSG, "caption_entities"), [{"type": "bot_command", "offset": 0, "length": len(caption) - 5}]),
    )
    channel = adapter()
    [draft] = channel.read_update(update)
    assert draft.text == "look" and draft.sender.id == "501" and draft.sender.name == "Ada"
    image = Attachment(kind="image", ref="large", mime_type="image/jpeg", size=9000)
    assert draft.event == CommandIssued(name="ask", attachments=(image,))
    assert (draft.dedup_key, draft.platform_message_id, draft.conversation.conversation) == ("7", "10", "501")
    assert await received(channel, json.dumps(update).encode()) == [draft.model_dump(exclude={"received_at"})]
    long = changed(((*MSG, "text"), "é" * 1_000_000))
    assert [d["text"] for d in await received(channel, json.dumps(long).encode()) or []] == ["é" * 1_000_000]


async def test_two_thousand_mutated_samples_agree_between_webhook_and_polling_and_never_raise_otherwise() -> None:
    channel = adapter()
    samples = [json.loads(p.read_bytes()) for p in sorted(PAYLOADS.glob("*.json"))]
    values: list[Any] = [None, True, False, 0, -1, 2**64, 1.5, "", "/x", [], [{}], {}, HUMAN, OUR_BOT, {"file_id": "f"}]
    rng, read = random.Random(20240611), 0
    for _ in range(2000):
        update = copy.deepcopy(rng.choice(samples))
        for _ in range(rng.randint(1, 3)):
            spots: list[tuple[Any, Any]] = []
            stack: list[Any] = [update]
            while stack:
                node = stack.pop()
                keys = list(node) if isinstance(node, dict) else range(len(node)) if isinstance(node, list) else []
                spots += [(node, k) for k in keys]
                stack += [node[k] for k in keys]
            if not spots:
                break
            node, key = rng.choice(spots)
            if isinstance(node, dict) and rng.random() < 0.3:
                node[key + "_" if isinstance(key, str) and rng.random() < 0.5 else key] = node.pop(key)
            else:
                node[key] = copy.deepcopy(rng.choice(values))
        webhook = await received(channel, json.dumps(update).encode())
        assert webhook == polled(channel, update), update
        read += webhook is not None and len(webhook)
    assert read > 100  # the mutations left plenty of readable updates


# ── the webhook route: a 400 writes nothing ─────────────────────────────────────────────────────────


@pytest.fixture
async def gateway(base_env: dict[str, str], aiohttp_client: Any) -> AsyncIterator[Any]:
    async with FakeTelegram(token=TOKEN, username=BOT) as fake:
        env = base_env | {
            "SWITCHBOARD_TELEGRAM__BOT_TOKEN": TOKEN,
            "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
            "SWITCHBOARD_TELEGRAM__API_BASE_URL": fake.base_url,
        }
        yield await aiohttp_client(create_app(load_settings(env)))


async def test_hostile_bodies_over_http_are_400s_that_enqueue_nothing(gateway: Any, sync_redis: redis.Redis) -> None:
    before = sorted(sync_redis.keys("*"))
    headers = {"Content-Type": "application/json", SECRET_HEADER: SECRET}
    bodies = [json.dumps(u).encode() for u in MALFORMED.values()] + list(BAD_BYTES.values())
    for body in bodies:
        resp = await gateway.post("/webhooks/telegram", data=body, headers=headers)
        assert resp.status == 400, body[:80]
        assert (await resp.json())["error"]["code"] == "malformed_body"
    for update in IGNORED.values():
        resp = await gateway.post("/webhooks/telegram", data=json.dumps(update).encode(), headers=headers)
        assert resp.status == 200
    assert sorted(sync_redis.keys("*")) == before
    text = await (await gateway.get("/metrics")).text()
    assert not [k for k in series(text) if k[0].startswith(INGEST)]  # none counted yet
    body, signed = sign_update(make_update("hello", chat_id=501, update_id=99), SECRET)
    for _ in range(3):
        assert (await gateway.post("/webhooks/telegram", data=body, headers=signed)).status == 200
    found = series(await (await gateway.get("/metrics")).text())
    assert found[("switchboard_messages_accepted_total", (("channel", "telegram"),))] == 1
    assert found[("switchboard_messages_deduplicated_total", (("channel", "telegram"),))] == 2
    assert len([k for k in sync_redis.keys("sb:*:inbox")]) == 1
