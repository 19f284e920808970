"""The web tier: ``create_app(settings)`` wires webhooks, the web chat, ``/healthz`` and ``/metrics``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from switchboard import webchat, webhooks
from switchboard.appkeys import CHANNELS, INGESTOR, METRICS, REDIS, SETTINGS
from switchboard.channels.registry import ChannelSet, build_channels
from switchboard.metrics import CONTENT_TYPE, Metrics
from switchboard.queue.connection import async_client
from switchboard.queue.ingest import Ingestor
from switchboard.queue.reaper import live_workers, worker_ttl_s
from switchboard.queue.stats import Stats, read_stats
from switchboard.queue.webstream import WebStreamPublisher
from switchboard.settings import Settings

__all__ = ["create_app"]

logger = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 1.0


async def _healthz(request: web.Request) -> web.Response:
    """200 when Redis answers, with the number of live workers; 503 otherwise."""
    redis = request.app[REDIS]
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT_S):
            await redis.ping()
            workers = await live_workers(redis, worker_ttl_s(request.app[SETTINGS].queue))
    except Exception as exc:
        return web.json_response({"status": "unavailable", "redis": False, "error": type(exc).__name__}, status=503)
    return web.json_response({"status": "ok", "redis": True, "workers": int(workers)})


async def _metrics(request: web.Request) -> web.Response:
    redis = request.app[REDIS]
    snapshot: Stats | None = None
    workers: int | None = None
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT_S):
            snapshot = await read_stats(redis)
            workers = await live_workers(redis, worker_ttl_s(request.app[SETTINGS].queue))
    except Exception as exc:  # metrics must answer even when Redis does not
        logger.warning("/metrics could not read queue figures: %s", type(exc).__name__)
    body = request.app[METRICS].render(snapshot, workers)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def create_app(settings: Settings) -> web.Application:
    """Build the aiohttp application for ``switchboard web`` (and ``run``)."""
    if not settings.redis_url:
        raise ValueError("create_app needs settings.redis_url")
    app = web.Application(client_max_size=settings.queue.max_body_bytes)
    app[SETTINGS] = settings
    app[METRICS] = Metrics()
    app[METRICS].watch_workspaces(settings.data_path / "workspaces", settings.workspaces.total_quota_mb * 2**20)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        assert settings.redis_url is not None
        redis = async_client(settings.redis_url)
        app[REDIS] = redis
        app[INGESTOR] = Ingestor(redis, settings.queue, settings.limits)
        publisher = WebStreamPublisher(redis, max_bytes=settings.limits.web_history_kib * 1024)
        channels = build_channels(settings, publish=publisher.publish)
        app[CHANNELS] = channels
        app[METRICS].allow_channels(name for name, _ in channels)
        channel_set = ChannelSet(channels)
        await channel_set.start()
        yield
        await channel_set.aclose()
        await redis.aclose()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    webhooks.add_routes(app)
    webchat.add_routes(app)
    return app
