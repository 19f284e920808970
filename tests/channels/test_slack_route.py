"""Slack through the real webhook route (``create_app``, real Redis): durable ingest, replays, forged requests."""

from __future__ import annotations

import json
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis
from aiohttp.test_utils import TestClient

from switchboard.channels.slack.fake.payloads import form_body, make_block_actions, make_event, sign, sign_request
from switchboard.channels.slack.fake.platform import FakeSlack
from switchboard.core.actions import Choice, OfferChoice
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from tests.channels.slack_support import BOT_TOKEN, SECRET, Progress, in_channel, make_channel


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(bot_token=BOT_TOKEN) as server:
        yield server


@pytest.fixture
async def client(base_env: dict[str, str], fake: FakeSlack, aiohttp_client: Any) -> TestClient:
    env = base_env | {
        "SWITCHBOARD_SLACK__BOT_TOKEN": BOT_TOKEN,
        "SWITCHBOARD_SLACK__SIGNING_SECRET": SECRET,
        "SWITCHBOARD_SLACK__API_BASE_URL": fake.api_url,
        "SWITCHBOARD_QUEUE__INGEST_TIMEOUT_S": "1.0",
    }
    return await aiohttp_client(create_app(load_settings(env), listeners=False))  # type: ignore[no-any-return]


def inbox_lengths(r: redis.Redis) -> dict[bytes, int]:
    return {key: int(r.llen(key)) for key in r.keys("sb:*:inbox")}


def stored_messages(r: redis.Redis) -> list[dict[str, Any]]:
    found = []
    for key in r.keys("sb:*:messages"):
        for _, fields in r.xrange(key) if r.type(key) == b"stream" else []:
            found += [json.loads(v) for v in fields.values() if v.startswith(b"{")]
        if r.type(key) == b"hash":
            found += [json.loads(v) for v in r.hvals(key)]
    return found


async def test_a_dm_is_queued_once_and_slack_retries_are_deduplicated(
    client: TestClient, sync_redis: redis.Redis
) -> None:
    body, headers = sign_request(make_event("hello there"), SECRET)
    first = await client.post("/webhooks/slack", data=body, headers=headers)
    assert first.status == 200 and await first.read() == b""
    assert list(inbox_lengths(sync_redis).values()) == [1]
    for retry in (1, 2, 3):  # Slack's retries carry the same body and event_id, and are signed anew
        body, headers = sign_request(body, SECRET)
        headers |= {"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_timeout"}
        again = await client.post("/webhooks/slack", data=body, headers=headers)
        assert again.status == 200
    assert list(inbox_lengths(sync_redis).values()) == [1]
    metrics = await (await client.get("/metrics")).text()
    assert 'switchboard_messages_deduplicated_total{channel="slack"} 3.0' in metrics


async def test_a_first_delivery_with_a_retry_header_is_not_dropped(client: TestClient, sync_redis: redis.Redis) -> None:
    body, headers = sign_request(make_event("first seen on a retry"), SECRET)
    resp = await client.post("/webhooks/slack", data=body, headers=headers | {"X-Slack-Retry-Num": "1"})
    assert resp.status == 200
    assert list(inbox_lengths(sync_redis).values()) == [1]


async def test_url_verification_through_the_route(client: TestClient, sync_redis: redis.Redis) -> None:
    challenge = {"token": "x", "challenge": "abc123", "type": "url_verification"}
    forged = json.dumps(challenge).encode()
    refused = await client.post(
        "/webhooks/slack",
        data=forged,
        headers={"X-Slack-Request-Timestamp": str(int(time.time())), "X-Slack-Signature": "v0=00"},
    )
    assert refused.status == 401 and "abc123" not in await refused.text()
    body, headers = sign_request(challenge, SECRET)
    resp = await client.post("/webhooks/slack", data=body, headers=headers)
    assert resp.status == 200 and await resp.text() == "abc123"
    assert sync_redis.keys("sb:*:inbox") == []


def _mutations(body: bytes, rng: random.Random) -> list[tuple[str, bytes, dict[str, str]]]:
    now = int(time.time())
    good = sign(SECRET, now, body)
    out: list[tuple[str, bytes, dict[str, str]]] = []
    for _ in range(300):
        flipped = bytearray(body)
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        out.append(("bit flip", bytes(flipped), {"X-Slack-Request-Timestamp": str(now), "X-Slack-Signature": good}))
        at = rng.randrange(3, len(good))
        sig = good[:at] + rng.choice([c for c in "0123456789abcdefABCDEF=x" if c != good[at]]) + good[at + 1 :]
        out.append(("signature change", body, {"X-Slack-Request-Timestamp": str(now), "X-Slack-Signature": sig}))
        wrong = sign(f"{SECRET}{rng.randrange(10**6)}", now, body)
        out.append(("wrong secret", body, {"X-Slack-Request-Timestamp": str(now), "X-Slack-Signature": wrong}))
        stale = now - rng.randrange(301, 10**6)
        out.append(
            ("stale", body, {"X-Slack-Request-Timestamp": str(stale), "X-Slack-Signature": sign(SECRET, stale, body)})
        )
        other = now - rng.randrange(1, 200)
        out.append(
            (
                "other timestamp",
                body,
                {"X-Slack-Request-Timestamp": str(now), "X-Slack-Signature": sign(SECRET, other, body)},
            )
        )
        missing = rng.choice(["X-Slack-Request-Timestamp", "X-Slack-Signature"])
        headers = {"X-Slack-Request-Timestamp": str(now), "X-Slack-Signature": good}
        del headers[missing]
        out.append(("missing header", body, headers))
        garbage = "".join(chr(rng.randrange(33, 127)) for _ in range(rng.randrange(0, 20)))
        out.append(
            ("garbage timestamp", body, {"X-Slack-Request-Timestamp": garbage or "x", "X-Slack-Signature": good})
        )
    return out


async def test_thousands_of_mutated_requests_are_refused_and_change_nothing(
    client: TestClient, sync_redis: redis.Redis
) -> None:
    body = json.dumps(make_event("<@U0BOTUSER> deploy", channel="C0GENERAL", channel_type="channel")).encode()
    before = sorted(sync_redis.keys("*"))
    statuses: dict[int, int] = {}
    for kind, data, headers in _mutations(body, random.Random(88)):
        resp = await client.post("/webhooks/slack", data=data, headers=headers | {"Content-Type": "application/json"})
        statuses[resp.status] = statuses.get(resp.status, 0) + 1
        assert resp.status in (401, 403), (kind, resp.status, await resp.text())
    assert sum(statuses.values()) == 2100
    assert sorted(sync_redis.keys("*")) == before


async def test_a_choice_round_trip(client: TestClient, fake: FakeSlack, sync_redis: redis.Redis) -> None:
    channel = make_channel(fake.api_url)
    try:
        options = [Choice(id="approve", label="Approve"), Choice(id="reject", label="Reject")]
        receipt = await channel.perform(OfferChoice(question="Deploy?", options=options), in_channel(), Progress())
    finally:
        await channel.aclose()
    (offer,) = fake.sent()
    button = offer.params["blocks"][1]["elements"][1]
    click = make_block_actions(
        button["value"],
        label=button["text"]["text"],
        channel="C0GENERAL",
        message_ts=receipt.platform_ids[0],
        thread_ts=offer.params["thread_ts"],
    )
    body, headers = sign_request(form_body(click), SECRET, form=True)
    resp = await client.post("/webhooks/slack", data=body, headers=headers)
    assert resp.status == 200 and await resp.read() == b""
    (inbox,) = sync_redis.keys("sb:*:inbox")
    assert b"C0GENERAL" in inbox and offer.params["thread_ts"].encode() in inbox
    stored = [m for m in stored_messages(sync_redis) if isinstance(m, dict) and m.get("event")]
    assert any(
        m["event"]
        == {
            "kind": "choice",
            "option_id": "reject",
            "offer_message_id": receipt.platform_ids[0],
            "ack_ref": None,
            "offered": False,  # checked against the session's recorded offers when a turn reads it
        }
        and m["text"] == "Reject"
        for m in stored
    ), stored


@pytest.mark.parametrize(
    ("sample", "option"),
    [("static_select", "fruit.banana"), ("radio_buttons", "fruit.apple"), ("overflow", "fruit.cherry")],
)
async def test_a_pick_in_a_select_radio_group_or_overflow_menu_is_queued_as_a_choice(
    client: TestClient, sync_redis: redis.Redis, sample: str, option: str
) -> None:
    path = Path(__file__).resolve().parent.parent / "payloads" / "slack" / f"block_actions_{sample}.form.json"
    body, headers = sign_request(form_body(json.loads(path.read_text())), SECRET, form=True)
    resp = await client.post("/webhooks/slack", data=body, headers=headers)
    assert resp.status == 200 and await resp.read() == b""  # Slack's acknowledgement
    stored = [m for m in stored_messages(sync_redis) if isinstance(m, dict) and m.get("event")]
    assert [m["event"]["option_id"] for m in stored if m["event"]["kind"] == "choice"] == [option]
