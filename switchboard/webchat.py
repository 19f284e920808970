"""The web chat's HTTP surface: the page at ``/`` and its public API (DESIGN §10).

========================================== ============================================================
``POST /api/chat/sessions``                 ``201 {"session", "token"}`` (body: none, ``{}`` or ``{"agent"}``)
``POST /api/chat/messages`` (bearer)        ``202 {"message_id"}`` once durably queued
``GET /api/chat/stream`` (bearer/``?token``) SSE: replay of the retained history, then live events
========================================== ============================================================

Tokens are random (``secrets.token_urlsafe(32)``) and stored only as their SHA-256, mapped to the session key,
with a 30-day TTL refreshed on use. Looking a token up by its hash leaks nothing through timing.

A token → session mapping never changes once issued, so each process keeps what it looked up for
:data:`TOKEN_CACHE_S` (saving a Redis round trip per chat message); a token whose key is deleted or expires in
Redis is therefore refused at most that long afterwards. A wrong token is never cached: it costs a lookup
each time, as before.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import time
import uuid
from pathlib import Path
from typing import Any, Final

from aiohttp import web
from redis.exceptions import RedisError

from switchboard.appkeys import CHANNELS, INGESTOR, METRICS, REDIS, SETTINGS
from switchboard.channels.base import RawRequest
from switchboard.channels.web import WebChannel
from switchboard.errors import QueueUnavailableError, RequestError
from switchboard.queue import webstream
from switchboard.queue.keys import GlobalKeys
from switchboard.settings import Settings
from switchboard.types import SessionKey

__all__ = ["KEEPALIVE_S", "STATIC_DIR", "TOKEN_CACHE_S", "TOKEN_TTL_S", "add_routes", "hash_token"]

logger = logging.getLogger(__name__)

TOKEN_TTL_S: Final = 30 * 24 * 3600
"""A web chat token lives this long after its last use."""
TOKEN_CACHE_S: Final = 5.0
"""How long a process trusts a token it has looked up (the bound on refusing a deleted or expired one)."""
_TOKEN_CACHE_MAX: Final = 10_000
KEEPALIVE_S: Final = 15.0
"""An idle SSE connection gets a comment this often, so proxies keep it open and a gone client is noticed."""
STATIC_DIR: Final = Path(__file__).parent / "channels" / "static"
_STATIC_FILES: Final = {
    "chat.js": "text/javascript",
    "chat.css": "text/css",
    "index.html": "text/html",
}
_SESSION_BODY_LIMIT: Final = 4096
_SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}
_CORS_HEADERS: Final = {
    # Bearer tokens, never cookies: another site embedding the chat gains nothing it was not given.
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, Last-Event-ID",
    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
    "Access-Control-Max-Age": "600",
}
_SHUTDOWN: Final = web.AppKey("webchat_shutdown", asyncio.Event)
_ACCEPTED_PREFIX: Final = b'{"message_id":"'
_ECHO_JSON: Final = json.JSONEncoder(ensure_ascii=False).encode


class _TokenCache:
    """Token hash → session for tokens this process found in Redis, each trusted for ``ttl_s`` (bounded size)."""

    def __init__(self, ttl_s: float, max_entries: int) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: dict[str, tuple[SessionKey, float]] = {}

    def get(self, token_hash: str) -> SessionKey | None:
        entry = self._entries.get(token_hash)
        if entry is None:
            return None
        if entry[1] <= time.monotonic():
            del self._entries[token_hash]
            return None
        return entry[0]

    def put(self, token_hash: str, session: SessionKey) -> None:
        if len(self._entries) >= self.max_entries:
            del self._entries[next(iter(self._entries))]  # the oldest insertion
        self._entries[token_hash] = (session, time.monotonic() + self.ttl_s)


_TOKENS: Final = web.AppKey("webchat_tokens", _TokenCache)


def hash_token(token: str) -> str:
    """The hex SHA-256 under which a token is stored (the token itself is never stored)."""
    return hashlib.sha256(token.encode()).hexdigest()


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"ok": False, "error": {"code": code, "message": message}}
    return web.json_response(body, status=status, headers={**_CORS_HEADERS, **(headers or {})})


def _unauthorized(message: str) -> web.Response:
    return _error(401, "unauthorized", message, {"WWW-Authenticate": 'Bearer realm="switchboard"'})


def _unavailable() -> web.Response:
    return _error(503, "queue_unavailable", "the queue did not confirm in time; retry")


def _reject(app: web.Application, reason: str) -> None:
    metrics = app.get(METRICS)
    if metrics is not None:
        metrics.rejected("web", reason)


def _web_channel(app: web.Application) -> WebChannel:
    adapter = app.get(CHANNELS, {}).get(("web", "default"))
    if isinstance(adapter, WebChannel):
        return adapter
    cfg = app[SETTINGS].file
    options = cfg.channels.get("web")
    return WebChannel(
        None,
        agent=(options.agent if options else None) or cfg.default_agent,
        tenant=(options.tenant if options else None) or cfg.tenant,
    )


async def _read_capped(request: web.Request, limit: int) -> bytes | None:
    """The body, or ``None`` when it is over ``limit`` bytes (checked before anything is parsed)."""
    length = request.content_length
    if length is not None:
        if length > limit:
            return None
        try:
            return await request.read()  # exactly ``length`` bytes: the HTTP parser stops there
        except web.HTTPRequestEntityTooLarge:
            return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _bearer(request: web.Request, *, allow_query: bool) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    if allow_query:
        return request.query.get("token") or None
    return None


async def _session_for(request: web.Request, *, allow_query: bool) -> SessionKey | None:
    """The session the request's token maps to (refreshing its TTL), or ``None`` for a wrong or missing token.

    Raises:
        QueueUnavailableError: Redis did not answer in time.
    """
    token = _bearer(request, allow_query=allow_query)
    if not token or len(token) > 512:
        return None
    token_hash = hash_token(token)
    cache = request.app[_TOKENS]
    cached = cache.get(token_hash)
    if cached is not None:
        return cached
    try:
        async with asyncio.timeout(request.app[SETTINGS].queue.ingest_timeout_s):
            value = await request.app[REDIS].getex(GlobalKeys().web_token(token_hash), ex=TOKEN_TTL_S)
    except (TimeoutError, RedisError, OSError) as exc:
        raise QueueUnavailableError("token lookup failed") from exc
    if value is None:
        return None
    session = SessionKey(value.decode() if isinstance(value, bytes) else str(value))
    cache.put(token_hash, session)
    return session


async def create_session(request: web.Request) -> web.Response:
    """``POST /api/chat/sessions``: a new conversation and the bearer token that opens it."""
    app = request.app
    settings: Settings = app[SETTINGS]
    body = await _read_capped(request, _SESSION_BODY_LIMIT)
    if body is None:
        return _error(413, "body_too_large", f"body over {_SESSION_BODY_LIMIT} bytes")
    agent_name: str | None = None
    if body.strip():
        try:
            raw: Any = json.loads(body)
        except ValueError:
            return _error(400, "malformed_body", 'body must be empty, {} or {"agent": "<name>"}')
        if not isinstance(raw, dict):
            return _error(400, "malformed_body", 'body must be empty, {} or {"agent": "<name>"}')
        agent_name = raw.get("agent")
        if agent_name is not None and not isinstance(agent_name, str):
            return _error(400, "malformed_body", '"agent" must be a string')
    if agent_name is not None and agent_name not in settings.file.agents:
        known = ", ".join(sorted(settings.file.agents)) or "none"
        return _error(400, "unknown_agent", f"unknown agent {agent_name!r}; agents: {known}")
    conversation = _web_channel(app).conversation(uuid.uuid4().hex, agent=agent_name)
    token = secrets.token_urlsafe(32)
    try:
        async with asyncio.timeout(settings.queue.ingest_timeout_s):
            stored = await app[REDIS].set(
                GlobalKeys().web_token(hash_token(token)), conversation.session_key, ex=TOKEN_TTL_S, nx=True
            )
    except (TimeoutError, RedisError, OSError):
        return _unavailable()
    if not stored:  # 256 random bits collided: not in this universe, but never hand out someone else's session
        return _error(500, "token_collision", "could not create a session; retry")
    logger.debug("web chat session created for agent %s", conversation.agent)
    return web.json_response(
        {"session": conversation.conversation, "token": token}, status=201, headers=dict(_CORS_HEADERS)
    )


async def post_message(request: web.Request) -> web.Response:
    """``POST /api/chat/messages``: queue one user message; ``202`` only once Redis holds it."""
    app = request.app
    settings: Settings = app[SETTINGS]
    limit = settings.queue.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        _reject(app, "too_large")
        return _error(413, "body_too_large", f"body over {limit} bytes")
    try:
        session = await _session_for(request, allow_query=False)
    except QueueUnavailableError:
        _reject(app, "queue_unavailable")
        return _unavailable()
    if session is None:
        _reject(app, "unauthorized")
        return _unauthorized("missing or wrong bearer token: create a session with POST /api/chat/sessions")
    body = await _read_capped(request, limit)
    if body is None:
        _reject(app, "too_large")
        return _error(413, "body_too_large", f"body over {limit} bytes")
    channel = _web_channel(app)
    raw = RawRequest(request.method, request.path, request.headers, {"session": session}, body)
    try:
        (draft,) = channel.parse(raw)
    except RequestError as err:
        _reject(app, err.code)
        return _error(err.status, err.code, str(err))
    # The echo names the message by its dedup key; readers of the web stream map that to the gateway id.
    echo = {"type": "user", "data": _ECHO_JSON({"text": draft.text, "client_id": draft.dedup_key})}
    agent = settings.file.agents.get(draft.conversation.agent)
    options = settings.file.channels.get("web")
    busy = (options.busy_policy if options else None) or (agent.busy_policy if agent else "sequential")
    try:
        result = await app[INGESTOR].ingest(draft, busy_policy=busy, echo=echo)
    except QueueUnavailableError:
        _reject(app, "queue_unavailable")
        return _unavailable()
    metrics = app.get(METRICS)
    if metrics is not None:
        metrics.ingested("web", duplicate=result.duplicate)
    # the id is hex: the body needs no JSON encoder
    body = _ACCEPTED_PREFIX + result.message_id.encode() + b'"}'
    return web.Response(body=body, status=202, content_type="application/json", headers=_CORS_HEADERS)


def _frame(event: webstream.WebEvent) -> bytes:
    data = json.dumps(event.data, ensure_ascii=False, separators=(",", ":"))
    lines = [f"id: {event.id}", f"event: {event.type}", *(f"data: {line}" for line in data.split("\n"))]
    return ("\n".join(lines) + "\n\n").encode()


async def stream(request: web.Request) -> web.StreamResponse:
    """``GET /api/chat/stream``: SSE of the session's web stream, resumable with ``Last-Event-ID``."""
    try:
        session = await _session_for(request, allow_query=True)
    except QueueUnavailableError:
        return _unavailable()
    if session is None:
        return _unauthorized("missing or wrong token: pass Authorization: Bearer <token> or ?token=<token>")
    last = request.headers.get("Last-Event-ID")
    try:
        after = webstream.parse_event_id(last) if last is not None else None
    except ValueError as err:
        return _error(400, "bad_last_event_id", str(err))
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            **_CORS_HEADERS,
        }
    )
    await response.prepare(request)
    try:
        await response.write(b"retry: 2000\n\n")
        await _pump(request, response, session, after)
    except ConnectionResetError:
        logger.debug("web chat stream closed by the client")
    except (TimeoutError, RedisError, OSError) as exc:
        logger.warning("web chat stream ended: Redis failed (%s)", type(exc).__name__)
    return response


async def _pump(request: web.Request, response: web.StreamResponse, session: SessionKey, after: str | None) -> None:
    """Replay what is retained after ``after``, then follow the stream until the client or the app goes away."""
    redis = request.app[REDIS]
    shutdown = request.app[_SHUTDOWN]
    while True:  # replay, page by page
        batch = await webstream.replay(redis, session, after)
        if not batch:
            break
        await response.write(b"".join(_frame(e) for e in batch))
        after = batch[-1].id
    loop = asyncio.get_running_loop()
    block_ms = _block_ms(redis)
    last_write = loop.time()
    stop = asyncio.ensure_future(shutdown.wait())
    reading: asyncio.Future[list[webstream.WebEvent]] | None = None
    try:
        while not shutdown.is_set():
            if request.transport is None or request.transport.is_closing():
                return
            reading = asyncio.ensure_future(webstream.read(redis, session, after, block_ms))
            await asyncio.wait({reading, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not reading.done():
                return
            batch = reading.result()
            if batch:
                await response.write(b"".join(_frame(e) for e in batch))
                after = batch[-1].id
                last_write = loop.time()
            elif loop.time() - last_write >= KEEPALIVE_S:
                await response.write(b": ping\n\n")
                last_write = loop.time()
    finally:
        stop.cancel()
        if reading is not None and not reading.done():
            # Not awaited: redis-py may let a blocked read run out its block time before the task ends, and
            # this response must not wait for it. The callback retrieves whatever it ends with.
            reading.cancel()
            reading.add_done_callback(_discard)


def _discard(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.debug("an abandoned web stream read ended with %s", type(future.exception()).__name__)


def _block_ms(redis: Any) -> int:
    """How long one XREAD may block: up to the keep-alive interval, and safely inside the client's socket timeout."""
    block_s = KEEPALIVE_S
    timeout = redis.connection_pool.connection_kwargs.get("socket_timeout")
    if isinstance(timeout, int | float) and timeout > 0:
        block_s = min(block_s, max(timeout - 1.0, timeout / 2))
    return max(int(block_s * 1000), 50)


async def preflight(request: web.Request) -> web.Response:
    """CORS preflight for the chat API (sites embedding the chat call it cross-origin)."""
    return web.Response(status=204, headers=dict(_CORS_HEADERS))


async def page(request: web.Request) -> web.FileResponse:
    """``GET /``: the chat page."""
    return web.FileResponse(STATIC_DIR / "index.html", headers={**_SECURITY_HEADERS, "Cache-Control": "no-cache"})


async def static(request: web.Request) -> web.FileResponse:
    """``GET /static/{name}``: the page's script and style sheet (a fixed list, nothing else on disk)."""
    name = request.match_info["name"]
    content_type = _STATIC_FILES.get(name)
    if content_type is None:
        raise web.HTTPNotFound()
    return web.FileResponse(
        STATIC_DIR / name,
        headers={**_SECURITY_HEADERS, "Content-Type": f"{content_type}; charset=utf-8", "Cache-Control": "no-cache"},
    )


async def _on_shutdown(app: web.Application) -> None:
    app[_SHUTDOWN].set()


def add_routes(app: web.Application) -> None:
    """Register the page, its assets and the chat API on ``app`` (which must carry SETTINGS, REDIS, INGESTOR)."""
    app[_SHUTDOWN] = asyncio.Event()
    app[_TOKENS] = _TokenCache(TOKEN_CACHE_S, _TOKEN_CACHE_MAX)
    app.on_shutdown.append(_on_shutdown)
    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", static)
    app.router.add_post("/api/chat/sessions", create_session)
    app.router.add_post("/api/chat/messages", post_message)
    app.router.add_get("/api/chat/stream", stream)
    for path in ("/api/chat/sessions", "/api/chat/messages", "/api/chat/stream"):
        app.router.add_route("OPTIONS", path, preflight)
