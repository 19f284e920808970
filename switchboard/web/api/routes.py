"""The integration API's routes under ``/api/v1``: bearer tokens with scopes, one tenant per token.

Sending a message is what the console's ``say`` does (an :class:`~switchboard.core.messages.OperatorActed` through
the session's inbox, so it is ordered with the conversation and sent by the worker through the outbox and its
limits); starting a turn ingests an :class:`~switchboard.core.messages.ExternalEvent` under the caller's
``Idempotency-Key``. Every refusal is a JSON ``{"error": {"code", "message"}}``: ``400`` malformed, ``401`` no or a
bad token, ``403`` a missing scope or another tenant's conversation, ``404`` unknown, ``413`` too large, ``422`` an
idempotency key reused with another body, ``429`` a session's abuse limit, ``503`` Redis.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticSerializationError
from redis.exceptions import RedisError

from switchboard.control import ControlService, NotFoundError, OperatorScope
from switchboard.control.service import MAX_SAY_CHARS
from switchboard.core.messages import ConversationRef, ExternalEvent, InboundMessage, OperatorActed, Sender
from switchboard.core.sealing import DATA_KEYS_ENV, SealError
from switchboard.errors import QueueUnavailableError
from switchboard.queue.ingest import IngestResult
from switchboard.queue.keys import GlobalKeys
from switchboard.queue.operators import operator_message, session_conversation
from switchboard.queue.store import load_history
from switchboard.settings.api import ApiToken, Scope
from switchboard.types import SessionKey
from switchboard.web.api.spec import PREFIX, openapi_document
from switchboard.web.api.tokens import find_token
from switchboard.web.appkeys import INGESTOR, REDIS, ROUTER, SETTINGS
from switchboard.web.console.api import approval_json

__all__ = ["MAX_BODY_BYTES", "MAX_EVENT_CHARS", "add_routes"]

logger = logging.getLogger(__name__)

MAX_BODY_BYTES: Final = 64 * 1024
"""Largest request body; more is answered ``413`` before it is parsed."""
MAX_EVENT_CHARS: Final = 32_000
"""Longest external event payload (its JSON text) a turn may carry."""
HISTORY_ENTRIES: Final = 20
_GLOBAL: Final = GlobalKeys()
_KEY_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")
TOKEN: web.RequestKey[ApiToken] = web.RequestKey("api_token")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_Body = TypeVar("_Body", bound=BaseModel)


class ApiError(Exception):
    """A refusal with its HTTP status and a stable code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


class _Target(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    channel: str = Field(min_length=1, max_length=64)
    account: str = Field("default", min_length=1, max_length=200)
    conversation: str = Field(min_length=1, max_length=500)
    """The platform's conversation id (a Telegram chat id, a Slack channel id, a WhatsApp number, …)."""
    thread: str | None = Field(None, min_length=1, max_length=500)


class SendBody(_Target):
    """``POST /api/v1/messages``."""

    text: str = Field(min_length=1, max_length=MAX_SAY_CHARS)

    @field_validator("text")
    @classmethod
    def _text(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v


class TurnBody(_Target):
    """``POST /api/v1/turns``."""

    event: str = Field(min_length=1, max_length=120)
    """What happened (``order.shipped``)."""
    data: Any = None
    """The event's details (any JSON): shown to the agent as untrusted data."""


def _text_ok(*values: str | None) -> bool:
    for value in values:
        if value is None:
            continue
        try:
            value.encode()
        except UnicodeEncodeError:
            return False
    return True


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authenticate every route but the document, and turn refusals into JSON answers."""
    if not request.path.startswith(PREFIX + "/"):
        return await handler(request)
    try:
        if request.path != f"{PREFIX}/openapi.json":
            request[TOKEN] = _authenticate(request)
        return await handler(request)
    except ApiError as err:
        headers = {"WWW-Authenticate": 'Bearer realm="switchboard"'} if err.status == 401 else None
        return _error(err.status, err.code, str(err), headers)
    except QueueUnavailableError:
        return _error(503, "unavailable", "the queue did not answer in time; try again")
    except SealError as err:  # the server's data keys do not open what is stored: an operator's fix, not a crash
        logger.error("%s %s: %s", request.method, request.path, err)
        return _error(503, "sealed", f"stored data does not open with this server's keys; check {DATA_KEYS_ENV}")
    except (TimeoutError, RedisError, OSError) as err:
        logger.warning("%s %s: Redis failed: %s", request.method, request.path, type(err).__name__)
        return _error(503, "unavailable", "the queue did not answer in time; try again")


def _authenticate(request: web.Request) -> ApiToken:
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        raise ApiError(401, "unauthenticated", "send the token as 'Authorization: Bearer <token>'")
    token = find_token(request.config_dict[SETTINGS].file.api.tokens, presented.strip())
    if token is None:
        raise ApiError(401, "unauthenticated", "the token is not valid")
    return token


def _require(request: web.Request, scope: Scope) -> ApiToken:
    token = request[TOKEN]
    if scope not in token.scopes:
        raise ApiError(403, "missing_scope", f"the token lacks the scope {scope!r}")
    return token


async def _body(request: web.Request) -> bytes:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise ApiError(413, "too_large", f"the body is over {MAX_BODY_BYTES} bytes")
    body = await request.content.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(413, "too_large", f"the body is over {MAX_BODY_BYTES} bytes")
    return body


def _parse(model: type[_Body], raw: bytes) -> _Body:
    try:
        parsed = model.model_validate_json(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ApiError(400, "invalid_body", f"{where}: {first['msg']}") from None
    return parsed


def _conversation(request: web.Request, token: ApiToken, target: _Target) -> ConversationRef:
    """Where ``target`` lives, after checking its channel account is configured and is the token's tenant's."""
    if not _text_ok(target.channel, target.account, target.conversation, target.thread):
        raise ApiError(400, "invalid_body", "ids must be valid Unicode text")
    route = request.config_dict[ROUTER].routes.get((target.channel, target.account))
    if route is None:
        raise ApiError(404, "unknown_account", f"no channel account {target.channel}/{target.account} is configured")
    if route.tenant != token.tenant:
        raise ApiError(403, "other_tenant", f"{target.channel}/{target.account} is not tenant {token.tenant!r}'s")
    return ConversationRef(
        tenant=route.tenant,
        agent=route.agent,
        channel=target.channel,
        account=target.account,
        conversation=target.conversation,
        thread=target.thread,
    )


async def _known(request: web.Request, conversation: ConversationRef) -> ConversationRef:
    """The conversation as its session last saw it (with the platform's routing data), else as given."""
    stored = await session_conversation(request.config_dict[REDIS], conversation.session_key)
    return stored if stored is not None else conversation


def _idempotency_key(request: web.Request, *, required: bool) -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        if required:
            raise ApiError(
                400, "idempotency_key_required", "send an Idempotency-Key header (1-200 of A-Z a-z 0-9 - _ . :)"
            )
        return None
    if not 1 <= len(key) <= 200 or not set(key) <= _KEY_CHARS:
        raise ApiError(400, "invalid_idempotency_key", "Idempotency-Key must be 1-200 of A-Z a-z 0-9 - _ . :")
    return key


async def _ingest(request: web.Request, message: InboundMessage, *, idempotent: bool) -> IngestResult:
    try:
        result = await request.config_dict[ROUTER].ingest(message, idempotent=idempotent)
    except PydanticSerializationError:
        raise ApiError(400, "invalid_body", "the text cannot be stored") from None
    if result is None:  # the route was checked just before: only a reload could remove it
        raise ApiError(404, "unknown_account", "the channel account is not configured")
    if result.limited is not None:
        raise ApiError(429, "rate_limited", f"the conversation refused the message for now ({result.limited})")
    if result.reused:
        raise ApiError(422, "idempotency_key_reused", "this Idempotency-Key was used with another body")
    return result


def _accepted(result: IngestResult, session: SessionKey) -> web.Response:
    headers = {"Idempotent-Replayed": "true"} if result.duplicate else None
    return web.json_response({"message_id": result.message_id, "session": session}, status=202, headers=headers)


async def send_message(request: web.Request) -> web.Response:
    """``POST /api/v1/messages``: send ``text`` to a conversation, as an operator's ``say`` does."""
    token = _require(request, "messages:send")
    key = _idempotency_key(request, required=False)
    body = _parse(SendBody, await _body(request))
    conversation = await _known(request, _conversation(request, token, body))
    if not _text_ok(body.text):
        raise ApiError(400, "invalid_body", "text must be valid Unicode text")
    event = OperatorActed(action="say", operator=f"api:{token.name}")
    dedup = f"api:{token.name}:send:{key}" if key is not None else f"api:{token.name}:send:{secrets.token_hex(12)}"
    message = operator_message(conversation, event, dedup_key=dedup, text=body.text)
    result = await _ingest(request, message, idempotent=key is not None)
    return _accepted(result, conversation.session_key)


async def start_turn(request: web.Request) -> web.Response:
    """``POST /api/v1/turns``: an external event reaches the conversation's agent, which answers it (once per key)."""
    token = _require(request, "turns:start")
    key = _idempotency_key(request, required=True)
    body = _parse(TurnBody, await _body(request))
    conversation = await _known(request, _conversation(request, token, body))
    payload = body.data if isinstance(body.data, str) else json.dumps(body.data, ensure_ascii=False, sort_keys=True)
    if len(payload) > MAX_EVENT_CHARS:
        raise ApiError(413, "too_large", f"data is over {MAX_EVENT_CHARS} characters")
    if not _text_ok(payload, body.event):
        raise ApiError(400, "invalid_body", "event and data must be valid Unicode text")
    principal = f"api:{token.name}"
    message = InboundMessage(
        dedup_key=f"api:{token.name}:turn:{key}",
        conversation=conversation,
        sender=Sender(id=principal, name=token.name),
        text=payload,
        event=ExternalEvent(name=body.event, source=principal),
    )
    result = await _ingest(request, message, idempotent=True)
    return _accepted(result, conversation.session_key)


async def read_conversation(request: web.Request) -> web.Response:
    """``GET /api/v1/conversations/{channel}/{account}/{conversation}``: state, pending approvals, recent history."""
    token = _require(request, "conversations:read")
    info = request.match_info
    try:
        target = _Target(
            channel=info["channel"],
            account=info["account"],
            conversation=info["conversation"],
            thread=request.query.get("thread"),
        )
    except ValidationError:
        raise ApiError(
            400, "invalid_request", "channel, account, conversation (and thread) must be 1-500 characters"
        ) from None
    conversation = _conversation(request, token, target)
    session = conversation.session_key
    app = request.app
    service = ControlService(app[REDIS], app[SETTINGS], app[INGESTOR])
    scope = OperatorScope(operator=f"api:{token.name}", tenants=frozenset({token.tenant}))
    try:
        view = await service.session(scope, session)
        approvals = await service.session_approvals(scope, session)
    except NotFoundError:
        return web.json_response({"session": session, "exists": False, "state": None, "approvals": []})
    body: dict[str, Any] = {
        "session": session,
        "exists": True,
        "state": view.state,
        "last_activity": view.last_activity,
        "inbox_depth": view.inbox_depth,
        "controlled_by": view.controlled_by,
        "approvals": [approval_json(record) for record in approvals],
    }
    if "conversations:history" in token.scopes:
        entries = await load_history(app[REDIS], session, HISTORY_ENTRIES * 3)
        body["history"] = [
            {"role": e.role, "text": e.text, "at": e.at} for e in entries if e.role in ("user", "assistant") and e.text
        ][-HISTORY_ENTRIES:]
    return web.json_response(body)


async def openapi(request: web.Request) -> web.Response:
    """``GET /api/v1/openapi.json``: this API's OpenAPI 3.1 document."""
    return web.json_response(openapi_document())


def add_routes(app: web.Application) -> None:
    """Add the integration API's routes and its guard to ``app``."""
    app.middlewares.append(_guard)
    app.router.add_get(f"{PREFIX}/openapi.json", openapi)
    app.router.add_post(f"{PREFIX}/messages", send_message)
    app.router.add_post(f"{PREFIX}/turns", start_turn)
    app.router.add_get(f"{PREFIX}/conversations/{{channel}}/{{account}}/{{conversation}}", read_conversation)
