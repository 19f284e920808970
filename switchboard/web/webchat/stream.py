"""The web chat's event stream: ``GET /api/chat/stream`` (SSE) and ``POST /api/chat/stream-ticket``.

A browser's ``EventSource`` cannot send headers, so the page opens the stream with a single-use, short-lived
**stream ticket** and the long-lived token never appears in a URL; tickets per session are capped, so unused ones
cannot pile up. An open stream holds no Redis connection (one :class:`~switchboard.web.webchat.fanout.StreamFanout` per
process reads for all), and open streams are capped per session and per client address across processes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Final, NamedTuple
from urllib.parse import parse_qs

import redis.asyncio as aioredis
from aiohttp import web
from redis.exceptions import RedisError

from switchboard.outbound import webstream
from switchboard.queue.keys import GlobalKeys
from switchboard.queue.limits import issue_stream_ticket, new_stream_ticket, stream_ticket_key
from switchboard.queue.streamslots import Slot, StreamSlots
from switchboard.settings import Settings
from switchboard.types import SessionKey
from switchboard.web.appkeys import REDIS, SETTINGS
from switchboard.web.clientaddr import client_address
from switchboard.web.webchat import access
from switchboard.web.webchat.fanout import StreamFanout, Subscription, SubscriptionClosedError

__all__ = [
    "KEEPALIVE_S",
    "RETRY_AFTER_S",
    "REVOCATION_CHECK_S",
    "TICKETS_PER_TTL",
    "TICKET_TTL_S",
    "add_stream_routes",
    "stream",
    "stream_ticket",
    "token_revoked",
]

logger = logging.getLogger(__name__)

KEEPALIVE_S: Final = 15.0
"""An idle SSE connection gets a comment this often, so proxies keep it open and a gone client is noticed."""
TICKET_TTL_S: Final = 30
"""A stream ticket opens a stream within this many seconds of being issued, or never."""
TICKETS_PER_TTL: Final = 10
"""Stream tickets a session may be issued in any :data:`TICKET_TTL_S` (a page needs one per stream it opens)."""
RETRY_AFTER_S: Final = 10
"""``Retry-After`` when a stream cap is reached (a stream frees its slot as soon as it closes)."""
REVOCATION_CHECK_S: Final = access.TOKEN_CACHE_S
"""How often open streams' tokens are checked: a token revoked through another process ends its streams here within
this (through this process: at once)."""
_FANOUT: Final = web.AppKey("webchat_fanout", StreamFanout)
_SLOTS: Final = web.AppKey("webchat_stream_slots", StreamSlots)
_SSE_HEADERS: Final = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
_warned_at = 0.0


def _warn(message: str) -> None:
    """Log a Redis failure of a stream at most once per 10 s (a failure hits every open stream at once)."""
    global _warned_at
    now = time.monotonic()
    if now - _warned_at >= 10.0:
        _warned_at = now
        logger.warning(message)


async def _token_session(request: web.Request, token_hash: str) -> SessionKey | None:
    """The session of a token (by its hash), looked up on the streams' client; the web tier's token cache is shared.

    Raises:
        RedisError: Redis failed (``TimeoutError`` / ``OSError`` likewise).
    """
    cache = request.app[access.TOKENS]
    cached = cache.get(token_hash)
    if cached is not None:
        return cached
    value = await request.app[_FANOUT].redis.getex(GlobalKeys().web_token(token_hash), ex=access.TOKEN_TTL_S)
    if value is None:
        return None
    session = SessionKey(value.decode() if isinstance(value, bytes) else str(value))
    cache.put(token_hash, session)
    return session


def _token_hash(token: str | None) -> str | None:
    return access.hash_token(token) if token and len(token) <= 512 else None


async def _ticket_token(request: web.Request, ticket: str) -> str | None:
    """The hash of the token a ticket was issued to, taking the ticket (it works once).

    Raises:
        RedisError: Redis failed (``TimeoutError`` / ``OSError`` likewise).
    """
    if not ticket or len(ticket) > 512:
        return None
    key = stream_ticket_key(ticket, access.hash_token(ticket))
    if key is None:  # names no shard (made up, cut, or changed): refused as any unknown ticket, with no lookup
        return None
    value = await request.app[_FANOUT].redis.getdel(key)
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


async def stream_ticket(request: web.Request) -> web.Response:
    """``POST /api/chat/stream-ticket``: a single-use ticket opening the bearer's stream within ``TICKET_TTL_S``."""
    settings: Settings = request.app[SETTINGS]
    try:
        async with asyncio.timeout(settings.queue.ingest_timeout_s):
            token_hash = _token_hash(access.bearer(request, allow_query=False))
            session = None if token_hash is None else await _token_session(request, token_hash)
            if token_hash is None or session is None:
                return access.unauthorized(
                    "missing or wrong bearer token: create a session with POST /api/chat/sessions"
                )
            ticket = new_stream_ticket(session)
            # The ticket names the token, not the session: a token revoked meanwhile opens nothing with it.
            wait_ms = await issue_stream_ticket(
                request.app[_FANOUT].redis,
                session,
                access.hash_token(ticket),
                token_hash,
                ttl_s=TICKET_TTL_S,
                per_ttl=TICKETS_PER_TTL,
            )
    except (TimeoutError, RedisError, OSError):
        return access.unavailable()
    if wait_ms:  # nothing was stored
        return access.too_many(wait_ms, f"at most {TICKETS_PER_TTL} stream tickets per {TICKET_TTL_S} s")
    return web.json_response(
        {"ticket": ticket, "expires_in": TICKET_TTL_S}, headers={**access.CORS_HEADERS, "Cache-Control": "no-store"}
    )


class _Admitted(NamedTuple):
    session: SessionKey
    token_hash: str
    after: str | None
    slot: Slot


async def _admit(request: web.Request) -> _Admitted | web.Response:
    """Check the stream's credential, ``Last-Event-ID`` and caps (taking a slot), or the response refusing it."""
    app = request.app
    settings: Settings = app[SETTINGS]
    # Parsed here and dropped, not cached on the request: thousands of streams keep their requests for hours.
    query = parse_qs(request.query_string, keep_blank_values=True)
    last = request.headers.get("Last-Event-ID", _first(query, "last_event_id"))
    try:
        after = webstream.parse_event_id(last) if last is not None else None
    except ValueError as err:
        return access.error(400, "bad_last_event_id", str(err))
    ticket = _first(query, "ticket")
    try:
        async with asyncio.timeout(settings.queue.ingest_timeout_s):
            if ticket is not None:
                token_hash = await _ticket_token(request, ticket)
            else:
                token_hash = _token_hash(access.bearer(request, allow_query=False) or _first(query, "token"))
            session = await _token_session(request, token_hash) if token_hash is not None else None
            if token_hash is None or session is None:
                return access.unauthorized(
                    "missing, wrong or used credential: pass ?ticket=<ticket from POST /api/chat/stream-ticket>, "
                    "Authorization: Bearer <token> or ?token=<token>"
                )
            limits = settings.limits
            slot = await app[_SLOTS].acquire(
                session,
                client_address(request, settings.trusted_proxies),
                per_session=limits.streams_per_session,
                per_address=limits.streams_per_address,
            )
    except (TimeoutError, RedisError, OSError) as exc:
        _warn(f"web chat stream refused: Redis failed ({type(exc).__name__})")
        return access.unavailable()
    if isinstance(slot, str):
        cap = limits.streams_per_session if slot == "session" else limits.streams_per_address
        return access.error(
            429,
            "too_many_streams",
            f"at most {cap} open streams per {slot}; close one or retry later",
            {"Retry-After": str(RETRY_AFTER_S)},
        )
    return _Admitted(session, token_hash, after, slot)


def _first(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


async def stream(request: web.Request) -> web.StreamResponse:
    """``GET /api/chat/stream``: SSE of the session's web stream, resumable with ``Last-Event-ID``.

    ``Last-Event-ID`` (header, or ``?last_event_id=`` for a page opening a fresh ``EventSource``) must be a Redis
    stream id: anything else is ``400``. Replays what is retained after it, then follows the process's fan-out until
    the client or the app goes away.
    """
    admitted = await _admit(request)
    if isinstance(admitted, web.Response):
        return admitted
    # CORS headers only where a browser reads them (a cross-origin request names its Origin); each open stream
    # keeps its headers for as long as it lives.
    cors = access.CORS_HEADERS if "Origin" in request.headers else {}
    response = web.StreamResponse(headers={**_SSE_HEADERS, **cors})
    fanout = request.app[_FANOUT]
    subscription: Subscription | None = None
    try:
        await response.prepare(request)
        await response.write(b"retry: 2000\n\n")
        last = await _replay(fanout.redis, response, admitted.session, admitted.after)
        transport = request.transport
        subscription, behind = fanout.subscribe(
            admitted.session, last, transport.is_closing if transport is not None else None, tag=admitted.token_hash
        )
        # A revocation that landed between admission and subscribing closed nothing: look once more, now that a
        # later one will find this subscription.
        if not await fanout.redis.exists(GlobalKeys().web_token(admitted.token_hash)):
            request.app[access.TOKENS].drop(admitted.token_hash)
            return response
        if behind:  # what the reader took before this stream subscribed
            last = await _replay(fanout.redis, response, admitted.session, last)
        loop = asyncio.get_running_loop()
        last_write = loop.time()
        while True:
            batch = await subscription.next(max(0.0, last_write + KEEPALIVE_S - loop.time()))
            fresh = batch if last is None else [e for e in batch if _id_key(e.id) > _id_key(last)]
            if fresh:
                await response.write(b"".join(_frame(e) for e in fresh))
                last = fresh[-1].id
                last_write = loop.time()
            elif loop.time() - last_write >= KEEPALIVE_S:
                await response.write(b": ping\n\n")
                last_write = loop.time()
    except SubscriptionClosedError:
        pass  # the client went away, fell too far behind, or the app is stopping
    except ConnectionResetError:
        logger.debug("web chat stream closed by the client")
    except (TimeoutError, RedisError, OSError) as exc:
        _warn(f"web chat stream ended: Redis failed ({type(exc).__name__})")
    finally:
        if subscription is not None:
            fanout.unsubscribe(subscription)
        await request.app[_SLOTS].release(admitted.slot)
    return response


def _frame(event: webstream.WebEvent) -> bytes:
    data = json.dumps(event.data, ensure_ascii=False, separators=(",", ":"))
    lines = [f"id: {event.id}", f"event: {event.type}", *(f"data: {line}" for line in data.split("\n"))]
    return ("\n".join(lines) + "\n\n").encode()


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


async def _replay(
    redis: aioredis.Redis, response: web.StreamResponse, session: SessionKey, after: str | None
) -> str | None:
    """Write every retained event after ``after``; returns the last id written (``after`` when none)."""
    while True:
        batch = await webstream.replay(redis, session, after)
        if not batch:
            return after
        await response.write(b"".join(_frame(e) for e in batch))
        after = batch[-1].id


def token_revoked(app: web.Application, token_hash: str) -> None:
    """End this process's streams opened with a token that was just revoked.

    Other processes end theirs within :data:`REVOCATION_CHECK_S`.
    """
    fanout = app.get(_FANOUT)
    if fanout is not None:
        fanout.close_tagged({token_hash}, "revoked")


async def _check_revocations(app: web.Application) -> None:
    """Every :data:`REVOCATION_CHECK_S`, end the streams whose token no longer exists (revoked by any process)."""
    fanout = app[_FANOUT]
    while True:
        await asyncio.sleep(REVOCATION_CHECK_S)
        tags = sorted(fanout.tags())
        try:
            for start in range(0, len(tags), 500):
                chunk = tags[start : start + 500]
                found = await fanout.redis.mget([GlobalKeys().web_token(t) for t in chunk])
                gone = {t for t, value in zip(chunk, found, strict=True) if value is None}
                if gone:
                    for token_hash in gone:
                        app[access.TOKENS].drop(token_hash)
                    fanout.close_tagged(gone, "revoked")
        except (TimeoutError, RedisError, OSError) as exc:
            _warn(f"could not check open streams' tokens: Redis failed ({type(exc).__name__})")


async def preflight(request: web.Request) -> web.Response:
    """CORS preflight for the stream routes."""
    return web.Response(status=204, headers=dict(access.CORS_HEADERS))


async def _on_shutdown(app: web.Application) -> None:
    app[_FANOUT].shutdown()


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    fanout = StreamFanout(app[REDIS])  # its own connections, to the same server with the same options
    fanout.start()
    slots = StreamSlots(fanout.redis)
    slots.start()
    app[_FANOUT] = fanout
    app[_SLOTS] = slots
    checker = asyncio.create_task(_check_revocations(app))
    yield
    checker.cancel()
    await asyncio.gather(checker, return_exceptions=True)
    await slots.aclose()
    await fanout.aclose()


def add_stream_routes(app: web.Application) -> None:
    """Register the stream and ticket routes, and the fan-out's lifecycle, on ``app``.

    ``app`` carries SETTINGS, and REDIS by the time it starts (a cleanup context registered earlier may set it).
    """
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_on_shutdown)
    app.router.add_post("/api/chat/stream-ticket", stream_ticket)
    app.router.add_get("/api/chat/stream", stream)
    for path in ("/api/chat/stream-ticket", "/api/chat/stream"):
        app.router.add_route("OPTIONS", path, preflight)
