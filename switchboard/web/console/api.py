"""The console's data and actions: JSON over :class:`switchboard.control.ControlService`, the CLI's service layer.

Reads come from the same event log and state the CLI reads; every write goes through the same service, which checks
the operator's tenants, so nothing here writes to Redis. :func:`add_api_routes` lists the routes and answers;
errors are ``400`` malformed or refused, ``403`` another tenant's, ``404`` unknown, ``503`` Redis.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from aiohttp import web
from redis.exceptions import RedisError

from switchboard.control import (
    SESSION_STATES,
    Accepted,
    ControlError,
    ControlService,
    InvalidRequestError,
    NotFoundError,
    OperatorScope,
    OutOfScopeError,
)
from switchboard.core.approvals.records import ApprovalRecord
from switchboard.errors import QueueUnavailableError
from switchboard.queue.fanout import ScoreCursor
from switchboard.web.appkeys import INGESTOR, REDIS, SETTINGS
from switchboard.web.console.routes import SECURITY_HEADERS, SIGNIN, Handler, error, operator_only

__all__ = [
    "SESSION_FILTERS",
    "add_api_routes",
    "approval_json",
    "failure",
    "filtered_sessions",
    "plain",
    "service_of",
    "session_page",
    "transcript_body",
]

logger = logging.getLogger(__name__)

_BODY_LIMIT: Final = 16 * 1024
SESSION_FILTERS: Final = ("channel", "agent", "tenant", "state")
Action = Callable[[ControlService, OperatorScope, dict[str, Any]], Awaitable[Any]]


def service_of(request: web.Request) -> tuple[ControlService, OperatorScope]:
    """The control service and the signed-in operator's scope (tenants, whether they read messages)."""
    signin = request[SIGNIN]
    app = request.app
    scope = OperatorScope(
        operator=f"console:{signin.operator.name}",
        tenants=frozenset(signin.operator.tenants),
        reads_messages=signin.operator.reads_messages,
    )
    return ControlService(app[REDIS], app[SETTINGS], app[INGESTOR]), scope


def _json(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, headers=SECURITY_HEADERS)


def plain(value: Any) -> Any:
    """A view (a dataclass, possibly nested) as JSON-ready data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


def approval_json(record: ApprovalRecord, *, reads_messages: bool = True) -> dict[str, Any]:
    """What the reviewer sees of an approval: the record's normalised fields (not the signed paused program).

    Without ``reads_messages`` the words are withheld (``"redacted": true``): the arguments (also inside ``request``),
    the held draft, what it rests on (``evidence``, ``resources``) and a settled call's ``outcome``.
    """
    body = record.model_dump(mode="json", exclude={"program"})
    request = record.request
    body.update(
        tool=request.tool if request is not None else "reply",
        arguments=request.arguments if request is not None else {"draft": record.draft},
        resources=list(request.resources) if request is not None else list(record.evidence),
        reason=request.reason if request is not None else "review before sending",
        policy_version=request.policy_version if request is not None else "",
        action_sha256=request.action_sha256 if request is not None else "",
        risk=request.risk if request is not None else "",
        requester=record.requested_by,
        paused_program=record.program is not None,
        redacted=not reads_messages,
    )
    if not reads_messages:
        body.update(arguments=None, draft="", evidence=[], resources=[], request=None, outcome=None)
    return body


def failure(err: Exception) -> web.Response:
    """The error answer for a refused request or a Redis that did not answer."""
    match err:
        case OutOfScopeError():
            return error(403, "out_of_scope", str(err))
        case NotFoundError():
            return error(404, "not_found", str(err))
        case InvalidRequestError():
            return error(400, "invalid_request", str(err))
        case QueueUnavailableError() | RedisError() | OSError() | TimeoutError():
            logger.warning("console: Redis did not answer (%s)", type(err).__name__)
            return error(503, "queue_unavailable", "Redis did not answer in time; retry")
        case _:
            return error(400, "refused", str(err))


def _reader(name: str, read: Callable[[ControlService, OperatorScope], Awaitable[Any]]) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        service, scope = service_of(request)
        try:
            found = await read(service, scope)
        except (ControlError, QueueUnavailableError, RedisError, OSError, TimeoutError) as err:
            return failure(err)
        return _json({name: plain(found)})

    return operator_only(handler)


async def _approvals(service: ControlService, scope: OperatorScope) -> list[dict[str, Any]]:
    return [approval_json(r, reads_messages=scope.reads_messages) for r in await service.approvals(scope)]


async def filtered_sessions(service: ControlService, scope: OperatorScope, query: Mapping[str, str]) -> Any:
    """The sessions list for the query's filters (``channel``, ``agent``, ``tenant``, ``state``; empty: any)."""
    found, _next = await session_page(service, scope, query)
    return found


async def session_page(service: ControlService, scope: OperatorScope, query: Mapping[str, str]) -> tuple[Any, str]:
    """The page of sessions for the query's filters, ``limit`` and ``after``, and the next page's cursor (``""``: none).

    Raises:
        InvalidRequestError: ``after`` is not a cursor, or ``limit`` not from 1 to 1000.
    """
    given = {name: query.get(name) or None for name in SESSION_FILTERS}
    try:
        after = ScoreCursor.decode(query["after"]) if query.get("after") else None
    except ValueError as err:
        raise InvalidRequestError("after must be the cursor of an earlier page (next)") from err
    limit = query.get("limit") or "50"
    if not limit.isdigit() or not 1 <= int(limit) <= 1000:
        raise InvalidRequestError("limit must be a whole number from 1 to 1000")
    found, following = await service.session_page(
        scope,
        limit=int(limit),
        channel=given["channel"],
        agent=given["agent"],
        tenant=given["tenant"],
        state=given["state"],
        after=after,
    )
    return plain(found), following.encode() if following is not None else ""


async def sessions(request: web.Request) -> web.StreamResponse:
    """``GET /console/api/sessions?channel=&agent=&tenant=&state=&limit=&after=``: a page of sessions, newest first.

    ``next`` is the ``after`` of the following page (``""`` on the last).
    """
    service, scope = service_of(request)
    try:
        found, following = await session_page(service, scope, request.query)
    except (ControlError, QueueUnavailableError, RedisError, OSError, TimeoutError) as err:
        return failure(err)
    return _json({"sessions": found, "states": list(SESSION_STATES), "next": following})


async def transcript(request: web.Request) -> web.StreamResponse:
    """``GET /console/api/transcript?session=KEY``: the session's state and its conversation, line by line."""
    session = request.query.get("session", "")
    if not session:
        return error(400, "malformed_request", "name the session: ?session=<key>")
    service, scope = service_of(request)
    try:
        body = await transcript_body(service, scope, session)
    except (ControlError, QueueUnavailableError, RedisError, OSError, TimeoutError) as err:
        return failure(err)
    return _json(body)


async def transcript_body(service: ControlService, scope: OperatorScope, session: str) -> dict[str, Any]:
    """The transcript route's answer (also what the stream pushes for the open session)."""
    view = await service.session(scope, session)
    lines = await service.transcript(scope, session)
    pending = await service.session_approvals(scope, session)
    return {
        "session": view.key,
        "state": view.state,
        "controlled_by": view.controlled_by,
        "redacted": not scope.reads_messages,
        "transcript": plain(lines),
        "approvals": [approval_json(r, reads_messages=scope.reads_messages) for r in pending],
    }


async def timeline(request: web.Request) -> web.StreamResponse:
    """``GET /console/api/timeline?session=KEY``: the session's state, its event log and its pending approvals."""
    session = request.query.get("session", "")
    if not session:
        return error(400, "malformed_request", "name the session: ?session=<key>")
    service, scope = service_of(request)
    try:
        view = await service.session(scope, session)
        events = await service.timeline(scope, session)
        pending = await service.session_approvals(scope, session)
    except (ControlError, QueueUnavailableError, RedisError, OSError, TimeoutError) as err:
        return failure(err)
    return _json(
        {
            "session": view.key,
            "state": view.state,
            "controlled_by": view.controlled_by,
            "events": [
                {"id": e.id, "at": e.at, "type": e.kind, "trace_id": e.trace_id, "data": e.data} for e in events
            ],
            "approvals": [approval_json(r, reads_messages=scope.reads_messages) for r in pending],
        }
    )


def _text(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f'"{name}" must be a non-empty string')
    return value


def _writer(action: Action, status: int = 202) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.content_length is not None and request.content_length > _BODY_LIMIT:
            return error(413, "body_too_large", f"body over {_BODY_LIMIT} bytes")
        raw = await request.content.read(_BODY_LIMIT + 1)
        if len(raw) > _BODY_LIMIT:
            return error(413, "body_too_large", f"body over {_BODY_LIMIT} bytes")
        try:
            body: Any = json.loads(raw or b"{}")
        except (ValueError, RecursionError):
            body = None
        if not isinstance(body, dict):
            return error(400, "malformed_body", "body must be a JSON object")
        service, scope = service_of(request)
        if request[SIGNIN].operator.role != "operator":
            return error(403, "viewer", "a viewer cannot act: ask for the operator role (console.operators[].role)")
        try:
            done = await action(service, scope, body)
        except (ControlError, QueueUnavailableError, RedisError, OSError, TimeoutError) as err:
            return failure(err)
        logger.info("console: %s by %s", request.path.removeprefix("/console/api/"), scope.operator)
        return _json({"ok": True, "result": plain(done)}, status=status)

    return operator_only(handler)


async def _decide(service: ControlService, scope: OperatorScope, body: dict[str, Any]) -> Accepted:
    return await service.decide(scope, _text(body, "session"), _text(body, "id"), _text(body, "verdict"))


async def _take_over(service: ControlService, scope: OperatorScope, body: dict[str, Any]) -> Accepted:
    return await service.take_over(scope, _text(body, "session"))


async def _say(service: ControlService, scope: OperatorScope, body: dict[str, Any]) -> Accepted:
    return await service.say(scope, _text(body, "session"), _text(body, "text"))


async def _hand_back(service: ControlService, scope: OperatorScope, body: dict[str, Any]) -> Accepted:
    return await service.hand_back(scope, _text(body, "session"))


async def _requeue(service: ControlService, scope: OperatorScope, body: dict[str, Any]) -> list[Accepted]:
    return await service.requeue(scope, _text(body, "session"), _text(body, "id"))


async def _resolve(service: ControlService, scope: OperatorScope, body: dict[str, Any]) -> Any:
    return await service.resolve_effect(scope, _text(body, "session"), _text(body, "key"), _text(body, "outcome"))


def add_api_routes(app: web.Application) -> None:
    """Register the console's data and action routes on ``app`` (which must carry SETTINGS, REDIS, INGESTOR).

    ========================================= ==================================================================
    ``GET /console/api/sessions``              ``{"sessions": [SessionView…], "states"}`` (newest first);
                                               ``?channel=&agent=&tenant=&state=`` filter
    ``GET /console/api/transcript?session=KEY`` ``{"session", "state", "controlled_by", "redacted",
                                               "transcript": [TranscriptItem…], "approvals": [...]}``
    ``GET /console/api/timeline?session=KEY``  ``{"session", "state", "controlled_by", "events": [...],
                                               "approvals": [...]}``
    ``GET /console/api/approvals``             ``{"approvals": [...]}`` pending, oldest first
    ``POST /console/api/approvals/decide``     ``{"session", "id", "verdict": "approve"|"deny"}`` → 202
    ``POST /console/api/sessions/take-over``   ``{"session"}`` → 202
    ``POST /console/api/sessions/say``         ``{"session", "text"}`` → 202
    ``POST /console/api/sessions/hand-back``   ``{"session"}`` → 202
    ``GET /console/api/dead-letters``          ``{"dead_letters": [...]}``
    ``POST /console/api/dead-letters/requeue`` ``{"session", "id"}`` → 202
    ``GET /console/api/effects``               ``{"effects": [...]}`` awaiting reconciliation
    ``POST /console/api/effects/resolve``      ``{"session", "key", "outcome": "done"|"failed"}`` → 200
    ``GET /console/api/agents``                ``{"agents": [...]}``
    ``GET /console/api/usage``                 ``{"usage": [...]}`` per tenant and agent
    ========================================= ==================================================================
    """
    app.router.add_get("/console/api/sessions", operator_only(sessions))
    app.router.add_get("/console/api/timeline", operator_only(timeline))
    app.router.add_get("/console/api/transcript", operator_only(transcript))
    app.router.add_get("/console/api/approvals", _reader("approvals", _approvals))
    app.router.add_get("/console/api/dead-letters", _reader("dead_letters", lambda s, scope: s.dead_letters(scope)))
    app.router.add_get("/console/api/effects", _reader("effects", lambda s, scope: s.effects_in_doubt(scope)))
    app.router.add_get("/console/api/agents", _reader("agents", lambda s, scope: s.agents(scope)))
    app.router.add_get("/console/api/usage", _reader("usage", lambda s, scope: s.usage(scope)))
    app.router.add_post("/console/api/approvals/decide", _writer(_decide))
    app.router.add_post("/console/api/sessions/take-over", _writer(_take_over))
    app.router.add_post("/console/api/sessions/say", _writer(_say))
    app.router.add_post("/console/api/sessions/hand-back", _writer(_hand_back))
    app.router.add_post("/console/api/dead-letters/requeue", _writer(_requeue))
    app.router.add_post("/console/api/effects/resolve", _writer(_resolve, status=200))
