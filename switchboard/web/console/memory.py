"""The console's memory view: projects, their facts and history; correct, delete, connect and disconnect.

============================================== ==============================================================
``GET /console/api/memory/projects[?tenant=T]``  ``{"projects": [ProjectView…]}`` of the operator's tenants
``GET /console/api/memory/facts?tenant=T[&project=P]`` ``{"facts": [FactView…]}`` oldest first
``GET /console/api/memory/fact?tenant=T&id=ID``  ``{"fact": FactView, "changes": [ChangeView…]}``
``GET /console/api/memory/audit?tenant=T``       ``{"audit": [AuditEntry…]}`` operators' changes, newest first
``POST /console/api/memory/correct``             ``{"tenant", "id", "text", "reason"[, "confidence"]}`` → 200
``POST /console/api/memory/forget``              ``{"tenant", "id", "reason"}`` → 200
``POST /console/api/memory/connect``             ``{"agent", "project"}`` → 200 the project
``POST /console/api/memory/disconnect``          ``{"agent", "project"}`` → 200 the project
============================================== ==============================================================

``tenant`` may be left out by an operator of exactly one tenant. Writes need the CSRF token and the operator role.
Errors as the rest of the console API: ``400`` malformed or refused (nothing changed), ``403`` another tenant's,
``404`` unknown, ``503`` Redis.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

from aiohttp import web
from redis.exceptions import RedisError

from switchboard.control import ControlError, InvalidRequestError, OperatorScope
from switchboard.control.memory import MemoryControl, close_store, memory_store
from switchboard.core.memory.config import build_embedder
from switchboard.core.memory.embeddings import Embedder, OpenAIEmbedder
from switchboard.core.memory.store import MemoryStore
from switchboard.errors import QueueUnavailableError
from switchboard.web.appkeys import REDIS, SETTINGS
from switchboard.web.console.api import failure, plain
from switchboard.web.console.routes import SECURITY_HEADERS, SIGNIN, Handler, acting_only, error, operator_only

__all__ = ["EMBEDDER", "MEMORY", "add_memory_routes"]

logger = logging.getLogger(__name__)

MEMORY: Final = web.AppKey("memory_store", MemoryStore)
"""The memory store the console reads and changes (the worker's)."""
EMBEDDER: Final = web.AppKey("memory_embedder", Embedder)
"""How a corrected text is embedded again (the worker's ``memory.embeddings``)."""

_BODY_LIMIT: Final = 16 * 1024
_REFUSED: Final = (ControlError, QueueUnavailableError, RedisError, OSError, TimeoutError)
Read = Callable[[MemoryControl, OperatorScope, Mapping[str, str]], Awaitable[dict[str, Any]]]
Write = Callable[[MemoryControl, OperatorScope, dict[str, Any]], Awaitable[Any]]


def _control(request: web.Request) -> tuple[MemoryControl, OperatorScope]:
    signin = request[SIGNIN]
    scope = OperatorScope(
        operator=f"console:{signin.operator.name}",
        tenants=frozenset(signin.operator.tenants),
        reads_messages=signin.operator.reads_messages,
    )
    app = request.app
    return MemoryControl(app[SETTINGS], app[MEMORY], app[REDIS], app.get(EMBEDDER)), scope


def _tenant(scope: OperatorScope, given: Any) -> str:
    if given is None or given == "":
        if len(scope.tenants) == 1 and not scope.unrestricted:
            return next(iter(scope.tenants))
        raise InvalidRequestError('name the tenant ("tenant")')
    if not isinstance(given, str):
        raise InvalidRequestError('"tenant" must be a string')
    return given


def _string(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f'"{name}" must be a non-empty string')
    return value


def _reader(read: Read) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        control, scope = _control(request)
        try:
            body = await read(control, scope, request.query)
        except _REFUSED as err:
            return failure(err)
        return web.json_response(body, headers=SECURITY_HEADERS)

    return operator_only(handler)


def _writer(write: Write) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        raw = await request.content.read(_BODY_LIMIT + 1)
        if len(raw) > _BODY_LIMIT:
            return error(413, "body_too_large", f"body over {_BODY_LIMIT} bytes")
        try:
            body: Any = json.loads(raw or b"{}")
        except (ValueError, RecursionError):
            body = None
        if not isinstance(body, dict):
            return error(400, "malformed_body", "body must be a JSON object")
        control, scope = _control(request)
        try:
            done = await write(control, scope, body)
        except _REFUSED as err:
            return failure(err)
        logger.info("console: %s by %s", request.path.removeprefix("/console/api/"), scope.operator)
        return web.json_response({"ok": True, "result": plain(done)}, headers=SECURITY_HEADERS)

    return acting_only(handler)


async def _projects(control: MemoryControl, scope: OperatorScope, query: Mapping[str, str]) -> dict[str, Any]:
    return {"projects": plain(await control.projects(scope, query.get("tenant") or None))}


async def _facts(control: MemoryControl, scope: OperatorScope, query: Mapping[str, str]) -> dict[str, Any]:
    found = await control.facts(scope, _tenant(scope, query.get("tenant")), query.get("project") or None)
    return {"facts": plain(found)}


async def _fact(control: MemoryControl, scope: OperatorScope, query: Mapping[str, str]) -> dict[str, Any]:
    detail = await control.show(scope, _tenant(scope, query.get("tenant")), _string(query, "id"))
    return {"fact": plain(detail.fact), "changes": plain(detail.changes)}


async def _audit(control: MemoryControl, scope: OperatorScope, query: Mapping[str, str]) -> dict[str, Any]:
    return {"audit": plain(await control.audit(scope, _tenant(scope, query.get("tenant"))))}


async def _correct(control: MemoryControl, scope: OperatorScope, body: dict[str, Any]) -> Any:
    return await control.correct(
        scope,
        _tenant(scope, body.get("tenant")),
        _string(body, "id"),
        body.get("text"),
        body.get("reason"),
        body.get("confidence"),
    )


async def _forget(control: MemoryControl, scope: OperatorScope, body: dict[str, Any]) -> Any:
    return await control.forget(scope, _tenant(scope, body.get("tenant")), _string(body, "id"), body.get("reason"))


async def _connect(control: MemoryControl, scope: OperatorScope, body: dict[str, Any]) -> Any:
    return await control.connect(scope, _string(body, "agent"), _string(body, "project"))


async def _disconnect(control: MemoryControl, scope: OperatorScope, body: dict[str, Any]) -> Any:
    return await control.disconnect(scope, _string(body, "agent"), _string(body, "project"))


def add_memory_routes(app: web.Application) -> None:
    """Register the memory view's routes on ``app`` (which must carry SETTINGS and REDIS), with its store."""

    async def store(app: web.Application) -> AsyncIterator[None]:
        opened = memory_store(app[SETTINGS])
        embedder = build_embedder(app[SETTINGS].file.memory.embeddings)
        app[MEMORY] = opened
        if embedder is not None:
            app[EMBEDDER] = embedder
        yield
        await close_store(opened)
        if isinstance(embedder, OpenAIEmbedder):
            await embedder.aclose()

    app.cleanup_ctx.append(store)
    app.router.add_get("/console/api/memory/projects", _reader(_projects))
    app.router.add_get("/console/api/memory/facts", _reader(_facts))
    app.router.add_get("/console/api/memory/fact", _reader(_fact))
    app.router.add_get("/console/api/memory/audit", _reader(_audit))
    app.router.add_post("/console/api/memory/correct", _writer(_correct))
    app.router.add_post("/console/api/memory/forget", _writer(_forget))
    app.router.add_post("/console/api/memory/connect", _writer(_connect))
    app.router.add_post("/console/api/memory/disconnect", _writer(_disconnect))
