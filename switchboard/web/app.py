"""The web tier: ``create_app(settings)`` wires webhooks, the web chat, ``/healthz`` and ``/metrics``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Final

from aiohttp import web

from switchboard.channels.registry import ChannelSet, build_channels, send_rates
from switchboard.outbound.direct import DirectText
from switchboard.outbound.ratelimits import SendBuckets
from switchboard.outbound.webstream import WebStreamPublisher
from switchboard.queue.connection import as_redis, async_client
from switchboard.queue.ingest import Ingestor
from switchboard.queue.reaper import live_workers, worker_ttl_s
from switchboard.queue.router import IngestRouter, check_routing
from switchboard.queue.stats import Stats, read_stats
from switchboard.settings import Settings
from switchboard.web import webhooks
from switchboard.web.api import routes as api_routes
from switchboard.web.appkeys import CHANNELS, INGESTOR, METRICS, REDIS, ROUTER, SETTINGS
from switchboard.web.console import access as console_access
from switchboard.web.console import api as console_api
from switchboard.web.console import routes as console_routes
from switchboard.web.console import schedules as console_schedules
from switchboard.web.console import stream as console_stream
from switchboard.web.console.budgets import add_budget_routes
from switchboard.web.console.drafts import add_draft_routes
from switchboard.web.console.memory import add_memory_routes
from switchboard.web.console.review import add_review_routes
from switchboard.web.mcpserve import routes as mcp_routes
from switchboard.web.metrics import CONTENT_TYPE, Metrics
from switchboard.web.webchat import routes as webchat

__all__ = ["create_app"]

logger = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 1.0
METRICS_TIMEOUT_S: Final = 5.0
"""How long ``/metrics`` waits for the queue figures: a scrape reads every shard (4,096 commands in one pipeline),
well within a scraper's usual 10 s; past it the scrape answers without them rather than fail."""
LISTENERS_STOP_S = 5.0
"""How long shutdown waits for the listeners (their leases are released as they stop)."""


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
        async with asyncio.timeout(METRICS_TIMEOUT_S):
            snapshot = await read_stats(redis)
            workers = await live_workers(redis, worker_ttl_s(request.app[SETTINGS].queue))
    except Exception as exc:  # metrics must answer even when Redis does not
        logger.warning("/metrics could not read queue figures: %s", type(exc).__name__)
    body = request.app[METRICS].render(snapshot, workers)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def _listeners(app: web.Application) -> AsyncIterator[None]:
    """Run the long-running connections (Discord's gateway, Telegram long polling, Slack Socket Mode).

    Every web process offers to run them; the listener host holds each account's under a fenced Redis lease, so
    exactly one process runs it at a time, and another takes over when that one dies.
    """
    adapters = [adapter for adapter in app[CHANNELS].values() if adapter.listener() is not None]
    if not adapters:
        yield
        return
    from switchboard.queue.holders import ListenerHost

    host = ListenerHost(app[REDIS], adapters, app[ROUTER].emit_for)
    task = asyncio.create_task(host.run(), name="listeners")
    task.add_done_callback(_listeners_ended)
    yield
    deadline = time.monotonic() + LISTENERS_STOP_S
    while not task.done() and time.monotonic() < deadline:
        task.cancel()  # again each round: a connection library that swallowed one cancellation gets another
        await asyncio.wait([task], timeout=0.5)
    if not task.done():  # a connection that ignores cancellation must not keep the process from stopping
        logger.warning("listeners did not stop within %.0f s of shutdown; leaving them", LISTENERS_STOP_S)


def _listeners_ended(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("the listener host stopped: %r", task.exception())


def create_app(settings: Settings, *, listeners: bool = True) -> web.Application:
    """Build the aiohttp application for ``switchboard web`` (and ``run``).

    Args:
        settings: the settings read at start-up.
        listeners: also run the channels' long-running connections (under a lease; one process at a time).
    """
    if not settings.redis_url:
        raise ValueError("create_app needs settings.redis_url")
    check_routing(settings.file)  # a binding naming an unknown channel stops start-up, not the first message
    app = web.Application(client_max_size=settings.queue.max_body_bytes)
    app[SETTINGS] = settings
    app[METRICS] = Metrics()
    app[METRICS].watch_workspaces(settings.workspace_path, settings.workspaces.total_quota_mb * 2**20)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        assert settings.redis_url is not None
        client = async_client(settings.redis_url)
        redis = as_redis(client)
        app[REDIS] = redis
        app[INGESTOR] = Ingestor(redis, settings.queue, settings.limits)
        publisher = WebStreamPublisher(redis, max_bytes=settings.limits.web_history_kib * 1024)
        channels = build_channels(settings, publish=publisher.publish)
        app[CHANNELS] = channels
        app[METRICS].allow_channels(name for name, _ in channels)
        channel_set = ChannelSet(channels, send_rates(settings))
        notify = DirectText(channel_set, SendBuckets(redis))  # access control's answer to a refused sender
        app[ROUTER] = IngestRouter(app[INGESTOR], settings.file, channels.keys(), app[METRICS], notify=notify)
        await channel_set.start()
        yield
        if (gate := app[ROUTER].gate) is not None:
            await gate.drain()
        await channel_set.aclose()
        await redis.aclose()

    app.cleanup_ctx.append(lifecycle)
    if listeners:
        app.cleanup_ctx.append(_listeners)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    webhooks.add_routes(app)
    webchat.add_routes(app)
    console_routes.add_routes(app)
    console_api.add_api_routes(app)
    console_stream.add_stream_routes(app)
    console_access.add_access_routes(app)
    add_budget_routes(app)
    api_routes.add_routes(app)
    console_schedules.add_schedule_routes(app)
    add_draft_routes(app)
    add_memory_routes(app)
    add_review_routes(app)
    if settings.mcp_serve.http:
        mcp_routes.add_routes(app)
    return app
