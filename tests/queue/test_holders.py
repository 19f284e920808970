"""The listener host: one Telegram poller per bot across hosts, held by a fenced lease in real Redis, taken over
when the holder stops, loses its lease, or is killed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from switchboard.channels.base import Channel, Emit, Inbound
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.channels.telegram.settings import TelegramSettings
from switchboard.queue.holders import ListenerHost
from switchboard.queue.keys import GlobalKeys
from tests.fakes.telegram_api import FakeTelegram, make_update
from tests.waiting import wait_until

TOKEN = "123456:TEST-token-abcdefghijklmnopqrstuv"
LEASE_MS = 600
KEYS = GlobalKeys()
LEASE = KEYS.listener_lease("telegram", "default")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN) as server:
        yield server


def polling_adapter(fake: FakeTelegram) -> TelegramChannel:
    block = TelegramSettings.model_validate({"bot_token": TOKEN, "api_base_url": fake.base_url, "transport": "polling"})
    return TelegramChannel(block, poll_timeout=1, poll_backoff=(0.01, 0.05))


class Hosts:
    """Hosts competing for one bot in this process; what each emitted, and whether two ever held at once."""

    def __init__(self, redis: aioredis.Redis, fake: FakeTelegram) -> None:
        self.redis, self.fake = redis, fake
        self.hosts: dict[str, ListenerHost] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.emitted: dict[str, list[str]] = {}
        self.adapters: list[TelegramChannel] = []
        self.overlaps = 0
        self._watch: asyncio.Task[None] | None = None

    def start(self, name: str) -> ListenerHost:
        adapter = polling_adapter(self.fake)
        self.adapters.append(adapter)
        self.emitted[name] = []

        def emit_for(channel: Channel) -> Emit:
            async def emit(inbound: Inbound) -> None:
                self.emitted[name].extend(m.dedup_key for m in inbound.messages)

            return emit

        host = ListenerHost(self.redis, [adapter], emit_for, lease_ms=LEASE_MS, holder_id=name)
        self.hosts[name] = host
        self.tasks[name] = asyncio.create_task(host.run())
        if self._watch is None:
            self._watch = asyncio.create_task(self._watching())
        return host

    async def _watching(self) -> None:
        while True:
            if sum(1 for host in self.hosts.values() if host.held) > 1:
                self.overlaps += 1
            await asyncio.sleep(0.002)

    def holders(self) -> list[str]:
        return [name for name, host in self.hosts.items() if host.held]

    async def stop(self, name: str) -> None:
        task = self.tasks.pop(name)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def close(self) -> None:
        for name in list(self.tasks):
            await self.stop(name)
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        for adapter in self.adapters:
            await adapter.aclose()

    def all_emitted(self) -> list[str]:
        return [key for keys in self.emitted.values() for key in keys]


@pytest.fixture
async def hosts(async_redis: aioredis.Redis, fake: FakeTelegram) -> AsyncIterator[Hosts]:
    group = Hosts(async_redis, fake)
    yield group
    await group.close()


async def test_exactly_one_host_polls_and_another_takes_over_when_it_stops(
    hosts: Hosts, fake: FakeTelegram, async_redis: aioredis.Redis
) -> None:
    hosts.start("host-a")
    hosts.start("host-b")
    await wait_until(lambda: len(hosts.holders()) == 1, "one host holds the lease")
    [first] = hosts.holders()
    lease = await async_redis.get(LEASE)
    assert lease is not None and lease.decode().endswith(f":{first}")
    for n in range(5):
        fake.push_update(make_update(f"m{n}", chat_id=501, update_id=100 + n))
    await wait_until(lambda: len(hosts.all_emitted()) == 5, "five updates emitted")
    assert hosts.emitted[first] == [str(100 + n) for n in range(5)]

    await hosts.stop(first)  # a graceful stop releases the lease: the other takes over without waiting for expiry
    await wait_until(lambda: len(hosts.holders()) == 1, "the other host holds the lease")
    [second] = hosts.holders()
    assert second != first
    for n in range(5, 8):
        fake.push_update(make_update(f"m{n}", chat_id=501, update_id=100 + n))
    await wait_until(lambda: len(hosts.all_emitted()) == 8, "the rest emitted by the new holder")
    assert hosts.emitted[second] == [str(100 + n) for n in range(5, 8)]
    assert sorted(hosts.all_emitted()) == [str(100 + n) for n in range(8)]  # each exactly once
    assert hosts.overlaps == 0
    assert hosts.hosts[first].acquired == 1 and hosts.hosts[second].acquired == 1
    epoch = int((await async_redis.get(LEASE) or b"0:").decode().split(":")[0])
    assert epoch == hosts.hosts[second].held[("telegram", "default")].epoch  # a new epoch: the fencing token


async def test_a_holder_that_loses_its_lease_stops_its_listener_at_once(
    hosts: Hosts, fake: FakeTelegram, async_redis: aioredis.Redis
) -> None:
    host = hosts.start("only")
    await wait_until(lambda: bool(host.held), "the host holds the lease")
    await wait_until(lambda: any(c.method == "getUpdates" for c in fake.calls), "polling started")
    await async_redis.set(LEASE, "999999999999:intruder", px=60_000)  # another epoch took it
    await wait_until(lambda: not host.held, "the listener stopped with the lease")
    polls = sum(1 for c in fake.calls if c.method == "getUpdates")
    fake.push_update(make_update("while not ours", chat_id=501, update_id=300))
    await asyncio.sleep(LEASE_MS / 1000)  # a few renewal intervals in which nothing may poll
    assert sum(1 for c in fake.calls if c.method == "getUpdates") <= polls + 1  # at most the poll already on its way
    assert hosts.emitted["only"] == []
    assert (await async_redis.get(LEASE)) == b"999999999999:intruder"  # the loser did not release another's lease
    await async_redis.delete(LEASE)
    await wait_until(lambda: hosts.emitted["only"] == ["300"], "the host took the free lease again and polled")
    assert host.acquired == 2


async def test_hosts_without_listeners_do_nothing(async_redis: aioredis.Redis, fake: FakeTelegram) -> None:
    block = TelegramSettings.model_validate({"bot_token": TOKEN, "api_base_url": fake.base_url})  # webhook
    adapter = TelegramChannel(block)

    def emit_for(channel: Channel) -> Emit:
        raise AssertionError("no listener, no emit")

    await asyncio.wait_for(ListenerHost(async_redis, [adapter], emit_for).run(), 5)
    assert await async_redis.keys("*") == [] and fake.calls == []
    await adapter.aclose()


async def test_a_killed_holder_process_is_taken_over_within_the_lease(
    redis_url: str, async_redis: aioredis.Redis, fake: FakeTelegram, hosts: Hosts
) -> None:
    child = "child-process"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "tests.queue.listener_process", redis_url, fake.base_url, TOKEN, child, "1000"]
    process = subprocess.Popen(args, cwd=ROOT, env=env)
    try:

        async def holder() -> str:
            value = await async_redis.get(LEASE)
            return value.decode() if value else ""

        async with asyncio.timeout(30):
            while not (await holder()).endswith(f":{child}"):
                await asyncio.sleep(0.02)
        survivor = hosts.start("survivor")  # it waits: the child holds the lease
        fake.push_update(make_update("to the child", chat_id=501, update_id=400))
        async with asyncio.timeout(30):
            while await async_redis.lrange(f"test:emitted:{child}", 0, -1) != [b"400"]:
                await asyncio.sleep(0.02)
        await wait_until(lambda: fake.state.confirmed > 400, "the child confirmed its update")
        assert not survivor.held
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        fake.push_update(make_update("to whoever holds it now", chat_id=501, update_id=401))
        await wait_until(lambda: hosts.emitted["survivor"] == ["401"], "the survivor took over and polled")
        assert survivor.acquired == 1 and (await holder()).endswith(":survivor")
        assert await async_redis.lrange(f"test:emitted:{child}", 0, -1) == [b"400"]  # each update once
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
