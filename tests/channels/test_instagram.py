"""Instagram through the real webhook route (``create_app``, real Redis): the case table, the handshake, routing by
account, all-or-nothing deliveries."""

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
from switchboard.queue.eventlog import read_events
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from switchboard.web.app import create_app
from tests.channels.test_messenger import AGENTS, PAYLOADS, check, keyspace, payload, stored

IG_TOKEN = "IGQVJtestaccounttoken"
IG_SECRET = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
IG_VERIFY = "ig-verify-token"
IG, IG2 = "17841400000000001", "17841400000000002"
IGU, IGU2 = "1120000000000001", "1120000000000002"

IG_ACCOUNTS = """channels:
  instagram:
    accounts:
      shop:
        agent: sales
        secrets_from_env: {access_token: SHOP_IG_TOKEN, app_secret: SHOP_IG_SECRET}
        options: {account_id: "17841400000000002"}
"""


def instagram_env(graph_url: str) -> dict[str, str]:
    """Instagram's env block (account one); the YAML's ``shop`` account needs these too."""
    return {
        "SWITCHBOARD_INSTAGRAM__ACCESS_TOKEN": IG_TOKEN,
        "SWITCHBOARD_INSTAGRAM__APP_SECRET": IG_SECRET,
        "SWITCHBOARD_INSTAGRAM__VERIFY_TOKEN": IG_VERIFY,
        "SWITCHBOARD_INSTAGRAM__GRAPH_BASE_URL": graph_url,
        "SWITCHBOARD_INSTAGRAM__ACCOUNT_ID": IG,
        "SWITCHBOARD_QUEUE__INGEST_TIMEOUT_S": "1.0",
        "SHOP_IG_TOKEN": "IGQVJshoptoken",
        "SHOP_IG_SECRET": IG_SECRET,
    }


def with_shop(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "instagram.yaml"
    config.write_text(AGENTS + IG_ACCOUNTS)
    return env | {"SWITCHBOARD_CONFIG": str(config)}


@pytest.fixture
async def fake() -> AsyncIterator[FakeMessenger]:
    async with FakeMessenger("instagram", token=IG_TOKEN) as server:
        yield server


@pytest.fixture
async def client(base_env: dict[str, str], tmp_path: Path, fake: FakeMessenger, aiohttp_client: Any) -> TestClient:
    env = with_shop(base_env | instagram_env(fake.graph_url), tmp_path)
    return await aiohttp_client(create_app(load_settings(env), listeners=False))  # type: ignore[no-any-return]


CDN = "https://lookaside.fbsbx.com/ig_messaging_cdn/?asset_id={}&signature=sig"
CASES: list[tuple[str, list[tuple[str, str, str, str, Any]]]] = [
    ("text.json", [("default", IGU, "message", "Bonjour! Vous livrez à Montréal? 🚚", ())]),
    ("image.json", [("default", IGU, "message", "", ("image",))]),
    ("video.json", [("default", IGU, "message", "", ("video",))]),
    ("audio.json", [("default", IGU, "message", "", ("audio",))]),
    ("file.json", [("default", IGU, "message", "", ("document",))]),
    ("share.json", [("default", IGU, "message", "[share: https://www.instagram.com/p/Cxyz/]", ())]),
    ("story_mention.json", [("default", IGU, "message", f"[story mention: {CDN.format(9)}]", ())]),
    ("reply.json", [("default", IGU, "message", "this one please", ())]),
    ("story_reply.json", [("default", IGU, "message", "love it!", ())]),
    ("reaction.json", [("default", IGU, "message", "[reacted ❤️ to message ig_earlier1]", ())]),
    ("quick_reply.json", [("default", IGU, "choice", "Size M", "size-m")]),
    ("postback.json", [("default", IGU, "choice", "Talk to a person", "handover")]),
    ("message_edit.json", [("default", IGU, "edited", "this one please, in blue", "ig_reply1")]),
    ("deleted.json", [("default", IGU, "deleted", "", "ig_reply1")]),
    ("echo.json", []),
    ("read.json", []),
    ("unknown_account.json", []),
    (
        "multi_entry.json",
        [
            ("default", IGU, "message", "un", ()),
            ("default", IGU2, "message", "deux", ()),
            ("shop", IGU, "message", "trois", ()),
        ],
    ),
]


def test_every_payload_file_is_in_the_table() -> None:
    assert sorted(p.name for p in (PAYLOADS / "instagram").glob("*.json")) == sorted(name for name, _ in CASES)


@pytest.mark.parametrize(("name", "expected"), CASES, ids=[name for name, _ in CASES])
async def test_payloads_through_the_route(
    client: TestClient, sync_redis: redis.Redis, name: str, expected: list[tuple[str, str, str, str, Any]]
) -> None:
    body, headers = sign_delivery(payload("instagram", name), IG_SECRET)
    resp = await client.post("/webhooks/instagram", data=body, headers=headers)
    assert resp.status == 200 and await resp.json() == {"ok": True}
    found = stored(sync_redis)
    assert len(found) == len(expected)
    by_key = {(m.conversation.account, m.conversation.conversation, m.text): m for m in found}
    for item in expected:
        check(by_key[(item[0], item[1], item[3])], item, "instagram", "shop")
    again = await client.post("/webhooks/instagram", data=body, headers=headers)
    assert again.status == 200 and len(stored(sync_redis)) == len(expected)


async def test_a_story_reply_names_the_story(client: TestClient, sync_redis: redis.Redis) -> None:
    body, headers = sign_delivery(payload("instagram", "story_reply.json"), IG_SECRET)
    assert (await client.post("/webhooks/instagram", data=body, headers=headers)).status == 200
    (message,) = stored(sync_redis)
    assert message.meta["reply_to_story"] == "17900000000000001"


async def test_read_receipts_are_facts_in_the_users_session_of_their_account(
    client: TestClient, async_redis: aioredis.Redis, sync_redis: redis.Redis
) -> None:
    body, headers = sign_delivery(payload("instagram", "text.json"), IG_SECRET)
    assert (await client.post("/webhooks/instagram", data=body, headers=headers)).status == 200
    [message] = stored(sync_redis)
    read = payload("instagram", "read.json")
    shop = json.loads(json.dumps(read["entry"][0]).replace(IG, IG2).replace("ig_fake1", "ig_shop1"))
    read["entry"].append(shop)  # the same user reads a message of the other account (its own session)
    body, headers = sign_delivery(read, IG_SECRET)
    assert (await client.post("/webhooks/instagram", data=body, headers=headers)).status == 200
    facts = await read_events(async_redis, message.conversation.session_key)
    assert [(f["channel"], f["status"], f["platform_id"]) for f in facts if f["kind"] == "delivery_reported"] == [
        ("instagram", "read", "ig_fake1")
    ]
    shop_facts = await read_events(async_redis, SessionKey(f"default/sales/instagram/shop/{IGU}"))
    assert [(f["status"], f["platform_id"]) for f in shop_facts] == [("read", "ig_shop1")]
    assert stored(sync_redis) == [message]  # nothing queued for an agent


async def test_the_subscription_handshake(client: TestClient, sync_redis: redis.Redis) -> None:
    before = keyspace(sync_redis)
    query = {"hub.mode": "subscribe", "hub.verify_token": IG_VERIFY, "hub.challenge": "987654"}
    resp = await client.get("/webhooks/instagram", params=query)
    assert resp.status == 200 and await resp.text() == "987654"
    refused = await client.get("/webhooks/instagram", params=query | {"hub.verify_token": IG_SECRET})
    assert refused.status == 403
    assert keyspace(sync_redis) == before


async def test_a_delivery_is_accepted_whole_or_not_at_all(client: TestClient, sync_redis: redis.Redis) -> None:
    first, headers = sign_delivery(payload("instagram", "text.json"), IG_SECRET)
    assert (await client.post("/webhooks/instagram", data=first, headers=headers)).status == 200
    body, headers = sign_delivery(payload("instagram", "multi_entry.json"), IG_SECRET)
    sync_redis.execute_command("CLIENT", "PAUSE", "1500", "WRITE")
    try:
        failed = await client.post("/webhooks/instagram", data=body, headers=headers)
    finally:
        sync_redis.execute_command("CLIENT", "UNPAUSE")
    assert failed.status == 503
    assert (await client.post("/webhooks/instagram", data=body, headers=headers)).status == 200
    texts = sorted(m.text for m in stored(sync_redis))
    assert texts == sorted(["Bonjour! Vous livrez à Montréal? 🚚", "un", "deux", "trois"])
