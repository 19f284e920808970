"""① The webhook route: size cap → verify → receive → ingest router → the answer the platform expects.

No model call ever happens here. A message is acknowledged only once Redis holds it; when Redis does not confirm
in time the platform gets 503 and retries (its retry is deduplicated). Each channel declares the HTTP methods its
route takes (``ChannelFactory.webhook_methods``): ``POST`` everywhere, ``GET`` too where the platform makes a
handshake by ``GET`` (Meta's ``hub.challenge``); any other method is 405 before the adapter sees it.
"""

from __future__ import annotations

import functools
import logging
import time

from aiohttp import web

from switchboard import tracing
from switchboard.channels import registry
from switchboard.channels.base import Channel, HttpAnswer, Inbound, RawRequest
from switchboard.errors import MalformedBodyError, QueueUnavailableError, RequestError, SignatureError, excerpt
from switchboard.web.appkeys import CHANNELS, METRICS, ROUTER, SETTINGS
from switchboard.web.server import DIRECT_ROUTES, FixedResponse

__all__ = [
    "add_routes",
    "error_response",
    "handle_traced_webhook",
    "handle_webhook",
    "serve_traced_webhook",
    "serve_webhook",
]

logger = logging.getLogger(__name__)


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON error body that says what went wrong and what to fix."""
    return web.json_response({"ok": False, "error": {"code": code, "message": message}}, status=status, headers=headers)


def _answer(app: web.Application, request: web.BaseRequest, answer: HttpAnswer) -> web.StreamResponse:
    if not app.on_response_prepare:  # the hot path: no header map
        fixed = FixedResponse.of(request, answer.status, answer.body, answer.content_type)
        if fixed is not None:
            return fixed
    if answer.content_type is None:
        response = web.Response(status=answer.status, body=answer.body or None)
        response.headers.pop("Content-Type", None)
        return response
    return web.Response(status=answer.status, body=answer.body, content_type=answer.content_type)


_METHODS = web.AppKey("webhook_methods", dict[str, frozenset[str]])
"""Channel → the HTTP methods its webhook route takes (looked up in the channel table once per channel)."""


def _methods(app: web.Application, channel: str) -> frozenset[str]:
    known = app[_METHODS]
    methods = known.get(channel)
    if methods is None:
        factory = registry.factory(channel)
        methods = known[channel] = factory.webhook_methods if factory is not None else frozenset()
    return methods


async def _read_body(request: web.BaseRequest, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    content = request.content
    if content.is_eof():  # the whole body has arrived (as it has for almost every webhook): take it as it is
        body = content.read_nowait()
        if len(body) > limit:  # a chunked body has no Content-Length to refuse it by
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body))
        return body
    return await request.read()


def _route_of(request: web.Request) -> tuple[str, str]:
    """The channel and account a request routed by aiohttp's dispatcher names."""
    match = request.match_info
    return match.get("channel") or request.path[_PREFIX_LEN:], match.get("account", "default")


async def handle_webhook(request: web.Request) -> web.StreamResponse:
    """Serve ``/webhooks/{channel}`` and ``/webhooks/{channel}/{account}``."""
    return await serve_webhook(request.app, request, *_route_of(request))


async def serve_webhook(
    app: web.Application, request: web.BaseRequest, channel: str, account: str
) -> web.StreamResponse:
    """Serve one webhook request for ``channel``/``account`` (a plain route: ``account`` is ``default``)."""
    settings = app[SETTINGS]
    metrics = app[METRICS]
    adapter = app[CHANNELS].get((channel, account))
    methods = _methods(app, channel) if adapter is not None else frozenset[str]()
    if adapter is None or not methods:
        metrics.rejected(channel, "unknown_channel")
        return error_response(
            404,
            "unknown_channel",
            f"no enabled channel account {excerpt(channel)}/{excerpt(account)}: set the channel's credentials "
            "(SWITCHBOARD_<CHANNEL>__...) and restart; `switchboard check` lists what is enabled",
        )
    if request.method not in methods:
        metrics.rejected(channel, "method_not_allowed")
        allowed = ", ".join(sorted(methods))
        return error_response(405, "method_not_allowed", f"/webhooks/{channel} accepts {allowed}", {"Allow": allowed})
    try:
        body = await _read_body(request, settings.queue.max_body_bytes)
    except web.HTTPRequestEntityTooLarge:
        metrics.rejected(channel, "too_large")
        return error_response(413, "body_too_large", f"body over {settings.queue.max_body_bytes} bytes")
    raw = RawRequest(request.method, request.path, request.headers, request.query, body, account)
    try:
        inbound = await _verify_and_receive(adapter, raw)
    except RequestError as err:
        metrics.rejected(channel, err.code)
        return error_response(err.status, err.code, str(err))
    except QueueUnavailableError:
        metrics.rejected(channel, "verify_unavailable")
        return error_response(503, "verify_unavailable", "could not verify the request now; retry")
    try:
        answer = await app[ROUTER].accept(adapter, inbound)
    except QueueUnavailableError:
        return error_response(
            503, "queue_unavailable", "the queue did not confirm in time; retry", dict(QueueUnavailableError.HEADERS)
        )
    except RequestError as err:  # a message that cannot be stored as text: 400, as a malformed body
        return error_response(err.status, err.code, str(err))
    return _answer(app, request, answer)


async def _verify_and_receive(adapter: Channel, raw: RawRequest) -> Inbound:
    """``adapter.verify`` then ``adapter.receive``, in one coroutine (a layer less per request on the hot path)."""
    try:
        await adapter.verify(raw)
    except RequestError:
        raise
    except (OSError, TimeoutError) as exc:  # fetching the platform's keys failed: the platform retries a 503
        logger.warning("%s could not verify a request: %s", adapter.name, type(exc).__name__)
        raise QueueUnavailableError("could not verify the request now; retry") from exc
    except Exception as exc:  # what cannot be verified is not authentic: never a 500
        logger.warning("%s could not verify a request: %s", adapter.name, type(exc).__name__)
        raise SignatureError(f"could not verify the {adapter.name} request", channel=adapter.name) from exc
    try:
        return await adapter.receive(raw)
    except RequestError:
        raise
    except Exception as exc:  # an adapter bug on odd input must still be a 400, never a 500
        logger.warning("%s could not read a request: %s", adapter.name, type(exc).__name__)
        raise MalformedBodyError(f"could not read the {adapter.name} payload", channel=adapter.name) from exc


async def handle_traced_webhook(request: web.Request) -> web.StreamResponse:
    """:func:`serve_traced_webhook` for a request routed by aiohttp's dispatcher."""
    return await serve_traced_webhook(request.app, request, *_route_of(request))


async def serve_traced_webhook(
    app: web.Application, request: web.BaseRequest, channel: str, account: str
) -> web.StreamResponse:
    """:func:`serve_webhook` timed as a ``webhook`` span, in the trace of the first message it accepted.

    The message id is assigned by ingest, so the span is recorded once the answer is known, with the request's
    start time: it joins the trace of the first message the request accepted (a platform's retry of a message
    accepted before, that of the original), and is a trace of its own when nothing was accepted (a refused request,
    a handshake). Installed instead of :func:`handle_webhook` only while spans are recorded.
    """
    started = time.time_ns()
    status = 500
    ids: list[str] = []
    try:
        with tracing.collecting_ingested() as ids:
            response = await serve_webhook(app, request, channel, account)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        known = (channel, account) in app[CHANNELS]  # never a name an outsider made up
        tracing.span_at(
            "webhook",
            start_ns=started,
            trace_key=ids[0] if ids else None,
            links=[tracing.link_to(other) for other in ids[1:]],
            http__request__method=request.method,
            http__route="/webhooks/{channel}",
            http__response__status_code=status,
            switchboard__channel=channel if known else "unknown",
            switchboard__account=account if known else None,
            switchboard__messages=len(ids),
            switchboard__message_id=ids[0] if ids else None,
        )


_PREFIX = "/webhooks/"
_PREFIX_LEN = len(_PREFIX)


def add_routes(app: web.Application) -> None:
    """Register the webhook routes (docs/ARCHITECTURE.md §10).

    Every channel of the channel table also gets a plain route ``/webhooks/<name>``: aiohttp finds a plain route by
    one dictionary lookup, a ``{channel}`` route by a regular expression after it (a measurable part of a webhook's
    CPU). Both serve the same handler; other names fall through to the ``{channel}`` route (404). While spans are
    recorded (:func:`switchboard.tracing.recording`, decided before the app is built) the handler is
    :func:`handle_traced_webhook`. ``POST`` to a plain route skips the dispatcher too (``DIRECT_ROUTES``, see
    :mod:`switchboard.web.server`), which the webhook's answer, a :class:`~switchboard.web.server.FixedResponse`, pairs
    with.
    """
    app[_METHODS] = {}
    traced = tracing.recording()  # no timing cost when not exported
    handler = handle_traced_webhook if traced else handle_webhook
    serve = serve_traced_webhook if traced else serve_webhook
    direct = app.setdefault(DIRECT_ROUTES, {})
    for name in registry.CHANNEL_MODULES:
        app.router.add_route("*", _PREFIX + name, handler)
        direct[_PREFIX + name] = functools.partial(serve, channel=name, account="default")  # no coroutine layer
    for path in (_PREFIX + "{channel}", _PREFIX + "{channel}/{account}"):
        app.router.add_route("*", path, handler)
