"""The web chat's HTTP surface: the page at ``/`` and its public API (``docs/channels/web-chat.md``).

Tokens are random and stored only as their SHA-256 (a lookup by hash leaks nothing through timing), with a 30-day TTL
refreshed on use. A token's session never changes, so each process caches the lookup for :data:`TOKEN_CACHE_S`: a
token deleted in Redis is refused at most that long afterwards (at once through this process); a wrong token is
never cached.
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

from switchboard.channels.web.adapter import WebChannel, parse_post, split_session_key
from switchboard.core.events import DropReason
from switchboard.core.messages import Attachment, ChoiceSelected, ConversationRef, InboundMessage, Posted
from switchboard.errors import MalformedBodyError, QueueUnavailableError, RequestError, excerpt
from switchboard.queue.keys import GlobalKeys
from switchboard.queue.limits import count_session, retry_after_s
from switchboard.queue.router import Route
from switchboard.queue.uploads import UploadStore
from switchboard.settings import Settings
from switchboard.types import SessionKey
from switchboard.web.appkeys import CHANNELS, METRICS, REDIS, ROUTER, SETTINGS
from switchboard.web.clientaddr import client_address

__all__ = ["STATIC_DIR", "TOKEN_CACHE_S", "TOKEN_TTL_S", "add_routes", "hash_token"]

logger = logging.getLogger(__name__)

TOKEN_TTL_S: Final = 30 * 24 * 3600
"""A web chat token lives this long after its last use."""
TOKEN_CACHE_S: Final = 5.0
"""How long a process trusts a token it has looked up (the bound on refusing a deleted or expired one)."""
_TOKEN_CACHE_MAX: Final = 10_000
_TOKEN_MAX_CHARS: Final = 512
_NO_STORE: Final = {"Cache-Control": "no-store"}
STATIC_DIR: Final = Path(__file__).parent / "static"
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
    "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
    "Access-Control-Max-Age": "600",
}
_ACCEPTED_PREFIX: Final = b'{"message_id":"'
_LIMITED: Final[dict[DropReason, str]] = {
    "inbox_full": "too many messages are waiting in this session",
    "session_rate": "too many messages in this session",
    "sender_rate": "too many messages from this sender",
}
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

    def drop(self, token_hash: str) -> None:
        """Forget a token at once (it was revoked through this process)."""
        self._entries.pop(token_hash, None)

    def put(self, token_hash: str, session: SessionKey) -> None:
        if len(self._entries) >= self.max_entries:
            del self._entries[next(iter(self._entries))]  # the oldest insertion
        self._entries[token_hash] = (session, time.monotonic() + self.ttl_s)


_TOKENS: Final = web.AppKey("webchat_tokens", _TokenCache)


def hash_token(token: str) -> str:
    """The hex SHA-256 under which a token is stored (the token itself is never stored).

    Total over ``str``: a lone surrogate (a raw non-UTF-8 byte in a header) hashes too, to a token nobody holds.
    """
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"ok": False, "error": {"code": code, "message": message}}
    return web.json_response(body, status=status, headers={**_CORS_HEADERS, **(headers or {})})


def _unauthorized(message: str) -> web.Response:
    return _error(401, "unauthorized", message, {"WWW-Authenticate": 'Bearer realm="switchboard"'})


def _unavailable() -> web.Response:
    return _error(503, "queue_unavailable", "the queue did not confirm in time; retry")


def _too_many(wait_ms: int, message: str) -> web.Response:
    wait_s = retry_after_s(wait_ms)
    return _error(429, "rate_limited", f"{message}; retry in {wait_s} s", {"Retry-After": str(wait_s)})


def _reject(app: web.Application, reason: str) -> None:
    metrics = app.get(METRICS)
    if metrics is not None:
        metrics.rejected("web", reason)


def _web_channel(app: web.Application) -> WebChannel:
    adapter = app.get(CHANNELS, {}).get(("web", "default"))
    return adapter if isinstance(adapter, WebChannel) else WebChannel(None)


def _web_route(app: web.Application) -> Route:
    """Where web chat sessions go by default: the web channel's agent and tenant (the ingest router's route)."""
    return app[ROUTER].routes[("web", "default")]


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
    """The token the request carries; ``None`` when missing or not a token's shape (ours are short ASCII)."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    token: str | None = None
    if scheme.lower() == "bearer" and value.strip():
        token = value.strip()
    elif allow_query:
        token = request.query.get("token") or None
    # A raw non-UTF-8 byte in a header arrives as a lone surrogate that no encoder takes: refuse it here.
    if token is None or len(token) > _TOKEN_MAX_CHARS or not token.isascii():
        return None
    return token


def _allowed_agents(app: web.Application) -> tuple[str, ...]:
    """The agents a new web chat session may name: ``channels.web.agents``, else only the channel's own agent."""
    options = app[SETTINGS].file.channels.get("web")
    if options is not None and options.agents:
        return tuple(options.agents)
    return (_web_route(app).agent,)


async def _session_for(request: web.Request, *, allow_query: bool) -> SessionKey | None:
    """The session the request's token maps to (refreshing its TTL), or ``None`` for a wrong or missing token.

    Raises:
        QueueUnavailableError: Redis did not answer in time.
    """
    token = _bearer(request, allow_query=allow_query)
    if not token:
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
        except (ValueError, RecursionError):  # RecursionError: a nesting bomb like 2,000 ``[``
            return _error(400, "malformed_body", 'body must be empty, {} or {"agent": "<name>"}')
        if not isinstance(raw, dict):
            return _error(400, "malformed_body", 'body must be empty, {} or {"agent": "<name>"}')
        agent_name = raw.get("agent")
        if agent_name is not None and not isinstance(agent_name, str):
            return _error(400, "malformed_body", '"agent" must be a string')
    if agent_name is not None:
        allowed = _allowed_agents(app)
        if agent_name not in allowed or agent_name not in settings.file.agents:
            return _error(
                403,
                "agent_not_allowed",
                f"the web chat may not start agent {excerpt(agent_name)}; allowed: {', '.join(allowed)} "
                "(an operator lists them under channels.web.agents)",
            )
    route = _web_route(app)
    served = settings.file.agents.get(agent_name or route.agent)
    if served is not None and served.status == "draft":  # a draft agent is never served
        logger.warning("web chat refused a session: agent %r is a draft; see `switchboard check`", served.name)
        return _error(409, "agent_not_ready", served.draft_notice())
    address = client_address(request, settings.trusted_proxies)
    try:
        wait_ms = await count_session(app[REDIS], address, settings.limits, timeout_s=settings.queue.ingest_timeout_s)
    except QueueUnavailableError:
        return _unavailable()
    if wait_ms:
        _reject(app, "rate_limited")
        return _too_many(wait_ms, "too many new chat sessions from this address")
    conversation = ConversationRef(
        tenant=route.tenant, agent=agent_name or route.agent, channel="web", conversation=uuid.uuid4().hex
    )
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
        {"session": conversation.conversation, "token": token}, status=201, headers={**_CORS_HEADERS, **_NO_STORE}
    )


async def revoke_session(request: web.Request) -> web.Response:
    """``DELETE /api/chat/sessions`` (bearer): revoke the token; ``204``, and every later use of it is ``401``.

    This process forgets the token at once; another web process may honour it for up to :data:`TOKEN_CACHE_S`
    more. The conversation's retained history is left to expire with the session's idle TTL
    (``SWITCHBOARD_LIMITS__IDLE_SESSION_TTL_S``).
    """
    token = _bearer(request, allow_query=False)
    if not token:
        return _unauthorized("missing or wrong bearer token")
    token_hash = hash_token(token)
    try:
        async with asyncio.timeout(request.app[SETTINGS].queue.ingest_timeout_s):
            deleted = await request.app[REDIS].delete(GlobalKeys().web_token(token_hash))
    except (TimeoutError, RedisError, OSError):
        return _unavailable()
    request.app[_TOKENS].drop(token_hash)
    from switchboard.web.webchat import stream as chatstream  # the streams this token opened end with it

    chatstream.token_revoked(request.app, token_hash)
    if not deleted:
        return _unauthorized("missing or wrong bearer token")
    return web.Response(status=204, headers={**_CORS_HEADERS, **_NO_STORE})


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
    try:
        draft = await _draft(request, session, body)
    except RequestError as err:
        _reject(app, err.code)
        return _error(err.status, err.code, str(err))
    except QueueUnavailableError:
        _reject(app, "queue_unavailable")
        return _unavailable()
    # The echo names the message by its dedup key; readers of the web stream map that to the gateway id.
    shown: dict[str, Any] = {"text": draft.text, "client_id": draft.dedup_key}
    match draft.event:
        case ChoiceSelected():
            shown["choice"] = draft.event.option_id
        case Posted(attachments=attachments) if attachments:
            shown["attachments"] = [
                {"upload": a.ref, "name": a.name, "mime_type": a.mime_type, "size": a.size} for a in attachments
            ]
        case _:
            pass
    echo = {"type": "user", "data": _ECHO_JSON(shown)}
    try:
        result = await app[ROUTER].ingest(draft, echo=echo, idempotent=True)  # counts it in the metrics
    except QueueUnavailableError:
        _reject(app, "queue_unavailable")
        return _unavailable()
    if result is None:  # the web chat's one account is always routed: only a misbuilt app gets here
        return _error(404, "unknown_channel", "the web chat is not enabled in this process")
    if result.limited is not None:  # nothing was written
        return _too_many(result.retry_after_ms, _LIMITED[result.limited])
    if result.reused:  # nothing was written: the page must send the new text under a new client_id
        return _error(409, "client_id_reused", "this client_id was already used for a different text")
    # the id is hex: the body needs no JSON encoder
    body = _ACCEPTED_PREFIX + result.message_id.encode() + b'"}'
    return web.Response(body=body, status=202, content_type="application/json", headers=_CORS_HEADERS)


async def _draft(request: web.Request, session: SessionKey, body: bytes) -> InboundMessage:
    """The message draft of a chat post; upload ids are looked up in the session (an unknown one is refused).

    Raises:
        RequestError: a bad body (400, 413), too many or unknown uploads (400).
        QueueUnavailableError: Redis did not answer the upload lookup in time.
    """
    app = request.app
    channel = _web_channel(app)
    max_count = app[SETTINGS].attachments.max_count
    post = parse_post(body, max_attachments=max_count)
    try:
        conversation = split_session_key(session)
    except ValueError as err:
        raise MalformedBodyError(str(err), channel="web") from None
    if not post.attachments:
        return channel.inbound(conversation, post)
    store = UploadStore(app[REDIS], timeout_s=app[SETTINGS].queue.ingest_timeout_s)
    found = await store.describe(session, post.attachments)
    missing = [upload_id for upload_id, upload in zip(post.attachments, found, strict=True) if upload is None]
    if missing:
        raise MalformedBodyError(
            f"unknown upload {excerpt(missing[0])}: upload files to this session with POST /api/chat/uploads "
            "(uploads are kept for an hour)",
            channel="web",
        )
    attachments = tuple(
        Attachment(kind=upload.kind, ref=upload.id, name=upload.name, mime_type=upload.mime_type, size=upload.size)
        for upload in found
        if upload is not None
    )
    return channel.inbound(conversation, post, attachments)


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


def add_routes(app: web.Application) -> None:
    """Register the page, its assets and the chat API on ``app`` (which must carry SETTINGS, REDIS, ROUTER)."""
    from switchboard.web.webchat import stream as chatstream  # the SSE and upload surfaces import this module
    from switchboard.web.webchat import uploads as chatuploads

    app[_TOKENS] = _TokenCache(TOKEN_CACHE_S, _TOKEN_CACHE_MAX)
    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", static)
    app.router.add_post("/api/chat/sessions", create_session)
    app.router.add_delete("/api/chat/sessions", revoke_session)
    app.router.add_post("/api/chat/messages", post_message)
    chatstream.add_stream_routes(app)
    chatuploads.add_upload_routes(app)
    for path in ("/api/chat/sessions", "/api/chat/messages"):
        app.router.add_route("OPTIONS", path, preflight)
