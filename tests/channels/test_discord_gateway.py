"""Discord's gateway for real: the listener against the fake gateway (HELLO, IDENTIFY, READY, RESUME, heartbeats)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis
from aiohttp.test_utils import TestClient

from switchboard.channels.base import Inbound
from switchboard.channels.discord.adapter import DiscordChannel, _GatewayListener
from switchboard.channels.discord.fake.platform import FakeDiscord, make_command, make_message
from switchboard.channels.discord.gateway import INTENTS
from switchboard.channels.discord.outbound import message_nonce
from switchboard.core.actions import SendText
from switchboard.core.messages import CommandIssued, InboundMessage, MessageEdited, Posted
from switchboard.errors import QueueUnavailableError
from switchboard.queue.keys import SessionKeys
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from switchboard.web.app import create_app
from tests.channels._discord_fixtures import APP_ID, BOT_ID, PUBLIC_KEY, TOKEN, Sending, channel, fake
from tests.waiting import wait_until

__all__ = ["channel", "fake"]  # fixtures, imported for pytest

MESSAGE_CONTENT, GUILD_MESSAGES, DIRECT_MESSAGES = 1 << 15, 1 << 9, 1 << 12


class Recorder:
    """An ``Emit`` that records what the listener handed over (optionally failing the first ``fail`` calls)."""

    def __init__(self, fail: int = 0) -> None:
        self.accepted: list[InboundMessage] = []
        self.fail = fail
        self.changed = asyncio.Event()

    async def __call__(self, inbound: Inbound) -> None:
        if self.fail:
            self.fail -= 1
            raise QueueUnavailableError("redis did not confirm in time")
        self.accepted.extend(inbound.messages)
        self.changed.set()

    async def wait_for(self, count: int) -> list[InboundMessage]:
        while len(self.accepted) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 10)
        return self.accepted


@pytest.fixture
async def listening(
    channel: DiscordChannel, fake: FakeDiscord
) -> AsyncIterator[Callable[[Recorder], Awaitable[asyncio.Task[None]]]]:
    tasks: list[asyncio.Task[None]] = []
    fake.gateway.heartbeat_interval_ms = 50

    async def start(recorder: Recorder) -> asyncio.Task[None]:
        listener = channel.listener()
        assert isinstance(listener, _GatewayListener)
        listener.retry_s = 0.01
        task = asyncio.create_task(listener.listen(recorder))
        tasks.append(task)
        await fake.gateway.wait_ready()
        return task

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_identify_then_messages_in_order_and_heartbeats(
    listening: Callable[[Recorder], Awaitable[Any]], fake: FakeDiscord
) -> None:
    recorder = Recorder()
    await listening(recorder)
    [identify] = [p for p in fake.gateway.received if p["op"] == 2]
    assert identify["d"]["token"] == TOKEN and identify["d"]["intents"] == INTENTS
    assert INTENTS & MESSAGE_CONTENT and INTENTS & GUILD_MESSAGES and INTENTS & DIRECT_MESSAGES
    for i in range(5):
        await fake.gateway.dispatch("MESSAGE_CREATE", make_message(f"dm {i}", channel_id="300"))
    await fake.gateway.dispatch("MESSAGE_CREATE", make_message("no mention", channel_id="301", guild_id="200"))
    mention = make_message(f"<@{BOT_ID}> hi", channel_id="301", guild_id="200", mentions=[BOT_ID])
    await fake.gateway.dispatch("MESSAGE_CREATE", mention)
    accepted = await recorder.wait_for(6)
    assert [m.text for m in accepted] == [f"dm {i}" for i in range(5)] + ["hi"]
    assert all(isinstance(m.event, Posted) for m in accepted)
    while fake.gateway.heartbeats < 2:
        await asyncio.sleep(0.02)
    heartbeats = [p for p in fake.gateway.received if p["op"] == 1]
    assert heartbeats[-1]["d"] is not None  # the last sequence number received


async def test_resume_after_a_dropped_connection_loses_and_repeats_nothing(
    listening: Callable[[Recorder], Awaitable[Any]], fake: FakeDiscord
) -> None:
    recorder = Recorder()
    await listening(recorder)
    await fake.gateway.dispatch("MESSAGE_CREATE", make_message("before"))
    await recorder.wait_for(1)
    await fake.gateway.close(4000)
    await fake.gateway.dispatch("MESSAGE_CREATE", make_message("while away"))
    await fake.gateway.wait_ready()
    await fake.gateway.dispatch("MESSAGE_CREATE", make_message("after"))
    accepted = await recorder.wait_for(3)
    assert [m.text for m in accepted] == ["before", "while away", "after"]
    assert fake.gateway.resumes == 1 and fake.gateway.identifies == 1


async def test_an_event_not_durably_accepted_is_replayed_after_resume(
    listening: Callable[[Recorder], Awaitable[Any]], fake: FakeDiscord
) -> None:
    recorder = Recorder(fail=1)
    await listening(recorder)
    await fake.gateway.dispatch("MESSAGE_CREATE", make_message("first"))
    await fake.gateway.dispatch("MESSAGE_CREATE", make_message("second"))
    accepted = await recorder.wait_for(2)
    assert [m.text for m in accepted] == ["first", "second"]
    assert fake.gateway.resumes == 1
    [resume] = [p for p in fake.gateway.received if p["op"] == 6]
    assert resume["d"]["seq"] == 1  # READY was the last event handled: "first" is sent again


@pytest.mark.parametrize("how", ["reconnect", "invalid_session", "zombie"])
async def test_the_listener_recovers_by_itself(
    listening: Callable[[Recorder], Awaitable[Any]], fake: FakeDiscord, how: str
) -> None:
    recorder = Recorder()
    await listening(recorder)
    fake.gateway.ready.clear()
    if how == "reconnect":
        await fake.gateway.send_op(7)
    elif how == "invalid_session":
        await fake.gateway.send_op(9, False)
    else:
        fake.gateway.ack_heartbeats = False
    await fake.gateway.wait_ready()
    fake.gateway.ack_heartbeats = True
    await fake.gateway.dispatch("MESSAGE_CREATE", make_message(f"after {how}"))
    assert [m.text for m in await recorder.wait_for(1)] == [f"after {how}"]
    if how == "invalid_session":
        assert fake.gateway.identifies == 2 and fake.gateway.resumes == 0
    else:
        assert fake.gateway.identifies == 1 and fake.gateway.resumes == 1


async def test_edits_of_seen_messages_and_gateway_interactions(
    listening: Callable[[Recorder], Awaitable[Any]], fake: FakeDiscord
) -> None:
    recorder = Recorder()
    await listening(recorder)
    message = make_message(f"<@{BOT_ID}> draft", channel_id="301", guild_id="200", mentions=[BOT_ID])
    await fake.gateway.dispatch("MESSAGE_CREATE", message)
    edited = {**message, "content": "final words", "mentions": [], "edited_timestamp": "2026-12-01T12:05:00+00:00"}
    await fake.gateway.dispatch("MESSAGE_UPDATE", edited)
    command = make_command("ask", "over the gateway", application_id=APP_ID)
    await fake.gateway.dispatch("INTERACTION_CREATE", command)
    first, second, third = await recorder.wait_for(3)
    assert isinstance(second.event, MessageEdited) and second.text == "final words"
    assert second.event.original_id == first.platform_message_id
    assert isinstance(third.event, CommandIssued) and third.text == "over the gateway"
    await wait_until(lambda: any(c.route.endswith("/callback") for c in fake.calls), "the interaction's callback")
    [callback] = [c for c in fake.calls if c.route.endswith("/callback")]
    assert callback.body == {"type": 5} and callback.token == command["token"]


# through the real app: the listener host, the ingest router, Redis ----------------------------------------------


@pytest.fixture
async def gateway_app(base_env: dict[str, str], fake: FakeDiscord, aiohttp_client: Any) -> TestClient:
    env = base_env | {
        "SWITCHBOARD_DISCORD__BOT_TOKEN": TOKEN,
        "SWITCHBOARD_DISCORD__PUBLIC_KEY": PUBLIC_KEY,
        "SWITCHBOARD_DISCORD__APPLICATION_ID": APP_ID,
        "SWITCHBOARD_DISCORD__API_BASE_URL": fake.api_url,
    }
    return await aiohttp_client(create_app(load_settings(env)))  # type: ignore[no-any-return]


def _queued(sync_redis: redis.Redis) -> list[InboundMessage]:
    found: list[InboundMessage] = []
    for key in sorted(sync_redis.keys("sb:*:messages")):
        found += [InboundMessage.model_validate_json(v) for v in sync_redis.hvals(key)]
    return sorted(found, key=lambda m: m.received_at)


async def test_gateway_message_is_queued_once_and_answered_with_nonce(
    gateway_app: TestClient, fake: FakeDiscord, channel: DiscordChannel, sync_redis: redis.Redis
) -> None:
    await fake.gateway.wait_ready()
    message = make_message("hello over the gateway", channel_id="300")
    await fake.gateway.dispatch("MESSAGE_CREATE", message)
    await fake.gateway.dispatch("MESSAGE_CREATE", message)  # a replay after a resume: the same message id
    marker = make_message("marker", channel_id="300")
    await fake.gateway.dispatch("MESSAGE_CREATE", marker)
    while len(_queued(sync_redis)) < 2:
        await asyncio.sleep(0.02)
    queued = _queued(sync_redis)
    assert [m.text for m in queued] == ["hello over the gateway", "marker"]
    first = queued[0]
    assert first.conversation.agent == "assistant" and first.dedup_key == f"m:{message['id']}"
    keys = SessionKeys(SessionKey(first.session_key))
    assert sync_redis.llen(keys.inbox) == 2
    # the reply, as the worker's delivery performs it
    send = Sending(idempotency_key=f"run-{first.id}:reply")
    await channel.perform(SendText(text="hi @everyone"), first.conversation, send)
    [reply] = [c for c in fake.calls if c.route == "POST /channels/{channel_id}/messages"]
    assert reply.channel_id == "300" and reply.body["allowed_mentions"] == {"parse": []}
    assert reply.body["nonce"] == message_nonce(send.idempotency_key, 0) and reply.body["enforce_nonce"] is True
    assert reply.body["message_reference"]["message_id"] == message["id"]
    assert json.loads(json.dumps(reply.body))["content"] == "hi @everyone"


async def test_a_closed_adapter_opens_no_new_connection(
    listening: Callable[[Recorder], Awaitable[Any]], channel: DiscordChannel, fake: FakeDiscord
) -> None:
    """A listener outliving its adapter's shutdown (a host that has not cancelled it yet) must not reconnect."""
    await listening(Recorder())
    await channel.aclose()  # drops the websocket with the pool
    for _ in range(20):  # the listener retries every 10 ms here: give it many chances to reconnect
        await asyncio.sleep(0.01)
    assert fake.gateway.resumes == 0 and fake.gateway.identifies == 1
    assert channel._rest._session is None
