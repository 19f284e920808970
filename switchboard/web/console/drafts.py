"""The console's draft agents: what MCP clients proposed, and the owner's accept or reject.

========================================= ====================================================================
``GET /console/api/drafts``                ``{"drafts": [{tenant, name, display_name, description, instructions,
                                           tools, proposed_by, proposed_at}…]}`` of the operator's tenants
``POST /console/api/drafts/accept``        ``{"tenant", "name"}`` → 200 ``{"ok", "result": {"path"}}``
``POST /console/api/drafts/reject``        ``{"tenant", "name"}`` → 200
========================================= ====================================================================

Accepting writes the agent to ``agents.d/<tenant>/<name>.yaml`` beside the YAML file, as ``switchboard agents
accept`` does; processes serve it from their next start. Another tenant's draft is a ``403``, an unknown one a
``404``, a name an agent has already (or a file that cannot be written) a ``409``; each changes nothing.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final

from aiohttp import web
from redis.exceptions import RedisError

from switchboard.core.agent.config import Agent
from switchboard.queue.drafts import AgentDraft, DraftStore
from switchboard.settings.accepted import write_accepted
from switchboard.settings.console import ALL_TENANTS
from switchboard.web.appkeys import REDIS, ROUTER, SETTINGS
from switchboard.web.console.routes import SECURITY_HEADERS, SIGNIN, acting_only, error, operator_only

__all__ = ["add_draft_routes"]

logger = logging.getLogger(__name__)

_BODY_LIMIT: Final = 4 * 1024


def _tenants(request: web.Request) -> list[str]:
    operator = request[SIGNIN].operator
    if ALL_TENANTS not in operator.tenants:
        return sorted(operator.tenants)
    config = request.app[SETTINGS].file
    known = {config.tenant, *config.tenants, *(route.tenant for route in request.app[ROUTER].routes.values())}
    return sorted(known)


def _view(draft: AgentDraft) -> dict[str, Any]:
    agent = draft.agent
    return {
        "tenant": draft.tenant,
        "name": agent.name,
        "display_name": agent.profile.name if agent.profile is not None else agent.name,
        "description": agent.profile.description if agent.profile is not None else "",
        "instructions": agent.instructions,
        "tools": agent.tools,
        "proposed_by": draft.proposed_by,
        "proposed_at": draft.proposed_at,
    }


async def drafts(request: web.Request) -> web.StreamResponse:
    """``GET /console/api/drafts``."""
    store = DraftStore(request.app[REDIS])
    try:
        found = [draft for tenant in _tenants(request) for draft in await store.all(tenant)]
    except (RedisError, OSError, TimeoutError):
        return error(503, "queue_unavailable", "Redis did not answer in time; retry")
    return web.json_response({"drafts": [_view(d) for d in found]}, headers=SECURITY_HEADERS)


async def _target(request: web.Request) -> tuple[str, str] | web.Response:
    raw = await request.content.read(_BODY_LIMIT + 1)
    if len(raw) > _BODY_LIMIT:
        return error(413, "body_too_large", f"body over {_BODY_LIMIT} bytes")
    try:
        body: Any = json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict) or not all(isinstance(body.get(k), str) and body[k] for k in ("tenant", "name")):
        return error(400, "malformed_body", 'body must be {"tenant": "...", "name": "..."}')
    if not request[SIGNIN].operator.sees(body["tenant"]):
        return error(403, "out_of_scope", f"tenant {body['tenant']!r} is not one of yours")
    return body["tenant"], body["name"]


async def accept(request: web.Request) -> web.StreamResponse:
    """``POST /console/api/drafts/accept``."""
    target = await _target(request)
    if isinstance(target, web.Response):
        return target
    tenant, name = target
    settings = request.app[SETTINGS]

    def write(agent: Agent) -> Any:
        if agent.name in settings.file.agents:
            raise ValueError(f"an agent {agent.name!r} exists already: reject the draft, or rename the agent")
        try:
            return write_accepted(settings.config, tenant, agent)
        except OSError as err:
            raise ValueError(f"could not write the agent beside {settings.config}: {err.strerror}") from None

    try:
        path = await DraftStore(request.app[REDIS]).accept(tenant, name, write)
    except LookupError as err:
        return error(404, "not_found", str(err.args[0]))
    except ValueError as err:
        return error(409, "conflict", str(err))
    except (RedisError, OSError, TimeoutError):
        return error(503, "queue_unavailable", "Redis did not answer in time; retry")
    logger.info("console: draft agent %s of tenant %s accepted by %s", name, tenant, request[SIGNIN].operator.name)
    return web.json_response({"ok": True, "result": {"path": str(path)}}, headers=SECURITY_HEADERS)


async def reject(request: web.Request) -> web.StreamResponse:
    """``POST /console/api/drafts/reject``."""
    target = await _target(request)
    if isinstance(target, web.Response):
        return target
    tenant, name = target
    try:
        dropped = await DraftStore(request.app[REDIS]).drop(tenant, name)
    except (RedisError, OSError, TimeoutError):
        return error(503, "queue_unavailable", "Redis did not answer in time; retry")
    if not dropped:
        return error(404, "not_found", f"tenant {tenant!r} has no draft agent {name!r}")
    logger.info("console: draft agent %s of tenant %s rejected by %s", name, tenant, request[SIGNIN].operator.name)
    return web.json_response({"ok": True}, headers=SECURITY_HEADERS)


def add_draft_routes(app: web.Application) -> None:
    """Register the draft agents' routes on ``app`` (which must carry SETTINGS, REDIS and ROUTER)."""
    app.router.add_get("/console/api/drafts", operator_only(drafts))
    app.router.add_post("/console/api/drafts/accept", acting_only(accept))
    app.router.add_post("/console/api/drafts/reject", acting_only(reject))
