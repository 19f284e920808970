"""The web chat's HTTP surface: the page at ``/`` and its public API (``docs/channels/web-chat.md``).

Tokens are random and stored only as their SHA-256 (a lookup by hash leaks nothing through timing), with a 30-day TTL
refreshed on use. A token's session never changes, so each process caches the lookup for
:data:`.access.TOKEN_CACHE_S`: a token deleted in Redis is refused at most that long afterwards (at once through
this process); a wrong token is never cached.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import uuid
from pathlib import Path
from typing import Any, Final

import pydantic_core
from aiohttp import web
from redis.exceptions import RedisError

from switchboard.channels.web.adapter import WebChannel, parse_post, split_session_key
from switchboard.core.events import DropReason
from switchboard.core.messages import Attachment, ChoiceSelected, ConversationRef, InboundMessage, Posted
from switchboard.errors import MalformedBodyError, QueueUnavailableError, RequestError, excerpt
from switchboard.queue.cancellation import is_stop
from switchboard.queue.keys import GlobalKeys
from switchboard.queue.limits import count_session
from switchboard.queue.router import Route
from switchboard.queue.uploads import UploadStore
from switchboard.settings import Settings
from switchboard.types import SessionKey
from switchboard.web.appkeys import CHANNELS, REDIS, ROUTER, SETTINGS
from switchboard.web.clientaddr import client_address
from switchboard.web.server import DIRECT_ROUTES, FixedResponse, header_lines
from switchboard.web.webchat import access
from switchboard.web.webchat import stream as chatstream
from switchboard.web.webchat import uploads as chatuploads

__all__ = ["STATIC_DIR", "add_routes"]

logger = logging.getLogger(__name__)

STATIC_DIR: Final = Path(__file__).parent / "static"
_STATIC_FILES: Final = {
    "chat.js": "text/javascript",
    "chat.css": "text/css",
    "index.html": "text/html",
}
_SESSION_BODY_LIMIT: Final = 4096
_SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; media-src blob:; "
        "connect-src 'self'; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}
_ACCEPTED_PREFIX: Final = b'{"message_id":"'
_LIMITED: Final[dict[DropReason, str]] = {
    "inbox_full": "too many messages are waiting in this session",
    "session_rate": "too many messages in this session",
    "sender_rate": "too many messages from this sender",
}
_CORS_LINES: Final = header_lines(access.CORS_HEADERS)
_ECHO_JSON: Final = json.JSONEncoder(ensure_ascii=False).encode
_to_json: Final = pydantic_core.to_json
"""What ``_ECHO_JSON`` makes of a ``str`` the page could send (UTF-8, not escaped), in Rust: a text's longest step."""


def _echo(draft: InboundMessage) -> str:
    """The web stream's ``user`` entry of a draft: its text, named by its dedup key (readers map that to the id).

    A ``/stop`` carries ``"command": "stop"`` (the page shows the stop, not a bubble).
    """
    match draft.event:
        case Posted(attachments=attachments) if not attachments and is_stop(draft):  # the stop button: no bubble
            return _ECHO_JSON({"text": draft.text, "client_id": draft.dedup_key, "command": "stop"})
        case Posted(attachments=attachments) if not attachments:  # a plain text: the one on every message's path
            return f'{{"text": {_to_json(draft.text).decode()}, "client_id": {_to_json(draft.dedup_key).decode()}}}'
        case Posted(attachments=attachments):
            shown: dict[str, Any] = {"text": draft.text, "client_id": draft.dedup_key}
            shown["attachments"] = [
                {"upload": a.ref, "name": a.name, "mime_type": a.mime_type, "size": a.size} for a in attachments
            ]
            return _ECHO_JSON(shown)
        case ChoiceSelected(option_id=option_id):
            return _ECHO_JSON({"text": draft.text, "client_id": draft.dedup_key, "choice": option_id})
        case _:
            return _ECHO_JSON({"text": draft.text, "client_id": draft.dedup_key})


def _web_channel(app: web.Application) -> WebChannel:
    adapter = app.get(CHANNELS, {}).get(("web", "default"))
    return adapter if isinstance(adapter, WebChannel) else WebChannel(None)


def _web_route(app: web.Application) -> Route:
    """Where web chat sessions go by default: the web channel's agent and tenant (the ingest router's route)."""
    return app[ROUTER].routes[("web", "default")]


async def _read_capped(request: web.BaseRequest, limit: int) -> bytes | None:
    """The body, or ``None`` when it is over ``limit`` bytes (checked before anything is parsed)."""
    length = request.content_length
    if length is not None and length > limit:
        return None
    content = request.content
    if content.is_eof():  # the whole body has arrived (as it has for almost every post): take it as it is
        body = content.read_nowait()
        return None if len(body) > limit else body
    if length is not None:
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


def _allowed_agents(app: web.Application) -> tuple[str, ...]:
    """The agents a new web chat session may name: ``channels.web.agents``, else only the channel's own agent."""
    options = app[SETTINGS].file.channels.get("web")
    if options is not None and options.agents:
        return tuple(options.agents)
    return (_web_route(app).agent,)


async def create_session(request: web.Request) -> web.Response:
    """``POST /api/chat/sessions``: a new conversation and the bearer token that opens it."""
    app = request.app
    settings: Settings = app[SETTINGS]
    body = await _read_capped(request, _SESSION_BODY_LIMIT)
    if body is None:
        return access.error(413, "body_too_large", f"body over {_SESSION_BODY_LIMIT} bytes")
    agent_name: str | None = None
    if body.strip():
        try:
            raw: Any = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: a nesting bomb like 2,000 ``[``
            return access.error(400, "malformed_body", 'body must be empty, {} or {"agent": "<name>"}')
        if not isinstance(raw, dict):
            return access.error(400, "malformed_body", 'body must be empty, {} or {"agent": "<name>"}')
        agent_name = raw.get("agent")
        if agent_name is not None and not isinstance(agent_name, str):
            return access.error(400, "malformed_body", '"agent" must be a string')
    if agent_name is not None:
        allowed = _allowed_agents(app)
        if agent_name not in allowed or agent_name not in settings.file.agents:
            return access.error(
                403,
                "agent_not_allowed",
                f"the web chat may not start agent {excerpt(agent_name)}; allowed: {', '.join(allowed)} "
                "(an operator lists them under channels.web.agents)",
            )
    route = _web_route(app)
    served = settings.file.agents.get(agent_name or route.agent)
    if served is not None and served.status == "draft":  # a draft agent is never served
        logger.warning("web chat refused a session: agent %r is a draft; see `switchboard check`", served.name)
        return access.error(409, "agent_not_ready", served.draft_notice())
    address = client_address(request, settings.trusted_proxies)
    try:
        wait_ms = await count_session(app[REDIS], address, settings.limits, timeout_s=settings.queue.ingest_timeout_s)
    except QueueUnavailableError:
        return access.unavailable()
    if wait_ms:
        access.reject(app, "rate_limited")
        return access.too_many(wait_ms, "too many new chat sessions from this address")
    conversation = ConversationRef(
        tenant=route.tenant, agent=agent_name or route.agent, channel="web", conversation=uuid.uuid4().hex
    )
    token = secrets.token_urlsafe(32)
    try:
        async with asyncio.timeout(settings.queue.ingest_timeout_s):
            stored = await app[REDIS].set(
                GlobalKeys().web_token(access.hash_token(token)),
                conversation.session_key,
                ex=access.TOKEN_TTL_S,
                nx=True,
            )
    except (TimeoutError, RedisError, OSError):
        return access.unavailable()
    if not stored:  # 256 random bits collided: not in this universe, but never hand out someone else's session
        return access.error(500, "token_collision", "could not create a session; retry")
    logger.debug("web chat session created for agent %s", conversation.agent)
    profile = served.profile if served is not None else None
    agent = {
        "id": conversation.agent,
        "name": profile.name if profile is not None else conversation.agent,
        "description": profile.description if profile is not None else "",
        "starters": [starter.model_dump() for starter in profile.starters] if profile is not None else [],
    }
    return web.json_response(
        {"session": conversation.conversation, "token": token, "agent": agent},
        status=201,
        headers={**access.CORS_HEADERS, **access.NO_STORE},
    )


async def revoke_session(request: web.Request) -> web.Response:
    """``DELETE /api/chat/sessions`` (bearer): revoke the token; ``204``, and every later use of it is ``401``.

    This process forgets the token at once; another web process may honour it for up to :data:`.access.TOKEN_CACHE_S`
    more. The conversation's retained history is left to expire with the session's idle TTL
    (``SWITCHBOARD_LIMITS__IDLE_SESSION_TTL_S``).
    """
    token = access.bearer(request, allow_query=False)
    if not token:
        return access.unauthorized("missing or wrong bearer token")
    token_hash = access.hash_token(token)
    try:
        async with asyncio.timeout(request.app[SETTINGS].queue.ingest_timeout_s):
            deleted = await request.app[REDIS].delete(GlobalKeys().web_token(token_hash))
    except (TimeoutError, RedisError, OSError):
        return access.unavailable()
    request.app[access.TOKENS].drop(token_hash)
    chatstream.token_revoked(request.app, token_hash)  # the streams this token opened end with it
    if not deleted:
        return access.unauthorized("missing or wrong bearer token")
    return web.Response(status=204, headers={**access.CORS_HEADERS, **access.NO_STORE})


async def post_message(request: web.Request) -> web.StreamResponse:
    """``POST /api/chat/messages``: queue one user message; ``202`` only once Redis holds it."""
    return await serve_message(request.app, request)


async def serve_message(app: web.Application, request: web.BaseRequest) -> web.StreamResponse:
    """:func:`post_message` for ``app``: also the route's :data:`~switchboard.web.server.DIRECT_ROUTES` handler."""
    settings: Settings = app[SETTINGS]
    limit = settings.queue.max_body_bytes
    length = request.content_length
    if length is not None and length > limit:
        access.reject(app, "too_large")
        return access.error(413, "body_too_large", f"body over {limit} bytes")
    session = await access.bearer_session(request, app)
    if isinstance(session, web.Response):
        return session
    body = await _read_capped(request, limit)
    if body is None:
        access.reject(app, "too_large")
        return access.error(413, "body_too_large", f"body over {limit} bytes")
    try:
        draft = await _draft(app, session, body)
    except RequestError as err:
        access.reject(app, err.code)
        return access.error(err.status, err.code, str(err))
    except QueueUnavailableError:
        access.reject(app, "queue_unavailable")
        return access.unavailable()
    echo = {"type": "user", "data": _echo(draft)}
    try:
        result = await app[ROUTER].ingest(draft, echo=echo, idempotent=True)  # counts it in the metrics
    except QueueUnavailableError:
        access.reject(app, "queue_unavailable")
        return access.unavailable()
    if result is None:  # the web chat's one account is always routed: only a misbuilt app gets here
        return access.error(404, "unknown_channel", "the web chat is not enabled in this process")
    if result.limited is not None:  # nothing was written
        return access.too_many(result.retry_after_ms, _LIMITED[result.limited])
    if result.reused:  # nothing was written: the page must send the new text under a new client_id
        return access.error(409, "client_id_reused", "this client_id was already used for a different text")
    # the id is hex: the body needs no JSON encoder
    body = _ACCEPTED_PREFIX + result.message_id.encode() + b'"}'
    if not app.on_response_prepare:  # no hook to see the headers: the answer is written in one go
        fixed = FixedResponse.once(request, 202, body, "application/json", _CORS_LINES)
        if fixed is not None:
            return fixed
    return web.Response(body=body, status=202, content_type="application/json", headers=access.CORS_HEADERS)


async def _draft(app: web.Application, session: SessionKey, body: bytes) -> InboundMessage:
    """The message draft of a chat post; upload ids are looked up in the session (an unknown one is refused).

    Raises:
        RequestError: a bad body (400, 413), too many or unknown uploads (400).
        QueueUnavailableError: Redis did not answer the upload lookup in time.
    """
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
    app[access.TOKENS] = access.TokenCache(access.TOKEN_CACHE_S, access.TOKEN_CACHE_MAX)
    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", static)
    app.router.add_post("/api/chat/sessions", create_session)
    app.router.add_delete("/api/chat/sessions", revoke_session)
    app.router.add_post("/api/chat/messages", post_message)
    app.setdefault(DIRECT_ROUTES, {})["/api/chat/messages"] = serve_message  # POST without the dispatcher
    chatstream.add_stream_routes(app)
    chatuploads.add_upload_routes(app)
    for path in ("/api/chat/sessions", "/api/chat/messages"):
        app.router.add_route("OPTIONS", path, access.preflight)
