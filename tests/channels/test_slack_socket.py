"""Slack Socket Mode against the fake: envelopes acknowledged only once accepted, reconnects, the real app."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl

import pytest
import redis
from aiohttp.test_utils import TestClient

from switchboard.channels.base import Inbound
from switchboard.channels.slack.adapter import SlackChannel
from switchboard.channels.slack.fake.payloads import make_block_actions, make_event, make_slash_command
from switchboard.channels.slack.fake.platform import FakeSlack
from switchboard.channels.slack.socket import SlackSocketListener
from switchboard.core.messages import ChoiceSelected, CommandIssued
from switchboard.errors import QueueUnavailableError
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from tests.channels.slack_support import APP_TOKEN, BOT_TOKEN, make_channel


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(bot_token=BOT_TOKEN, app_token=APP_TOKEN) as server:
        yield server


@pytest.fixture
async def channel(fake: FakeSlack) -> AsyncIterator[SlackChannel]:
    adapter = make_channel(fake.api_url, app_token=APP_TOKEN, signing_secret=None)
    await adapter.start()
    yield adapter
    await adapter.aclose()


async def _connected(fake: FakeSlack, count: int = 1) -> None:
    await fake.wait_for(lambda: len(fake.state.sockets) >= count)


async def test_envelopes_are_acknowledged_after_emit_returned(channel: SlackChannel, fake: FakeSlack) -> None:
    received: list[Inbound] = []
    acks_at_emit: list[int] = []

    async def emit(inbound: Inbound) -> None:
        acks_at_emit.append(listener.acked)
        received.append(inbound)

    listener = channel.listener()
    assert isinstance(listener, SlackSocketListener)
    task = asyncio.create_task(listener.listen(emit))
    try:
        await _connected(fake)
        first = await fake.push("events_api", make_event("hello over the socket"))
        await fake.push("events_api", make_event("echo", user="U0BOTUSER", bot_id="B0BOTID"))  # own: acked, dropped
        click = await fake.push("interactive", make_block_actions("approve", label="Approve"))
        command = dict(parse_qsl(make_slash_command("/ask", "what now").decode()))
        await fake.push("slash_commands", command)
        await fake.push("slash_commands", {"command": "/ask"})  # no user, channel or trigger: acked, logged, dropped
        await fake.push("events_api", {"type": "event_callback", "event": "garbage"})  # acked, logged, dropped
        await fake.wait_for(lambda: len(fake.state.acks) == 6)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert fake.state.acks[0] == first and fake.state.acks[2] == click
    assert [m.text for i in received for m in i.messages] == ["hello over the socket", "Approve", "what now"]
    assert isinstance(received[1].messages[0].event, ChoiceSelected)
    assert received[2].messages[0].event == CommandIssued(name="ask")
    assert acks_at_emit == [0, 2, 3]  # each emit ran before its envelope was acknowledged


async def test_an_envelope_the_queue_did_not_take_is_not_acknowledged(channel: SlackChannel, fake: FakeSlack) -> None:
    calls = 0

    async def emit(inbound: Inbound) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise QueueUnavailableError("redis did not confirm")

    listener = channel.listener()
    assert listener is not None
    task = asyncio.create_task(listener.listen(emit))
    try:
        await _connected(fake)
        envelope = await fake.push("events_api", make_event("not yet"))
        await fake.wait_for(lambda: calls == 1)
        await fake.wait_for(lambda: len(fake.sent("apps.connections.open")) == 2)  # it reconnected
        await _connected(fake)
        assert fake.state.acks == []
        await fake.push("events_api", make_event("not yet"), envelope_id=envelope)  # Slack redelivers
        await fake.wait_for(lambda: fake.state.acks == [envelope])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert calls == 2


async def test_a_disconnect_message_reconnects(channel: SlackChannel, fake: FakeSlack) -> None:
    async def emit(inbound: Inbound) -> None:
        return None

    listener = channel.listener()
    assert listener is not None
    task = asyncio.create_task(listener.listen(emit))
    try:
        await _connected(fake)
        await fake.disconnect()
        await fake.wait_for(lambda: len(fake.sent("apps.connections.open")) == 2)
        await fake.wait_for(lambda: len(fake.state.sockets) == 1)
        envelope = await fake.push("events_api", make_event("after the refresh"))
        await fake.wait_for(lambda: fake.state.acks == [envelope])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_no_app_token_no_listener(fake: FakeSlack) -> None:
    assert make_channel(fake.api_url).listener() is None


async def test_socket_mode_end_to_end_through_the_app(
    base_env: dict[str, str], fake: FakeSlack, aiohttp_client: Any, sync_redis: redis.Redis
) -> None:
    env = base_env | {
        "SWITCHBOARD_SLACK__BOT_TOKEN": BOT_TOKEN,
        "SWITCHBOARD_SLACK__APP_TOKEN": APP_TOKEN,
        "SWITCHBOARD_SLACK__API_BASE_URL": fake.api_url,
    }
    client: TestClient = await aiohttp_client(create_app(load_settings(env)))
    assert (await client.get("/healthz")).status == 200
    await fake.wait_for(lambda: len(fake.state.sockets) == 1, within_s=15)
    event = make_event("queued from socket mode")
    envelope = await fake.push("events_api", event)
    await fake.wait_for(lambda: fake.state.acks == [envelope])
    inboxes = sync_redis.keys("sb:*:inbox")
    assert len(inboxes) == 1 and sync_redis.llen(inboxes[0]) == 1
    await fake.push("events_api", event)  # Slack's redelivery of the same event: deduplicated
    await fake.wait_for(lambda: len(fake.state.acks) == 2)
    assert sync_redis.llen(inboxes[0]) == 1
