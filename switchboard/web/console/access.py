"""The console's pairing view: paired senders and open pairing requests of the operator's tenants; approve, revoke.

The same :class:`~switchboard.queue.access.PairingStore` as ``switchboard access``; an operator sees and acts on the
tenants of their sign-in only. Errors: ``400`` malformed, ``403`` another tenant's, ``404`` no such code or sender,
``503`` Redis.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Final

from aiohttp import web
from redis.exceptions import RedisError

from switchboard.core.access import ROLES, Role
from switchboard.queue.access import PairingStore, known_tenants
from switchboard.web.appkeys import REDIS, SETTINGS
from switchboard.web.console.routes import SECURITY_HEADERS, SIGNIN, acting_only, error, operator_only

__all__ = ["add_access_routes"]

logger = logging.getLogger(__name__)

_BODY_LIMIT: Final = 4 * 1024


def _store(request: web.Request) -> PairingStore:
    return PairingStore(request.app[REDIS], events_maxlen=request.app[SETTINGS].queue.events_maxlen)


def _tenants(request: web.Request) -> list[str]:
    """The tenants the YAML file names that the signed-in operator may see."""
    operator = request[SIGNIN].operator
    return [tenant for tenant in known_tenants(request.app[SETTINGS].file) if operator.sees(tenant)]


async def _body(request: web.Request) -> dict[str, Any] | None:
    raw = await request.content.read(_BODY_LIMIT + 1)
    if len(raw) > _BODY_LIMIT:
        return None
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        return None
    return body if isinstance(body, dict) else None


def _chosen_tenant(request: web.Request, body: dict[str, Any]) -> tuple[list[str], web.Response | None]:
    """The tenants a write applies to: the one named (if the operator sees it), else all the operator sees."""
    tenants = _tenants(request)
    named = body.get("tenant")
    if named is None:
        return tenants, None
    if not isinstance(named, str) or not named:
        return [], error(400, "invalid_request", '"tenant" must be a non-empty string')
    if named not in tenants:
        return [], error(403, "out_of_scope", f"tenant {named!r} is not one of yours")
    return [named], None


async def access_view(request: web.Request) -> web.StreamResponse:
    """``GET /console/api/access``: per tenant, the paired senders and the senders holding a live pairing code."""
    store = _store(request)
    try:
        found = [
            {
                "tenant": tenant,
                "paired": [dataclasses.asdict(p) for p in await store.paired(tenant)],
                "requests": [dataclasses.asdict(r) for r in await store.requests(tenant)],
            }
            for tenant in _tenants(request)
        ]
    except (RedisError, OSError, TimeoutError):
        return error(503, "queue_unavailable", "Redis did not answer in time; retry")
    return web.json_response({"tenants": found}, headers=SECURITY_HEADERS)


async def approve(request: web.Request) -> web.StreamResponse:
    """``POST /console/api/access/approve`` ``{"code", "tenant"?, "role"?}``: pair the sender holding the code."""
    body = await _body(request)
    if body is None:
        return error(400, "malformed_body", f"body must be a JSON object of at most {_BODY_LIMIT} bytes")
    code, role = body.get("code"), body.get("role")
    if not isinstance(code, str) or not code.strip():
        return error(400, "invalid_request", '"code" must be the pairing code the sender was given (ABC-234)')
    if role is not None and role not in ROLES:
        return error(400, "invalid_request", f'"role" must be one of {", ".join(ROLES)}')
    tenants, refused = _chosen_tenant(request, body)
    if refused is not None:
        return refused
    operator = f"console:{request[SIGNIN].operator.name}"
    chosen: Role | None = next((r for r in ROLES if r == role), None)
    try:
        for tenant in tenants:
            paired = await _store(request).approve(tenant, code, operator, chosen)
            if paired is not None:
                logger.info("console: access approve by %s", operator)
                result = {"tenant": tenant, **dataclasses.asdict(paired)}
                return web.json_response({"ok": True, "result": result}, headers=SECURITY_HEADERS)
    except (RedisError, OSError, TimeoutError):
        return error(503, "queue_unavailable", "Redis did not answer in time; retry")
    return error(404, "not_found", "no live pairing code like that (expired, used, or mistyped)")


async def revoke(request: web.Request) -> web.StreamResponse:
    """``POST /console/api/access/revoke`` ``{"principal", "tenant"?}``: unpair a sender."""
    body = await _body(request)
    if body is None:
        return error(400, "malformed_body", f"body must be a JSON object of at most {_BODY_LIMIT} bytes")
    principal = body.get("principal")
    if not isinstance(principal, str) or ":" not in principal:
        return error(400, "invalid_request", '"principal" must be a sender such as telegram:42')
    tenants, refused = _chosen_tenant(request, body)
    if refused is not None:
        return refused
    operator = f"console:{request[SIGNIN].operator.name}"
    try:
        revoked = [tenant for tenant in tenants if await _store(request).revoke(tenant, principal, operator)]
    except (RedisError, OSError, TimeoutError):
        return error(503, "queue_unavailable", "Redis did not answer in time; retry")
    if not revoked:
        return error(404, "not_found", f"{principal} is not paired in your tenants")
    logger.info("console: access revoke by %s", operator)
    return web.json_response({"ok": True, "result": {"tenants": revoked}}, headers=SECURITY_HEADERS)


def add_access_routes(app: web.Application) -> None:
    """Register ``GET /console/api/access`` and ``POST /console/api/access/approve|revoke`` (operators only)."""
    app.router.add_get("/console/api/access", operator_only(access_view))
    app.router.add_post("/console/api/access/approve", acting_only(approve))
    app.router.add_post("/console/api/access/revoke", acting_only(revoke))
