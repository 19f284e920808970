"""Typed keys for what the web application holds (``app[SETTINGS]``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from switchboard.channels.base import Channel
    from switchboard.queue.ingest import Ingestor
    from switchboard.queue.router import IngestRouter
    from switchboard.settings import Settings
    from switchboard.web.metrics import Metrics

__all__ = ["CHANNELS", "INGESTOR", "METRICS", "REDIS", "ROUTER", "SETTINGS"]

SETTINGS: web.AppKey[Settings] = web.AppKey("settings")
REDIS: web.AppKey[aioredis.Redis] = web.AppKey("redis")
INGESTOR: web.AppKey[Ingestor] = web.AppKey("ingestor")
CHANNELS: web.AppKey[dict[tuple[str, str], Channel]] = web.AppKey("channels")
"""(channel, account) → adapter, for every enabled channel account."""
METRICS: web.AppKey[Metrics] = web.AppKey("metrics")
ROUTER: web.AppKey[IngestRouter] = web.AppKey("router")
"""Routes and durably accepts what webhooks, the web chat and listeners receive."""
