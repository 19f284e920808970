"""Teams replies under a real drain: a send that fails in an unexpected way, and where the bot's token may go.

A signed activity whose ``serviceUrl`` the HTTP client cannot even use (``file:///etc/``) made the channel's send
raise a plain ``ValueError``: the drain crashed on every attempt, and the conversation's later messages were never
answered. Every send failure is now a classified delivery failure: the reply is dead-lettered with its reason and
the session moves on.

A genuine token for a ``serviceUrl`` off the Bot Connector's hosts (plain ``http``, loopback, the cloud metadata
address) sent the bot's own bearer token there with the reply. Replies now go only where file downloads may go:
``https`` on a host of ``SWITCHBOARD_TEAMS__CONNECTOR_HOSTS`` (or an origin it names, for a local fake).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestClient
from pydantic import ValidationError

from switchboard.channels.registry import env_block
from switchboard.channels.teams.adapter import TeamsChannel
from switchboard.channels.teams.factory import FACTORY
from switchboard.channels.teams.fake.platform import FakeTeams
from switchboard.channels.teams.settings import TEAMS_CONNECTOR_HOSTS, TeamsSettings
from switchboard.cli.worker import build_runtime, provider_config
from switchboard.core.providers import ModelFactory
from switchboard.outbound.deliver import ChannelDeliverer
from switchboard.queue.eventlog import read_events
from switchboard.queue.keys import SessionKeys
from switchboard.settings import Settings, load_settings
from switchboard.types import SessionKey
from switchboard.web.app import create_app
from switchboard.worker.drain import Drainer
from switchboard.worker.drainturn import DrainOutcome
from tests.channels.teams_support import APP_ID, PASSWORD, make_channel, payload, post, session_of, teams_env

PERSONAL = "a:1HkC_personal-chat-id"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTeams]:
    async with FakeTeams(app_id=APP_ID, app_password=PASSWORD) as server:
        yield server


@pytest.fixture
def settings(base_env: dict[str, str], fake: FakeTeams) -> Settings:
    env = base_env | teams_env(fake)
    env |= {
        "SWITCHBOARD_MODEL": "offline",
        "SWITCHBOARD_OFFLINE__DELAY_MS": "0",
        "SWITCHBOARD_QUEUE__SEND_MAX_ATTEMPTS": "2",
        "SWITCHBOARD_QUEUE__SEND_BACKOFF_S": "0.01",
        "SWITCHBOARD_QUEUE__RETRY_BACKOFF_S": "0.01",
    }
    return load_settings(env)


@pytest.fixture
async def client(settings: Settings, aiohttp_client: Any) -> TestClient:
    return await aiohttp_client(create_app(settings, listeners=False))  # type: ignore[no-any-return]


@pytest.fixture
async def channel(fake: FakeTeams) -> AsyncIterator[TeamsChannel]:
    adapter = make_channel(fake)
    yield adapter
    await adapter.aclose()


def activity(fake: FakeTeams, service_url: str, activity_id: str, text: str) -> dict[str, Any]:
    found = payload("personal.json", fake.service_url)
    found.update(serviceUrl=service_url, id=activity_id, text=text, attachments=[])
    return found


def the_session(r: redis.Redis) -> SessionKey:
    (inbox,) = [key.decode() for key in r.keys("sb:*:inbox")]
    return session_of(inbox)


async def drain(settings: Settings, channel: TeamsChannel, r: aioredis.Redis, session: SessionKey) -> DrainOutcome:
    models = ModelFactory(provider_config(settings))
    drainer = Drainer(
        r,
        settings.queue,
        runner=build_runtime(settings, models).run_turn,
        deliverer=ChannelDeliverer({("teams", "default"): channel}),
        agent_for=lambda message: settings.file.agent(message.conversation.agent),
        worker_id="w-teams",
        workspace_root=settings.data_path / "workspaces",
    )
    try:
        return await asyncio.wait_for(drainer.drain_session(session), 30)
    finally:
        await models.aclose()


@pytest.mark.parametrize("bad_url", ["file:///etc/", "https://user:secret@127.0.0.1:1/amer/"])
async def test_a_send_the_http_client_cannot_make_is_dead_lettered_and_the_conversation_goes_on(
    bad_url: str,
    client: TestClient,
    fake: FakeTeams,
    channel: TeamsChannel,
    settings: Settings,
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
) -> None:
    assert await post(client, fake, activity(fake, bad_url, "1764617400001", "first: order 41")) == 202
    assert await post(client, fake, activity(fake, fake.service_url, "1764617400002", "second: order 42")) == 202
    session = the_session(sync_redis)

    assert await drain(settings, channel, async_redis, session) is DrainOutcome.RELEASED

    answered = [text for (conversation, _), text in fake.messages.items() if conversation == PERSONAL]
    assert len(answered) == 1 and "order 42" in answered[0], answered  # the later message is answered
    events = await read_events(async_redis, session)
    (dead,) = [e for e in events if e["kind"] == "send_dead_lettered"]
    assert dead["attempts"] == 1 and "serviceUrl" in dead["reason"] and "not a Bot Connector host" in dead["reason"]
    assert "secret" not in str(events)  # a serviceUrl's userinfo never reaches the event log
    assert [e["kind"] for e in events].count("run_completed") == 2
    keys = SessionKeys(session)
    assert await async_redis.llen(keys.inbox) == 0 and await async_redis.exists(keys.lease) == 0


@pytest.fixture
async def elsewhere() -> AsyncIterator[list[str | None]]:
    """A server on loopback that is no Connector host: the ``Authorization`` header of every request it gets."""
    seen: list[str | None] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"id": "stolen"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    seen.append(f"http://127.0.0.1:{port}/amer/")  # the first entry: its service URL
    try:
        yield seen
    finally:
        await runner.cleanup()


async def test_a_reply_to_a_service_url_off_the_connector_hosts_never_gets_the_token(
    elsewhere: list[str | None],
    client: TestClient,
    fake: FakeTeams,
    channel: TeamsChannel,
    settings: Settings,
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
) -> None:
    service_url = str(elsewhere.pop(0))
    assert await post(client, fake, activity(fake, service_url, "1764617400001", "first: order 41")) == 202
    assert await post(client, fake, activity(fake, fake.service_url, "1764617400002", "second: order 42")) == 202
    session = the_session(sync_redis)

    assert await drain(settings, channel, async_redis, session) is DrainOutcome.RELEASED

    assert elsewhere == []  # before: the reply, its typing and its edits, each with "Bearer <the bot's token>"
    answered = [text for (conversation, _), text in fake.messages.items() if conversation == PERSONAL]
    assert len(answered) == 1 and "order 42" in answered[0], answered
    events = await read_events(async_redis, session)
    (dead,) = [e for e in events if e["kind"] == "send_dead_lettered"]
    assert dead["attempts"] == 1, dead  # refused for good: not retried
    assert "not a Bot Connector host" in dead["reason"] and "SWITCHBOARD_TEAMS__CONNECTOR_HOSTS" in dead["reason"]


def test_the_connector_hosts_are_read_from_the_environment(base_env: dict[str, str]) -> None:
    env = base_env | {"SWITCHBOARD_TEAMS__CONNECTOR_HOSTS": "Connector.Example., http://127.0.0.1:3978"}
    assert env_block(load_settings(env), FACTORY).connector_hosts == ("connector.example", "http://127.0.0.1:3978")
    assert env_block(load_settings(base_env), FACTORY).connector_hosts == TEAMS_CONNECTOR_HOSTS  # every cloud's


@pytest.mark.parametrize(
    "hosts",
    ["http://connector.example", "https://connector.example/amer/", "https://u:p@connector.example", "a/b", " , "],
)
def test_a_connector_host_that_is_no_https_host_or_origin_is_refused_at_start(hosts: str) -> None:
    with pytest.raises(ValidationError, match="connector_hosts"):
        TeamsSettings.model_validate({"connector_hosts": hosts})
