"""``switchboard discord`` (listeners only), ``register-commands``, and the simulation ``run`` offers."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
import redis
from aiohttp.test_utils import TestClient

from switchboard.channels.discord.factory import FACTORY
from switchboard.channels.discord.fake.platform import SIMULATION, FakeDiscord, make_message
from switchboard.channels.registry import env_block
from switchboard.cli.discord import register_commands
from switchboard.cli.listeners import run_listeners
from switchboard.cli.worker import run_worker
from switchboard.core.messages import InboundMessage
from switchboard.errors import ConfigError
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from tests.channels._discord_fixtures import APP_ID, PUBLIC_KEY, TOKEN, fake
from tests.waiting import wait_until

__all__ = ["fake"]  # fixtures, imported for pytest


def _env(base_env: dict[str, str], fake: FakeDiscord) -> dict[str, str]:
    return base_env | {
        "SWITCHBOARD_DISCORD__BOT_TOKEN": TOKEN,
        "SWITCHBOARD_DISCORD__PUBLIC_KEY": PUBLIC_KEY,
        "SWITCHBOARD_DISCORD__APPLICATION_ID": APP_ID,
        "SWITCHBOARD_DISCORD__API_BASE_URL": fake.api_url,
    }


async def test_the_discord_role_holds_the_gateway_and_queues_messages(
    base_env: dict[str, str], fake: FakeDiscord, sync_redis: redis.Redis
) -> None:
    settings = load_settings(_env(base_env, fake))
    stop = asyncio.Event()
    role = asyncio.create_task(run_listeners(settings, ["discord"], stop))
    await fake.gateway.wait_ready()
    await fake.gateway.dispatch("MESSAGE_CREATE", make_message("from the discord role", channel_id="300"))
    await wait_until(lambda: bool(sync_redis.keys("sb:*:messages")), "the message queued")
    [key] = sync_redis.keys("sb:*:messages")
    [body] = sync_redis.hvals(key)
    queued = InboundMessage.model_validate_json(body)
    assert queued.text == "from the discord role" and queued.conversation.agent == "assistant"
    stop.set()
    await asyncio.wait_for(role, 10)
    assert not fake.gateway.ready.is_set() or fake.gateway._socket is None or fake.gateway._socket.closed


async def test_the_discord_role_refuses_without_a_bot_token(base_env: dict[str, str]) -> None:
    settings = load_settings(base_env | {"SWITCHBOARD_DISCORD__PUBLIC_KEY": PUBLIC_KEY})
    with pytest.raises(ConfigError, match="bot token"):
        await run_listeners(settings, ["discord"], asyncio.Event())


async def test_register_commands(
    base_env: dict[str, str], fake: FakeDiscord, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await register_commands(load_settings(_env(base_env, fake))) == 0
    names = ["ask", "reset", "stop", "new", "status", "usage", "model", "whoami", "help"]  # /link: identity is off
    assert [c["name"] for c in fake.state.commands] == names
    assert "discord/default: registered /ask, /reset, /stop, /new, /status" in capsys.readouterr().out
    admins_only = [c["name"] for c in fake.state.commands if c.get("default_member_permissions") == "8"]
    assert admins_only == ["model"]  # a user may not use it: shown to server administrators only
    fake.state.refuse_next(1, status=401)
    assert await register_commands(load_settings(_env(base_env, fake))) == 1


async def test_simulated_discord_answers_through_a_worker(
    base_env: dict[str, str], aiohttp_client: Any, sync_redis: redis.Redis
) -> None:
    """What ``switchboard run`` + ``switchboard simulate discord TEXT`` do: a signed /ask, a worker, the fake."""
    settings = load_settings(base_env)
    block, platform = await SIMULATION.start(env_block(settings, FACTORY))
    try:
        settings.set_channel_block("discord", block)
        client: TestClient = await aiohttp_client(create_app(settings))
        details = SIMULATION.details(block)
        sample = SIMULATION.request(details, "hello simulated world")
        resp = await client.post("/webhooks/discord", data=sample.body, headers=dict(sample.headers))
        assert resp.status == 200 and await resp.json() == {"type": 5}
        stop = asyncio.Event()
        worker = asyncio.create_task(run_worker(settings, stop))
        try:
            async with aiohttp.ClientSession() as http:
                replies: list[str] = []
                while not any("hello simulated world" in reply for reply in replies):  # streamed: edits settle
                    assert not worker.done(), worker.exception()
                    replies = await SIMULATION.replies(http, details, sample.conversation)
                    await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.wait_for(worker, 20)
        assert isinstance(platform, FakeDiscord)
        sends = [c for c in platform.calls if c.method in ("POST", "PATCH") and c.token == f"sim-{sample.conversation}"]
        assert sends and sends[0].route == "PATCH /webhooks/{application_id}/{token}/messages/{message_id}"
        assert all(c.body["allowed_mentions"] == {"parse": []} for c in sends)
    finally:
        await platform.stop()
