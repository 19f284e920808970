"""A listener holder frozen (SIGSTOP) past its lease: another process takes over, and the frozen one, once it
resumes, stops without emitting what the new holder owns (fenced), and never takes the lease back by itself."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from switchboard.channels.base import Inbound
from switchboard.channels.discord.adapter import DiscordChannel, _GatewayListener
from switchboard.channels.discord.fake.platform import FakeDiscord, make_message
from switchboard.channels.registry import BuildContext
from tests.channels._discord_fixtures import APP_ID, BOT_ID
from tests.channels._discord_fixtures import TOKEN as DISCORD_TOKEN
from tests.channels._discord_fixtures import settings as discord_settings
from tests.fakes.telegram_api import FakeTelegram, make_update
from tests.queue.test_holders import LEASE, ROOT, TOKEN, Hosts
from tests.waiting import wait_until

CHILD_LEASE_MS = 1000


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN) as server:
        yield server


@pytest.fixture
async def hosts(async_redis: aioredis.Redis, fake: FakeTelegram) -> AsyncIterator[Hosts]:
    group = Hosts(async_redis, fake)
    yield group
    await group.close()


async def test_a_frozen_holder_is_taken_over_and_stops_without_double_emitting_when_it_resumes(
    redis_url: str, async_redis: aioredis.Redis, fake: FakeTelegram, hosts: Hosts
) -> None:
    child = "frozen-child"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "tests.queue.listener_process", redis_url, fake.base_url, TOKEN, child,
            str(CHILD_LEASE_MS)]  # fmt: skip
    process = subprocess.Popen(args, cwd=ROOT, env=env)

    async def holder() -> str:
        value = await async_redis.get(LEASE)
        return value.decode() if value else ""

    async def child_emitted() -> list[bytes]:
        return list(await async_redis.lrange(f"test:emitted:{child}", 0, -1))

    try:
        await wait_until(lambda: _endswith(holder(), f":{child}"), "the child holds the lease")
        survivor = hosts.start("survivor")
        fake.push_update(make_update("to the child", chat_id=501, update_id=500))
        await wait_until(lambda: _equals(child_emitted(), [b"500"]), "the child emitted its update")
        process.send_signal(signal.SIGSTOP)  # frozen while its long poll may be in flight
        await wait_until(lambda: _endswith(holder(), ":survivor"), "the survivor took the lease over")
        for update_id in (501, 502):
            fake.push_update(make_update(f"update {update_id}", chat_id=501, update_id=update_id))
        await wait_until(lambda: _true(hosts.emitted["survivor"] == ["501", "502"]), "the survivor polled")
        process.send_signal(signal.SIGCONT)  # the frozen holder wakes up, thinking it still holds the bot
        await asyncio.sleep(CHILD_LEASE_MS / 1000 * 2)  # long enough for its renewal to fail and its poll to end
        for update_id in (503, 504):
            fake.push_update(make_update(f"update {update_id}", chat_id=501, update_id=update_id))
        await wait_until(lambda: _true(hosts.emitted["survivor"][-2:] == ["503", "504"]), "the survivor kept polling")
        await asyncio.sleep(CHILD_LEASE_MS / 1000 * 2)
        assert await child_emitted() == [b"500"]  # it emitted nothing the survivor owned
        assert (await holder()).endswith(":survivor") and survivor.acquired == 1
        everything = [*(e.decode() for e in await child_emitted()), *hosts.emitted["survivor"]]
        assert sorted(everything) == ["500", "501", "502", "503", "504"]  # each update exactly once
        assert process.poll() is None  # the resumed process lives on, waiting for the lease: not crashed
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait(10)


async def _endswith(value: object, suffix: str) -> bool:
    return str(await value).endswith(suffix)  # type: ignore[misc]


async def _equals(value: object, expected: object) -> bool:
    return await value == expected  # type: ignore[misc, no-any-return]


async def _true(value: bool) -> bool:
    return value


@pytest.mark.parametrize("data", ["x", [1, 2], 7], ids=["string", "list", "number"])
async def test_a_malformed_gateway_dispatch_is_dropped_not_fatal_to_the_listener(data: object) -> None:
    """A ``THREAD_CREATE`` whose ``d`` is not an object raised AttributeError out of the gateway listener: the
    listener died (and its lease was given up), losing the connection and whatever Discord sent meanwhile."""
    async with FakeDiscord(DISCORD_TOKEN, bot_id=BOT_ID, application_id=APP_ID) as discord:
        discord.gateway.heartbeat_interval_ms = 50
        adapter = DiscordChannel(discord_settings(discord.api_url), BuildContext(account="default"))
        await adapter.start()
        listener = adapter.listener()
        assert isinstance(listener, _GatewayListener)
        listener.retry_s = 0.01
        got: list[str] = []

        async def emit(inbound: Inbound) -> None:
            got.extend(m.text for m in inbound.messages)

        task = asyncio.create_task(listener.listen(emit))
        try:
            await discord.gateway.wait_ready()
            for event in ("THREAD_CREATE", "GUILD_CREATE", "THREAD_LIST_SYNC"):
                await discord.gateway.dispatch(event, data)  # type: ignore[arg-type]
                await discord.gateway.dispatch(event, {"threads": [data], "id": "1"})
            await discord.gateway.dispatch("MESSAGE_CREATE", make_message("still listening", channel_id="300"))
            async with asyncio.timeout(20):
                while not got and not task.done():
                    await asyncio.sleep(0.01)
            assert not task.done(), task.exception()
            assert got == ["still listening"]
            assert discord.gateway.identifies == 1  # the same connection: nothing was missed in between
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await adapter.aclose()
