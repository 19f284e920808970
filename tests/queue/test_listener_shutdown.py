"""Stopping the listener host: one cancellation stops it and every task it started, wherever the cancellation lands.

The host runs Discord's real gateway listener against the fake gateway, with real Redis for the leases and for
what the listener emits. Each case starts a host, cancels it once (as ``app.py`` and ``switchboard discord`` do at
shutdown) at a different point, and requires the host to finish with no listener task left running. A loop
iteration count picks the point, never a clock: the cancellation lands on the host's Redis calls (taking the lease),
on the gateway's connection, and on an emit in flight.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from switchboard.channels.base import Channel, Emit, Inbound
from switchboard.channels.discord.adapter import DiscordChannel
from switchboard.channels.discord.fake.platform import FakeDiscord, make_message
from switchboard.channels.registry import BuildContext
from switchboard.queue.holders import ListenerHost
from switchboard.queue.keys import GlobalKeys
from tests.channels._discord_fixtures import fake, settings

__all__ = ["fake"]  # a fixture, imported for pytest

LEASE = GlobalKeys().listener_lease("discord", "default")
EMITTED = "test:listener-shutdown:emitted"
STOP_WITHIN_S = 10.0
"""Generous: a host that honours its cancellation stops within a few loop iterations; this only turns a hang into
a failure."""
OURS = ("ListenerHost.", "_GatewayListener.", "DiscordGateway.")
"""The coroutines of the host's tasks: the holders, the lease keeper, the listener and its heartbeat."""


@pytest.fixture
async def adapter(fake: FakeDiscord) -> AsyncIterator[DiscordChannel]:
    channel = DiscordChannel(settings(fake.api_url), BuildContext(account="default"))
    await channel.start()
    yield channel
    await channel.aclose()


class Emitting:
    """An ``emit_for`` whose ``Emit`` writes what it receives to real Redis.

    With ``shutdown`` set to ``(host task, n)``, the first emit cancels the host (shutdown arriving while a message
    is being handed over) and lets ``n`` loop iterations pass before its Redis call.
    """

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self.started = asyncio.Event()
        self.shutdown: tuple[asyncio.Task[None], int] | None = None

    def __call__(self, channel: Channel) -> Emit:
        async def emit(inbound: Inbound) -> None:
            self.started.set()
            if self.shutdown is not None:
                host, steps = self.shutdown
                self.shutdown = None
                host.cancel()
                for _ in range(steps):
                    await asyncio.sleep(0)
            await self.redis.rpush(EMITTED, *(m.text for m in inbound.messages))

        return emit


def _ours(task: asyncio.Task[object]) -> bool:
    return str(getattr(task.get_coro(), "__qualname__", "")).startswith(OURS)


async def stops_cleanly(task: asyncio.Task[None], when: str) -> None:
    """The host's task, cancelled once, must finish, leaving none of its tasks behind."""
    done, _ = await asyncio.wait({task}, timeout=STOP_WITHIN_S)
    left = [t for t in asyncio.all_tasks() if _ours(t) and not t.done()]
    stacks = io.StringIO()
    for running in left:
        running.print_stack(limit=4, file=stacks)
    assert task in done, f"cancelled {when}, the host did not stop; still running:\n{stacks.getvalue()}"
    assert task.cancelled()
    assert left == [], f"cancelled {when}, the host stopped but left tasks running:\n{stacks.getvalue()}"


async def test_one_cancellation_stops_the_host_wherever_it_lands_during_start_up(
    async_redis: aioredis.Redis, adapter: DiscordChannel
) -> None:
    for steps in range(120):
        task = asyncio.create_task(ListenerHost(async_redis, [adapter], Emitting(async_redis)).run())
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        await stops_cleanly(task, f"{steps} loop iterations after it started")
        # a cancellation that lands while the lease script is in flight may leave a lease its TTL will end
        await async_redis.delete(LEASE)


async def test_one_cancellation_stops_a_connected_listener_even_during_an_emit(
    async_redis: aioredis.Redis, adapter: DiscordChannel, fake: FakeDiscord
) -> None:
    for steps in range(6):
        emitting = Emitting(async_redis)
        host = ListenerHost(async_redis, [adapter], emitting)
        task = asyncio.create_task(host.run())
        emitting.shutdown = (task, steps)
        await fake.gateway.wait_ready()
        await fake.gateway.dispatch("MESSAGE_CREATE", make_message(f"message {steps}", channel_id="300"))
        await asyncio.wait_for(emitting.started.wait(), STOP_WITHIN_S)
        await stops_cleanly(task, f"as an emit started, {steps} loop iterations before its Redis call")
        assert not host.held and await async_redis.get(LEASE) is None  # released on the way out
    assert fake.gateway.identifies == 6  # each host connected afresh, then let its connection go
