"""Messenger through the real webhook route (``create_app``, real Redis): the case table, the handshake, routing by
Page, all-or-nothing deliveries, receipts as events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient

from switchboard.channels.meta.messaging.fake.payloads import sign_delivery
from switchboard.channels.meta.messaging.fake.platform import FakeMessenger
from switchboard.core.inbound import event_text
from switchboard.core.messages import (
    ChoiceSelected,
    InboundMessage,
    Location,
    MessageDeleted,
    MessageEdited,
    Posted,
)
from switchboard.queue.eventlog import read_events
from switchboard.settings import load_settings
from switchboard.web.app import create_app

PAYLOADS = Path(__file__).resolve().parent.parent / "payloads"
TOKEN = "EAAGtestpagetoken"
SECOND_TOKEN = "EAAGsecondpagetoken"
APP_SECRET = "6b1f0c1d2e3f40516273849a5b6c7d8e"
VERIFY = "verify-me-please"
PAGE, PAGE2 = "106000000000001", "106000000000002"
USER, USER2 = "24000000000000001", "24000000000000002"

AGENTS = """
default_agent: assistant
agents:
  assistant:
    profile: {name: Assistant}
    instructions: You are a test assistant.
    tools: [current_time]
  sales:
    profile: {name: Sales}
    instructions: You sell.
"""
CONFIG = (
    AGENTS
    + """channels:
  messenger:
    accounts:
      second:
        agent: sales
        secrets_from_env: {page_access_token: SECOND_PAGE_TOKEN, app_secret: SECOND_APP_SECRET}
        options: {page_id: "106000000000002"}
"""
)


def payload(channel: str, name: str) -> dict[str, Any]:
    """A sample delivery from ``tests/payloads/<channel>/``."""
    loaded: dict[str, Any] = json.loads((PAYLOADS / channel / name).read_text())
    return loaded


def gateway_env(base_env: dict[str, str], tmp_path: Path, graph_url: str, config_text: str = CONFIG) -> dict[str, str]:
    """Messenger's env block (Page one) plus a second Page of the same app from the YAML file."""
    config = tmp_path / "messenger.yaml"
    config.write_text(config_text)
    return base_env | {
        "SWITCHBOARD_CONFIG": str(config),
        "SWITCHBOARD_MESSENGER__PAGE_ACCESS_TOKEN": TOKEN,
        "SWITCHBOARD_MESSENGER__APP_SECRET": APP_SECRET,
        "SWITCHBOARD_MESSENGER__VERIFY_TOKEN": VERIFY,
        "SWITCHBOARD_MESSENGER__GRAPH_BASE_URL": graph_url,
        "SWITCHBOARD_MESSENGER__PAGE_ID": PAGE,
        "SWITCHBOARD_QUEUE__INGEST_TIMEOUT_S": "1.0",
        "SECOND_PAGE_TOKEN": SECOND_TOKEN,
        "SECOND_APP_SECRET": APP_SECRET,
    }


def stored(r: redis.Redis) -> list[InboundMessage]:
    """Every message the ingest holds, oldest first per session."""
    found = []
    for key in r.keys("sb:*:messages"):
        found += [InboundMessage.model_validate_json(v) for v in r.hvals(key)]
    return sorted(found, key=lambda m: (m.conversation.session_key, m.dedup_key))


def inbox_total(r: redis.Redis) -> int:
    """How many messages wait in every session's inbox."""
    return sum(int(r.llen(key)) for key in r.keys("sb:*:inbox"))


def keyspace(r: redis.Redis) -> list[bytes]:
    return sorted(r.keys("*"))


@pytest.fixture
async def fake() -> AsyncIterator[FakeMessenger]:
    async with FakeMessenger("messenger", token=TOKEN) as server:
        yield server


@pytest.fixture
async def client(base_env: dict[str, str], tmp_path: Path, fake: FakeMessenger, aiohttp_client: Any) -> TestClient:
    app = create_app(load_settings(gateway_env(base_env, tmp_path, fake.graph_url)), listeners=False)
    return await aiohttp_client(app)  # type: ignore[no-any-return]


# (file, [(account, user, kind, text, detail)]) — detail: option id, original mid, or attachment kinds
CASES: list[tuple[str, list[tuple[str, str, str, str, Any]]]] = [
    ("text.json", [("default", USER, "message", "Hello, café ☕ — what are your hours?", ())]),
    ("image.json", [("default", USER, "message", "", ("image",))]),
    ("video.json", [("default", USER, "message", "", ("video",))]),
    ("audio.json", [("default", USER, "message", "", ("audio",))]),
    ("file.json", [("default", USER, "message", "", ("document",))]),
    ("image_with_text.json", [("default", USER, "message", "is this broken?", ("image", "image"))]),
    ("sticker.json", [("default", USER, "message", "[sticker]", ())]),
    ("location.json", [("default", USER, "message", "", ())]),
    ("reply.json", [("default", USER, "message", "yes, that one", ())]),
    ("reaction.json", [("default", USER, "message", "[reacted ❤ to message m_fake00000001]", ())]),
    ("unreact.json", []),
    ("quick_reply.json", [("default", USER, "choice", "Tomorrow", "slot-tomorrow")]),
    ("postback.json", [("default", USER, "choice", "Approve", "approve:123")]),
    ("message_edit.json", [("default", USER, "edited", "Hello, what are your hours on Sunday?", "m_text1")]),
    ("echo.json", []),
    ("delivery.json", []),
    ("read.json", []),
    ("standby.json", []),
    ("optin.json", []),
    ("unknown_page.json", []),
    (
        "multi_entry.json",
        [
            ("default", USER, "message", "first", ()),
            ("default", USER2, "message", "second", ()),
            ("second", USER, "message", "third, to the other page", ()),
        ],
    ),
]


def test_every_payload_file_is_in_the_table() -> None:
    assert sorted(p.name for p in (PAYLOADS / "messenger").glob("*.json")) == sorted(name for name, _ in CASES)


def check(message: InboundMessage, expected: tuple[str, str, str, str, Any], channel: str, sales: str) -> None:
    """``message`` is what the case table expects; account ``sales`` routes to the agent of that name."""
    account, user, kind, text, detail = expected
    conversation = message.conversation
    assert (conversation.channel, conversation.account, conversation.conversation) == (channel, account, user)
    assert conversation.agent == ("sales" if account == sales else "assistant")
    assert message.sender.id == user and message.text == text
    event = message.event
    match kind:
        case "message":
            assert isinstance(event, Posted)
            assert tuple(a.kind for a in event.attachments) == detail
            assert all(a.ref.startswith("https://") for a in event.attachments)
        case "choice":
            assert isinstance(event, ChoiceSelected) and event.option_id == detail and not event.offered
        case "edited":
            assert isinstance(event, MessageEdited) and event.original_id == detail
        case "deleted":
            assert isinstance(event, MessageDeleted) and event.original_id == detail
        case _:
            raise AssertionError(kind)


@pytest.mark.parametrize(("name", "expected"), CASES, ids=[name for name, _ in CASES])
async def test_payloads_through_the_route(
    client: TestClient, sync_redis: redis.Redis, name: str, expected: list[tuple[str, str, str, str, Any]]
) -> None:
    body, headers = sign_delivery(payload("messenger", name), APP_SECRET)
    resp = await client.post("/webhooks/messenger", data=body, headers=headers)
    assert resp.status == 200 and await resp.json() == {"ok": True}
    found = stored(sync_redis)
    assert len(found) == len(expected)
    by_text = {(m.conversation.account, m.conversation.conversation, m.text): m for m in found}
    for item in expected:
        check(by_text[(item[0], item[1], item[3])], item, "messenger", "second")
    again = await client.post("/webhooks/messenger", data=body, headers=headers)  # Meta's redelivery
    assert again.status == 200 and len(stored(sync_redis)) == len(expected)


async def test_a_shared_pin_is_a_location_the_agent_reads(client: TestClient, sync_redis: redis.Redis) -> None:
    body, headers = sign_delivery(payload("messenger", "location.json"), APP_SECRET)
    assert (await client.post("/webhooks/messenger", data=body, headers=headers)).status == 200
    [message] = stored(sync_redis)
    assert message.event == Posted(shared=(Location(latitude=48.8584, longitude=2.2945, name="Pin"),))
    assert event_text(message) == "[location: 48.8584, 2.2945 — Pin]"


async def test_the_reply_and_reaction_name_the_message_they_answer(client: TestClient, sync_redis: redis.Redis) -> None:
    for name in ("reply.json", "reaction.json"):
        body, headers = sign_delivery(payload("messenger", name), APP_SECRET)
        assert (await client.post("/webhooks/messenger", data=body, headers=headers)).status == 200
    reply, reaction = sorted(stored(sync_redis), key=lambda m: m.text, reverse=True)
    assert reply.meta["reply_to"] == "m_fake00000001" and reply.platform_message_id == "m_reply1"
    assert reaction.meta["reacted_to"] == "m_fake00000001" and reaction.meta["reaction"] == "❤"


async def test_receipts_are_facts_in_the_users_session_not_messages(
    client: TestClient, async_redis: aioredis.Redis, sync_redis: redis.Redis
) -> None:
    body, headers = sign_delivery(payload("messenger", "text.json"), APP_SECRET)
    assert (await client.post("/webhooks/messenger", data=body, headers=headers)).status == 200
    [message] = stored(sync_redis)
    before = inbox_total(sync_redis)
    for name in ("delivery.json", "read.json"):
        body, headers = sign_delivery(payload("messenger", name), APP_SECRET)
        assert (await client.post("/webhooks/messenger", data=body, headers=headers)).status == 200
    facts = await read_events(async_redis, message.conversation.session_key)
    assert [(f["channel"], f["status"], f["platform_id"]) for f in facts if f["kind"] == "delivery_reported"] == [
        ("messenger", "delivered", "m_fake00000001"),
        ("messenger", "delivered", "m_fake00000002"),
        ("messenger", "read", ""),  # a read watermark names no message: everything sent before it
    ]
    assert stored(sync_redis) == [message] and inbox_total(sync_redis) == before  # nothing queued for the agent
    metrics = await (await client.get("/metrics")).text()
    assert 'switchboard_delivery_statuses_total{status="delivered"} 2.0' in metrics
    assert 'switchboard_delivery_statuses_total{status="read"} 1.0' in metrics


async def test_an_unknown_page_is_acknowledged_dropped_and_counted(client: TestClient, sync_redis: redis.Redis) -> None:
    body, headers = sign_delivery(payload("messenger", "unknown_page.json"), APP_SECRET)
    resp = await client.post("/webhooks/messenger", data=body, headers=headers)
    assert resp.status == 200 and stored(sync_redis) == []
    metrics = await (await client.get("/metrics")).text()
    assert 'reason="unknown_account"' in metrics and 'channel="messenger"' in metrics


async def test_the_subscription_handshake(client: TestClient, sync_redis: redis.Redis) -> None:
    before = keyspace(sync_redis)
    query = {"hub.mode": "subscribe", "hub.verify_token": VERIFY, "hub.challenge": "1158201444"}
    resp = await client.get("/webhooks/messenger", params=query)
    assert resp.status == 200 and await resp.text() == "1158201444"
    for bad in ({"hub.verify_token": "wrong"}, {"hub.mode": "unsubscribe"}, {"hub.verify_token": ""}):
        refused = await client.get("/webhooks/messenger", params=query | bad)
        assert refused.status == 403 and "1158201444" not in await refused.text()
    missing = await client.get("/webhooks/messenger", params={"hub.mode": "subscribe", "hub.verify_token": VERIFY})
    assert missing.status == 400
    assert keyspace(sync_redis) == before


async def test_a_delivery_is_accepted_whole_or_not_at_all(
    client: TestClient, sync_redis: redis.Redis, redis_server: Any
) -> None:
    """The queue fails while a three-message delivery is ingested: 503, and Meta's retry lands all three once."""
    body, headers = sign_delivery(payload("messenger", "multi_entry.json"), APP_SECRET)
    sync_redis.execute_command("CLIENT", "PAUSE", "1500", "WRITE")
    try:
        failed = await client.post("/webhooks/messenger", data=body, headers=headers)
    finally:
        sync_redis.execute_command("CLIENT", "UNPAUSE")
    assert failed.status == 503
    retried = await client.post("/webhooks/messenger", data=body, headers=headers)
    assert retried.status == 200
    found = stored(sync_redis)
    assert sorted(m.text for m in found) == ["first", "second", "third, to the other page"]


async def test_yaml_accounts_alone_share_one_url(
    base_env: dict[str, str], tmp_path: Path, aiohttp_client: Any, sync_redis: redis.Redis
) -> None:
    """No env-configured Page: the app's webhook points at one YAML account, which routes every Page of the app."""
    config = tmp_path / "pages.yaml"
    config.write_text(
        AGENTS
        + """channels:
  messenger:
    accounts:
      shop:
        secrets_from_env: {page_access_token: SHOP_TOKEN, app_secret: META_SECRET, verify_token: META_VERIFY}
        options: {page_id: "106000000000001"}
      careers:
        agent: sales
        secrets_from_env: {page_access_token: CAREERS_TOKEN, app_secret: META_SECRET}
        options: {page_id: "106000000000002"}
"""
    )
    env = base_env | {
        "SWITCHBOARD_CONFIG": str(config),
        "SHOP_TOKEN": "EAAGshop",
        "CAREERS_TOKEN": "EAAGcareers",
        "META_SECRET": APP_SECRET,
        "META_VERIFY": VERIFY,
    }
    client = await aiohttp_client(create_app(load_settings(env), listeners=False))
    assert (await client.post("/webhooks/messenger", data=b"{}")).status == 404  # no default account
    query = {"hub.mode": "subscribe", "hub.verify_token": VERIFY, "hub.challenge": "77"}
    assert await (await client.get("/webhooks/messenger/shop", params=query)).text() == "77"
    body, headers = sign_delivery(payload("messenger", "multi_entry.json"), APP_SECRET)
    assert (await client.post("/webhooks/messenger/shop", data=body, headers=headers)).status == 200
    routed = {(m.conversation.account, m.conversation.agent, m.text) for m in stored(sync_redis)}
    assert routed == {
        ("shop", "assistant", "first"),
        ("shop", "assistant", "second"),
        ("careers", "sales", "third, to the other page"),
    }
