"""① The webhook route: size cap → handshake → verify → parse → durable ingest → 2xx.

No model call ever happens here. A message is acknowledged only once Redis holds it; when Redis
does not confirm in time the platform gets 503 and retries (its retry is deduplicated).
"""

from __future__ import annotations

import logging

from aiohttp import web

from switchboard.appkeys import CHANNELS, INGESTOR, METRICS, SETTINGS
from switchboard.channels.base import RawRequest
from switchboard.errors import MalformedBodyError, QueueUnavailableError, RequestError, excerpt

__all__ = ["add_routes", "error_response"]

logger = logging.getLogger(__name__)

_OK_BODY = b'{"ok":true}'


def error_response(status: int, code: str, message: str) -> web.Response:
    """A JSON error body that says what went wrong and what to fix."""
    return web.json_response({"ok": False, "error": {"code": code, "message": message}}, status=status)


async def _read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    return await request.read()


async def handle_webhook(request: web.Request) -> web.StreamResponse:
    """Serve ``/webhooks/{channel}`` and ``/webhooks/{channel}/{account}`` (POST, and GET for handshakes)."""
    app = request.app
    settings = app[SETTINGS]
    metrics = app[METRICS]
    channel_name = request.match_info["channel"]
    account = request.match_info.get("account", "default")
    adapter = app[CHANNELS].get((channel_name, account))
    if adapter is None or channel_name == "web":
        metrics.rejected(channel_name, "unknown_channel")
        return error_response(
            404,
            "unknown_channel",
            f"no enabled channel account {excerpt(channel_name)}/{excerpt(account)}: set the channel's credentials "
            "(SWITCHBOARD_<CHANNEL>__...) and restart; `switchboard check` lists what is enabled",
        )
    try:
        body = await _read_body(request, settings.queue.max_body_bytes)
    except web.HTTPRequestEntityTooLarge:
        metrics.rejected(channel_name, "too_large")
        return error_response(413, "body_too_large", f"body over {settings.queue.max_body_bytes} bytes")
    raw = RawRequest(request.method, request.path, request.headers, request.query, body)
    try:
        reply = adapter.handshake(raw)
        if reply is not None:
            return web.Response(status=reply.status, body=reply.body, content_type=reply.content_type)
        if request.method != "POST":
            return error_response(405, "method_not_allowed", "webhooks accept POST")
        adapter.verify(raw)
        try:
            drafts = adapter.parse(raw)
        except RequestError:
            raise
        except Exception as exc:  # an adapter bug on odd input must still be a 400, never a 500
            logger.warning("%s parser failed on a request: %s", channel_name, type(exc).__name__)
            raise MalformedBodyError(f"could not read the {channel_name} payload", channel=channel_name) from exc
    except RequestError as err:
        metrics.rejected(channel_name, err.code)
        return error_response(err.status, err.code, str(err))
    ingestor = app[INGESTOR]
    policy = settings.file.channels.get(channel_name)
    try:
        for draft in drafts:
            agent = settings.file.agents.get(draft.conversation.agent)
            busy = (policy.busy_policy if policy and policy.busy_policy else None) or (
                agent.busy_policy if agent else "sequential"
            )
            result = await ingestor.ingest(draft, busy_policy=busy)
            if result.limited is not None:  # still 2xx: a refusal would only be retried; the drop is logged
                metrics.rejected(channel_name, "rate_limited")
            else:
                metrics.ingested(channel_name, duplicate=result.duplicate)
    except QueueUnavailableError:
        metrics.rejected(channel_name, "queue_unavailable")
        return error_response(503, "queue_unavailable", "the queue did not confirm in time; retry")
    return web.Response(body=_OK_BODY, content_type="application/json")


def add_routes(app: web.Application) -> None:
    """Register the webhook routes (docs/ARCHITECTURE.md §10)."""
    for path in ("/webhooks/{channel}", "/webhooks/{channel}/{account}"):
        app.router.add_route("POST", path, handle_webhook)
        app.router.add_route("GET", path, handle_webhook)
