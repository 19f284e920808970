"""WhatsApp through the real gateway (``create_app``, real Redis, the worker): durable all-or-nothing ingest of
multi-message deliveries, several numbers on one webhook URL, the handshake, and replies through the fake."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient

from switchboard.channels.meta.whatsapp.fake.payloads import (
    PHONE_NUMBER_ID,
    delivery,
    make_message,
    sign_request,
    text_delivery,
)
from switchboard.channels.meta.whatsapp.fake.platform import FakeWhatsApp
from switchboard.cli.worker import run_worker
from switchboard.queue.eventlog import read_events
from switchboard.queue.keys import SessionKeys
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from switchboard.web.app import create_app
from tests.waiting import wait_until

TOKEN = "EAAdefault"
SALES_TOKEN = "EAAsales"
SECRET = "5d41402abc4b2a76b9719d911017c592"
VERIFY = "verify-me"
SALES_NUMBER = "106540352242923"
USER = "15551234567"
DEFAULT_SESSION = f"default/assistant/whatsapp/default/{USER}"

CONFIG = """
default_agent: assistant
agents:
  assistant:
    profile: {{name: Assistant}}
    instructions: You are a test assistant.
    tools: [current_time, offer_choice]
  sales-bot:
    profile: {{name: Sales}}
    instructions: You sell.
    tools: [current_time]
channels:
  whatsapp:
    send_rate: 0
    chat_send_rate: 0
    accounts:
      sales:
        agent: sales-bot
        tenant: acme
        secrets_from_env: {{access_token: WA_SALES_TOKEN, app_secret: WA_APP_SECRET, verify_token: WA_VERIFY}}
        options: {{phone_number_id: "{sales}", graph_base_url: "{graph}"}}
"""


@pytest.fixture
async def fake() -> AsyncIterator[FakeWhatsApp]:
    async with FakeWhatsApp() as server:
        yield server


@pytest.fixture
def env(base_env: dict[str, str], fake: FakeWhatsApp, tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "whatsapp.yaml"
    config.write_text(CONFIG.format(sales=SALES_NUMBER, graph=fake.graph_url))
    return base_env | {
        "SWITCHBOARD_CONFIG": str(config),
        "SWITCHBOARD_WHATSAPP__ACCESS_TOKEN": TOKEN,
        "SWITCHBOARD_WHATSAPP__APP_SECRET": SECRET,
        "SWITCHBOARD_WHATSAPP__VERIFY_TOKEN": VERIFY,
        "SWITCHBOARD_WHATSAPP__PHONE_NUMBER_ID": PHONE_NUMBER_ID,
        "SWITCHBOARD_WHATSAPP__GRAPH_BASE_URL": fake.graph_url,
        "SWITCHBOARD_QUEUE__INGEST_TIMEOUT_S": "1.0",
        "WA_SALES_TOKEN": SALES_TOKEN,
        "WA_APP_SECRET": SECRET,
        "WA_VERIFY": VERIFY,
    }


@pytest.fixture
async def client(env: dict[str, str], aiohttp_client: Any) -> TestClient:
    return await aiohttp_client(create_app(load_settings(env), listeners=False))  # type: ignore[no-any-return]


def inbox(r: redis.Redis, session: str) -> list[str]:
    """The texts of the session's waiting messages, oldest first."""
    keys = SessionKeys(SessionKey(session))
    ids = r.lrange(keys.inbox, 0, -1)
    return [json.loads(r.hget(keys.messages, i) or b"{}").get("text", "?") for i in ids]


def inbox_sizes(r: redis.Redis) -> dict[str, int]:
    return {key.decode(): int(r.llen(key)) for key in r.keys("sb:*:inbox")}


async def post(client: TestClient, payload: dict[str, Any] | bytes, path: str = "/webhooks/whatsapp") -> int:
    body, headers = sign_request(payload, SECRET)
    resp = await client.post(path, data=body, headers=headers)
    await resp.read()
    return resp.status


async def test_a_signed_delivery_is_queued_once_and_retries_are_deduplicated(
    client: TestClient, sync_redis: redis.Redis
) -> None:
    payload = text_delivery("Olá, quanto custa?", sender=USER)
    for _ in range(3):  # Meta retrying the same delivery
        assert await post(client, payload) == 200
    assert sum(inbox_sizes(sync_redis).values()) == 1
    metrics = await (await client.get("/metrics")).text()
    assert 'switchboard_messages_deduplicated_total{channel="whatsapp"} 2.0' in metrics


async def test_the_handshake_through_the_route(client: TestClient, sync_redis: redis.Redis) -> None:
    before = sorted(sync_redis.keys("*"))
    ok = await client.get(
        "/webhooks/whatsapp", params={"hub.mode": "subscribe", "hub.verify_token": VERIFY, "hub.challenge": "987654"}
    )
    assert ok.status == 200 and await ok.text() == "987654" and ok.content_type == "text/plain"
    wrong = await client.get(
        "/webhooks/whatsapp", params={"hub.mode": "subscribe", "hub.verify_token": "nope", "hub.challenge": "1"}
    )
    assert wrong.status == 403
    assert (await client.put("/webhooks/whatsapp", data=b"{}")).status == 405
    assert sorted(sync_redis.keys("*")) == before


async def test_one_url_serves_both_numbers_each_routed_to_its_agent_and_tenant(
    client: TestClient, sync_redis: redis.Redis
) -> None:
    payload = delivery([make_message(sender=USER, body="to default")])
    sales = delivery([make_message(sender="15550003333", body="to sales")], phone_number_id=SALES_NUMBER)
    payload["entry"] += sales["entry"]
    assert await post(client, payload) == 200
    assert inbox_sizes(sync_redis) == {
        SessionKeys(DEFAULT_SESSION).inbox: 1,
        SessionKeys(SessionKey("acme/sales-bot/whatsapp/sales/15550003333")).inbox: 1,
    }


async def test_a_number_nobody_configured_is_dropped_with_a_metric_never_a_5xx(
    client: TestClient, sync_redis: redis.Redis
) -> None:
    assert await post(client, text_delivery("who?", phone_number_id="999999999999999")) == 200
    assert inbox_sizes(sync_redis) == {}
    metrics = await (await client.get("/metrics")).text()
    assert 'switchboard_requests_rejected_total{channel="whatsapp",reason="unknown_account"} 1.0' in metrics


async def test_statuses_are_facts_in_the_users_session_and_nothing_is_queued(
    client: TestClient, async_redis: aioredis.Redis, sync_redis: redis.Redis
) -> None:
    payload = json.loads((Path(__file__).parent.parent / "payloads" / "whatsapp" / "statuses.json").read_text())
    sales = json.loads(json.dumps(payload))
    sales["entry"][0]["changes"][0]["value"]["metadata"]["phone_number_id"] = SALES_NUMBER
    sales["entry"][0]["changes"][0]["value"]["statuses"] = sales["entry"][0]["changes"][0]["value"]["statuses"][2:3]
    payload["entry"] += sales["entry"]
    assert await post(client, payload) == 200
    facts = await read_events(async_redis, SessionKey(DEFAULT_SESSION))
    assert [(f["kind"], f["channel"], f["status"], f["platform_id"], f["error"]) for f in facts] == [
        ("delivery_reported", "whatsapp", "sent", "wamid.OUT0001", ""),
        ("delivery_reported", "whatsapp", "delivered", "wamid.OUT0001", ""),
        ("delivery_reported", "whatsapp", "read", "wamid.OUT0001", ""),
        ("delivery_reported", "whatsapp", "failed", "wamid.OUT0002", "131047 Re-engagement message"),
    ]
    sales_facts = await read_events(async_redis, SessionKey(f"acme/sales-bot/whatsapp/sales/{USER}"))
    assert [(f["status"], f["platform_id"]) for f in sales_facts] == [("read", "wamid.OUT0001")]
    assert inbox_sizes(sync_redis) == {}  # nothing for an agent to answer
    assert not any("24 hours" in json.dumps(f) for f in facts)  # the error's details text is never recorded
    metrics = await (await client.get("/metrics")).text()
    assert 'switchboard_delivery_statuses_total{status="read"} 2.0' in metrics
    assert 'switchboard_delivery_statuses_total{status="failed"} 1.0' in metrics


async def test_a_delivery_is_accepted_whole_or_not_at_all(client: TestClient, sync_redis: redis.Redis) -> None:
    """The second of three messages fails in Redis: 503; Meta's re-delivery gets each message exactly once, in order."""
    messages = [make_message(sender=USER, body=f"part {i}", wamid=f"wamid.part{i}") for i in range(3)]
    payload = delivery(messages)
    broken = SessionKeys(SessionKey(DEFAULT_SESSION)).dedup("wamid.part1")
    sync_redis.hset(broken, "not", "a string")  # its script gets an error reply (the wrong type of key)
    assert await post(client, payload) == 503
    assert inbox(sync_redis, DEFAULT_SESSION) == ["part 0"]  # the first was accepted, the third never after it
    sync_redis.delete(broken)
    assert await post(client, payload) == 200  # the re-delivery
    assert await post(client, payload) == 200  # and a duplicate one
    assert inbox(sync_redis, DEFAULT_SESSION) == ["part 0", "part 1", "part 2"]


async def test_end_to_end_a_worker_replies_and_a_choice_round_trips(
    client: TestClient, env: dict[str, str], fake: FakeWhatsApp
) -> None:
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(load_settings(env), stop))

    async def replies(count: int) -> bool:
        if worker.done():
            worker.result()
        return len(fake.state.sent(to=USER)) >= count

    try:
        assert await post(client, text_delivery("hello whatsapp", sender=USER)) == 200
        await wait_until(lambda: replies(1), "the reply")
        assert 'You said: "hello whatsapp"' in fake.state.texts(USER)[0]

        offer = {"question": "Which plan?", "options": [{"id": "plan-pro", "label": "Pro"}, {"id": "plan-free",
                 "label": "Free"}]}  # fmt: skip
        assert await post(client, text_delivery(f"/tool offer_choice {json.dumps(offer)}", sender=USER)) == 200

        async def offered() -> bool:  # the whole turn: the buttons, then the model's text after the tool call
            done = any(t.startswith("offer_choice returned") for t in fake.state.texts(USER))
            return await replies(2) and bool(fake.state.sent("interactive")) and done

        await wait_until(offered, "the offer")
        [sent_offer] = fake.state.sent("interactive")
        assert [b["reply"]["id"] for b in sent_offer["interactive"]["action"]["buttons"]] == ["plan-pro", "plan-free"]
        count = len(fake.state.sent(to=USER))
        click = make_message(
            "interactive", sender=USER, type="button_reply", button_reply={"id": "plan-pro", "title": "Pro"},
            context={"from": "15550001111", "id": "wamid.OFFER"},
        )  # fmt: skip
        assert await post(client, delivery([click])) == 200
        await wait_until(lambda: replies(count + 1), "the answer to the click")
        assert "chose option plan-pro (Pro)" in fake.state.texts(USER)[-1]  # verified against the recorded offer
        forged = make_message(
            "interactive", sender=USER, type="button_reply", button_reply={"id": "plan-gold", "title": "Gold"},
        )  # fmt: skip
        assert await post(client, delivery([forged])) == 200
        await wait_until(lambda: replies(count + 2), "the answer to the forged click")
        assert "not offered here: plan-gold" in fake.state.texts(USER)[-1]
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(worker, return_exceptions=True), 30)


async def test_the_simulation_speaks_to_the_gateway_and_reads_the_reply(
    aiohttp_client: Any, base_env: dict[str, str]
) -> None:
    """What `switchboard run` without WhatsApp credentials and `switchboard simulate whatsapp "text"` do."""
    from switchboard.channels.meta.whatsapp.fake.platform import SIMULATION
    from switchboard.channels.meta.whatsapp.settings import WhatsAppSettings

    block, running = await SIMULATION.start(WhatsAppSettings())
    try:
        assert block.access_token and block.app_secret and block.verify_token and block.phone_number_id
        sim_env = base_env | {
            "SWITCHBOARD_WHATSAPP__ACCESS_TOKEN": block.access_token.get_secret_value(),
            "SWITCHBOARD_WHATSAPP__APP_SECRET": block.app_secret.get_secret_value(),
            "SWITCHBOARD_WHATSAPP__VERIFY_TOKEN": block.verify_token.get_secret_value(),
            "SWITCHBOARD_WHATSAPP__PHONE_NUMBER_ID": block.phone_number_id,
            "SWITCHBOARD_WHATSAPP__GRAPH_BASE_URL": block.graph_base_url,
        }
        sim_client = await aiohttp_client(create_app(load_settings(sim_env), listeners=False))
        details = SIMULATION.details(block)
        sample = SIMULATION.request(details, "hello from the simulator")
        stop = asyncio.Event()
        worker = asyncio.create_task(run_worker(load_settings(sim_env), stop))
        try:
            resp = await sim_client.post("/webhooks/whatsapp", data=sample.body, headers=dict(sample.headers))
            assert resp.status == 200
            async with aiohttp.ClientSession() as http:

                async def replied() -> bool:
                    return bool(await SIMULATION.replies(http, details, sample.conversation))

                await wait_until(replied, "the simulated reply")
                [reply] = await SIMULATION.replies(http, details, sample.conversation)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(worker, return_exceptions=True), 30)
        assert 'You said: "hello from the simulator"' in reply
    finally:
        await running.stop()
