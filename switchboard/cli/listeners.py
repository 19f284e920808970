"""A process that only holds channels' long-running connections (``switchboard discord``).

The web tier runs every listener already (under the listener host's leases); a deployment that keeps its web
tier stateless and small, or has several web processes, can move them to a process of their own instead. That
process builds the adapters of the named channels only, offers each account's listener to the listener host
(one holder per account across all processes, so running it twice, or beside ``web``, is safe) and feeds what
they receive to the same ingest router as the webhooks. docs/ARCHITECTURE.md §2.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

from switchboard.channels.base import Channel
from switchboard.channels.registry import BuildContext, ChannelSet, account_configs, factory, send_rates
from switchboard.errors import ConfigError
from switchboard.outbound.direct import DirectText
from switchboard.outbound.ratelimits import SendBuckets
from switchboard.queue.connection import as_redis, async_client
from switchboard.queue.holders import ListenerHost
from switchboard.queue.ingest import Ingestor
from switchboard.queue.router import IngestRouter
from switchboard.settings import Settings

__all__ = ["build_adapters", "run_listeners"]

logger = logging.getLogger(__name__)


def build_adapters(settings: Settings, channels: Collection[str]) -> dict[tuple[str, str], Channel]:
    """The adapters of every enabled account of ``channels``, keyed by ``(channel, account)``.

    Raises:
        ConfigError: a channel does not exist, or an account's settings are invalid.
    """
    found: dict[tuple[str, str], Channel] = {}
    for name in channels:
        channel = factory(name)
        if channel is None:
            raise ConfigError(f"no channel named {name!r}", field=name)
        for config in account_configs(settings, channel, settings.environ or None):
            context = BuildContext(account=config.account, require_mention=config.require_mention, groups=config.groups)
            found[(name, config.account)] = channel.build(config.block, context)
    return found


async def run_listeners(settings: Settings, channels: Collection[str], stop: asyncio.Event) -> None:
    """Hold the listeners of ``channels`` until ``stop`` is set.

    Raises:
        ConfigError: no account of ``channels`` has a listener (nothing to run), or no Redis URL is set.
    """
    if not settings.redis_url:
        raise ConfigError("set SWITCHBOARD_REDIS_URL (the Redis the web tier and workers use)", field="redis_url")
    adapters = build_adapters(settings, channels)
    listening = [adapter for adapter in adapters.values() if adapter.listener() is not None]
    if not listening:
        names = ", ".join(sorted(channels))
        raise ConfigError(f"no account of {names} has a long-running connection to hold: is its bot token set?")
    client = async_client(settings.redis_url)
    redis = as_redis(client)
    notify = DirectText(ChannelSet(adapters, send_rates(settings)), SendBuckets(redis))  # access refusals' answers
    ingestor = Ingestor(redis, settings.queue, settings.limits)
    router = IngestRouter(ingestor, settings.file, adapters.keys(), notify=notify)
    for adapter in adapters.values():
        await adapter.start()
    host = ListenerHost(redis, listening, router.emit_for)
    task = asyncio.create_task(host.run(), name="listeners")
    logger.info("holding %d listener(s): %s", len(listening), ", ".join(f"{a.name}/{a.account}" for a in listening))
    try:
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if task.done():
            task.result()  # the host failed: say why
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if router.gate is not None:
            await router.gate.drain()
        for adapter in adapters.values():
            await adapter.aclose()
        await redis.aclose()
