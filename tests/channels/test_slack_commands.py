"""Slack slash commands: signed form POSTs to ``/webhooks/slack`` become command messages, acknowledged at once and
answered in the channel (signed webhook → Redis → worker → offline model → chat.postMessage on the fake)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import pytest
import redis
from aiohttp.test_utils import TestClient
from multidict import CIMultiDict, CIMultiDictProxy

from switchboard.channels.base import RawRequest
from switchboard.channels.slack.fake.payloads import make_slash_command, sign, sign_request
from switchboard.channels.slack.fake.platform import FakeSlack
from switchboard.cli.worker import run_worker
from switchboard.core.messages import CommandIssued, InboundMessage
from switchboard.errors import MalformedBodyError
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from tests.channels.slack_support import BOT_TOKEN, SECRET, make_channel
from tests.waiting import wait_until

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def raw(body: bytes, headers: dict[str, str]) -> RawRequest:
    return RawRequest("POST", "/webhooks/slack", CIMultiDictProxy(CIMultiDict(headers)), {}, body)


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(bot_token=BOT_TOKEN) as server:
        yield server


@pytest.fixture
def env(base_env: dict[str, str], fake: FakeSlack) -> dict[str, str]:
    return base_env | {
        "SWITCHBOARD_SLACK__BOT_TOKEN": BOT_TOKEN,
        "SWITCHBOARD_SLACK__SIGNING_SECRET": SECRET,
        "SWITCHBOARD_SLACK__API_BASE_URL": fake.api_url,
    }


@pytest.fixture
async def client(env: dict[str, str], aiohttp_client: Any) -> TestClient:
    return await aiohttp_client(create_app(load_settings(env), listeners=False))  # type: ignore[no-any-return]


def queued(r: redis.Redis) -> list[InboundMessage]:
    found = []
    for key in r.keys("sb:*:messages"):
        found += [InboundMessage.model_validate_json(v) for v in r.hvals(key)]
    assert sum(int(r.llen(key)) for key in r.keys("sb:*:inbox")) == len(found)
    return found


async def test_a_command_is_a_command_message_in_the_channel() -> None:
    channel = make_channel("http://127.0.0.1:9/api/")
    try:
        body, headers = sign_request(make_slash_command("/Ask", "what is <@U0OTHER|ada> up to?"), SECRET, form=True)
        request = raw(body, headers)
        await channel.verify(request)
        inbound = await channel.receive(request)
    finally:
        await channel.aclose()
    (draft,) = inbound.messages
    assert draft.event == CommandIssued(name="ask")
    assert draft.text == "what is @ada up to?"
    assert draft.sender.id == "U0HUMAN"
    assert draft.conversation.conversation == "C0GENERAL" and draft.conversation.thread is None
    assert draft.conversation.extra == {
        "channel": "C0GENERAL",
        "channel_type": "channel",
        "user": "U0HUMAN",
        "team": "T0SWITCH",
    }
    assert "response_url" not in draft.model_dump_json() and "verification-token" not in draft.model_dump_json()
    assert inbound.answer.status == 200 and inbound.answer.body == b""


async def test_reset_and_stop_are_confirmed_ephemerally_in_the_ack() -> None:
    channel = make_channel("http://127.0.0.1:9/api/")
    try:
        for name in ("reset", "stop"):
            body, headers = sign_request(make_slash_command(f"/{name}"), SECRET, form=True)
            inbound = await channel.receive(raw(body, headers))
            (draft,) = inbound.messages
            assert draft.event == CommandIssued(name=name) and draft.text == ""
            ack = json.loads(inbound.answer.body)
            assert ack["response_type"] == "ephemeral" and ack["text"]
    finally:
        await channel.aclose()


@pytest.mark.parametrize(
    "fields",
    [
        {"command": "/ask", "text": "hi", "channel_id": "C0GENERAL"},  # no user
        {"command": "/ask", "text": "hi", "user_id": "U0HUMAN"},  # no channel
        {"command": "", "text": "hi", "user_id": "U0HUMAN", "channel_id": "C0GENERAL"},  # no name
        {"command": "/", "text": "hi", "user_id": "U0HUMAN", "channel_id": "C0GENERAL", "trigger_id": "1"},
        {"command": "/ask", "text": "hi", "user_id": "U0HUMAN", "channel_id": "C0GENERAL"},  # no trigger_id
    ],
)
async def test_a_command_without_its_fields_is_400(fields: dict[str, str]) -> None:
    channel = make_channel("http://127.0.0.1:9/api/")
    try:
        body, headers = sign_request(urlencode(fields).encode(), SECRET, form=True)
        with pytest.raises(MalformedBodyError):
            await channel.receive(raw(body, headers))
    finally:
        await channel.aclose()


async def test_forged_stale_malformed_and_oversized_commands_change_nothing(
    client: TestClient, sync_redis: redis.Redis, env: dict[str, str]
) -> None:
    body = make_slash_command("/ask", "deploy")
    now = int(time.time())
    before = sorted(sync_redis.keys("*"))
    cases: list[tuple[str, bytes, dict[str, str], int]] = [
        ("bad signature", body, {"X-Slack-Request-Timestamp": str(now), "X-Slack-Signature": "v0=" + "0" * 64}, 401),
        ("wrong secret", body, {"X-Slack-Request-Timestamp": str(now), "X-Slack-Signature": sign("x", now, body)}, 401),
        (
            "stale",
            body,
            {"X-Slack-Request-Timestamp": str(now - 301), "X-Slack-Signature": sign(SECRET, now - 301, body)},
            401,
        ),
        ("unsigned", body, {}, 401),
    ]
    for name, bad in (("not utf-8", b"command=%2Fask&text=\xff\xfe"), ("no user", b"command=%2Fask&channel_id=C1")):
        signed_body, headers = sign_request(bad, SECRET, form=True)
        cases.append((name, signed_body, headers, 400))
    cap = load_settings(env).queue.max_body_bytes
    huge, headers = sign_request(body + b"&pad=" + b"x" * cap, SECRET, form=True)
    cases.append(("oversized", huge, headers, 413))
    for name, data, headers, status in cases:
        resp = await client.post("/webhooks/slack", data=data, headers=FORM | headers)
        assert resp.status == status, (name, resp.status, await resp.text())
    assert sorted(sync_redis.keys("*")) == before


async def test_a_replayed_command_is_queued_once(client: TestClient, sync_redis: redis.Redis) -> None:
    body = make_slash_command("/ask", "once please")
    for _ in range(2):
        signed_body, headers = sign_request(body, SECRET, form=True)
        assert (await client.post("/webhooks/slack", data=signed_body, headers=headers)).status == 200
    (message,) = queued(sync_redis)
    assert message.event == CommandIssued(name="ask") and message.text == "once please"


async def test_a_command_is_acked_at_once_and_answered_in_the_channel(
    env: dict[str, str], fake: FakeSlack, aiohttp_client: Any
) -> None:
    client = await aiohttp_client(create_app(load_settings(env), listeners=False))
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(load_settings(env), stop))
    try:
        body, headers = sign_request(make_slash_command("/ask", "hello from a slash command"), SECRET, form=True)
        started = time.monotonic()
        resp = await client.post("/webhooks/slack", data=body, headers=headers)
        assert resp.status == 200 and await resp.read() == b""
        assert time.monotonic() - started < 3

        async def answered() -> bool:
            if worker.done():
                worker.result()
            return any("slash command" in str(c.params.get("text")) for c in fake.sent(channel="C0GENERAL"))

        await wait_until(answered, "the agent's answer in the channel", timeout=60)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(worker, return_exceptions=True), 30)
    reply = next(c for c in fake.sent(channel="C0GENERAL") if "slash command" in str(c.params.get("text")))
    assert reply.params.get("thread_ts") in (None, "")
