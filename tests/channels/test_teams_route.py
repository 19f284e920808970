"""Teams end to end: a signed activity through the real webhook route and real Redis, the agent run by the real
runtime on a slow local model, the reply posted to the fake Connector under the service URL's path — once, however
often Teams re-sends the activity while the agent works."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import redis
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient

from switchboard.channels.teams.adapter import TeamsChannel
from switchboard.channels.teams.fake.platform import SIMULATION, FakeTeams
from switchboard.channels.teams.settings import TeamsSettings
from switchboard.cli.checks import config_problems
from switchboard.cli.worker import build_runtime, provider_config
from switchboard.core.providers import ModelFactory
from switchboard.outbound.deliver import ChannelDeliverer
from switchboard.settings import Settings, load_settings
from switchboard.web.app import create_app
from switchboard.worker.drain import Drainer
from tests.channels.teams_support import (
    APP_ID,
    PASSWORD,
    make_channel,
    payload,
    post,
    session_of,
    teams_env,
)

PERSONAL = "a:1HkC_personal-chat-id"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTeams]:
    async with FakeTeams(app_id=APP_ID, app_password=PASSWORD) as server:
        yield server


@pytest.fixture
def settings(base_env: dict[str, str], fake: FakeTeams) -> Settings:
    env = base_env | teams_env(fake) | {"SWITCHBOARD_OFFLINE__DELAY_MS": "2500", "SWITCHBOARD_MODEL": "offline"}
    return load_settings(env)


@pytest.fixture
async def client(settings: Settings, aiohttp_client: Any) -> TestClient:
    return await aiohttp_client(create_app(settings, listeners=False))  # type: ignore[no-any-return]


@pytest.fixture
async def channel(fake: FakeTeams) -> AsyncIterator[TeamsChannel]:
    adapter = make_channel(fake)
    yield adapter
    await adapter.aclose()


def inboxes(r: redis.Redis) -> dict[str, int]:
    return {key.decode(): int(r.llen(key)) for key in r.keys("sb:*:inbox")}


async def test_a_resend_is_acknowledged_and_dropped(
    client: TestClient, fake: FakeTeams, sync_redis: redis.Redis
) -> None:
    activity = payload("personal.json", fake.service_url)
    assert await post(client, fake, activity) == 202
    assert list(inboxes(sync_redis).values()) == [1]
    for _ in range(3):  # Teams re-sends an activity it got no answer to within ~15 s; fresh tokens each time
        assert await post(client, fake, activity) == 202
    assert list(inboxes(sync_redis).values()) == [1]


async def test_an_activity_is_answered_once_by_the_worker_however_often_it_is_resent(
    client: TestClient,
    fake: FakeTeams,
    channel: TeamsChannel,
    settings: Settings,
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
) -> None:
    activity = payload("personal.json", fake.service_url)
    assert await post(client, fake, activity) == 202  # acknowledged before any agent work
    (inbox,) = inboxes(sync_redis)
    models = ModelFactory(provider_config(settings))
    runtime = build_runtime(settings, models)
    drainer = Drainer(
        async_redis,
        settings.queue,
        runner=runtime.run_turn,  # the offline model answers after 2.5 s: a slow agent run
        deliverer=ChannelDeliverer({("teams", "default"): channel}),
        agent_for=lambda message: settings.file.agent(message.conversation.agent),
        worker_id="w-teams",
        workspace_root=settings.data_path / "workspaces",
    )
    try:
        running = asyncio.create_task(drainer.drain(session_of(inbox)))
        await fake.wait_for(lambda: fake.sent(PERSONAL, kind="typing"), within_s=10)  # the agent is at work
        for _ in range(3):  # re-sent while the agent runs
            assert await post(client, fake, activity) == 202
            await asyncio.sleep(0.2)
        await asyncio.wait_for(running, 30)
        assert await post(client, fake, activity) == 202  # and once more after the answer
        await drainer.drain(session_of(inbox))
    finally:
        await models.aclose()
    (reply,) = fake.sent(PERSONAL)  # one message: the streamed preview, edited into the whole answer
    assert reply.prefix == "/amer/" and reply.body["textFormat"] == "markdown"
    final = [text for (conversation, _), text in fake.messages.items() if conversation == PERSONAL]
    assert len(final) == 1 and "order 42" in final[0]  # the offline model repeats the message
    assert all(update.prefix == "/amer/" for update in fake.updates(PERSONAL))
    assert inboxes(sync_redis) in ({}, {inbox: 0})


async def test_a_channel_thread_reply_goes_into_the_thread(
    client: TestClient,
    fake: FakeTeams,
    channel: TeamsChannel,
    settings: Settings,
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
) -> None:
    activity = payload("channel_thread_mention.json", fake.service_url)
    assert await post(client, fake, activity) == 202
    (inbox,) = inboxes(sync_redis)
    models = ModelFactory(
        provider_config(settings.model_copy(update={"offline": settings.offline.model_copy(update={"delay_ms": 0})}))
    )
    runtime = build_runtime(settings, models)
    drainer = Drainer(
        async_redis,
        settings.queue,
        runner=runtime.run_turn,
        deliverer=ChannelDeliverer({("teams", "default"): channel}),
        agent_for=lambda message: settings.file.agent(message.conversation.agent),
        worker_id="w-teams",
        workspace_root=settings.data_path / "workspaces",
    )
    try:
        await drainer.drain(session_of(inbox))
    finally:
        await models.aclose()
    thread = activity["conversation"]["id"]
    (reply,) = fake.sent(thread)
    assert reply.conversation == thread and ";messageid=" in reply.conversation and reply.prefix == "/amer/"
    (final,) = [text for (conversation, _), text in fake.messages.items() if conversation == thread]
    assert "draft the release notes" in final and "&lt;at&gt;" not in final  # the bot's mention was removed


async def test_simulate_and_run_use_the_fake(
    base_env: dict[str, str], aiohttp_client: Any, async_redis: aioredis.Redis, sync_redis: redis.Redis
) -> None:
    """``switchboard run`` without credentials starts the fake; ``switchboard simulate teams`` talks to it."""
    block, platform = await SIMULATION.start(TeamsSettings())
    assert isinstance(platform, FakeTeams)
    try:
        details = SIMULATION.details(block)
        settings = load_settings(base_env)
        settings.set_channel_block("teams", block)
        client = await aiohttp_client(create_app(settings, listeners=False))
        sample = SIMULATION.request(details, "hello from simulate")
        resp = await client.post("/webhooks/teams", data=sample.body, headers=dict(sample.headers))
        assert resp.status == 202
        (inbox,) = inboxes(sync_redis)
        channel = TeamsChannel(block)
        models = ModelFactory(provider_config(settings))
        drainer = Drainer(
            async_redis,
            settings.queue,
            runner=build_runtime(settings, models).run_turn,
            deliverer=ChannelDeliverer({("teams", "default"): channel}),
            agent_for=lambda message: settings.file.agent(message.conversation.agent),
            worker_id="w-sim",
            workspace_root=settings.data_path / "workspaces",
        )
        try:
            await drainer.drain(session_of(inbox))
        finally:
            await models.aclose()
            await channel.aclose()
        async with aiohttp.ClientSession() as http:
            replies = await SIMULATION.replies(http, details, sample.conversation)
        assert len(replies) == 1 and "hello from simulate" in replies[0]
    finally:
        await platform.stop()


def test_check_says_what_a_teams_account_lacks(base_env: dict[str, str]) -> None:
    settings = load_settings(base_env | {"SWITCHBOARD_TEAMS__APP_ID": APP_ID})
    problems = config_problems(settings)
    found = [p for p in problems if "SWITCHBOARD_TEAMS__" in p]
    assert len(found) == 1 and "SWITCHBOARD_TEAMS__APP_PASSWORD" in found[0], problems
