"""The console's budgets and people: period spend and alerts, linked identities, and linking by an operator.

========================================= ====================================================================
``GET /console/api/budgets``               ``{"budgets": [BudgetView…], "alerts": [BudgetAlertView…],
                                           "agents": [AgentFigures…], "tools": [ToolFigures…],
                                           "runs": [RunFigures…]}``
``GET /console/api/people``                ``{"people": [PersonView…]}``
``POST /console/api/people/link``          ``{"tenant", "principals": [...], "person"}`` → 200 ``person_linked``
``POST /console/api/people/unlink``        ``{"tenant", "principal"}`` → 200 ``person_unlinked``
========================================= ====================================================================

Every route is for a signed-in operator (writes with the CSRF header) and sees only the operator's tenants; a bad
body is a ``400`` that changed nothing, another tenant's a ``403``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Final

from aiohttp import web
from redis.exceptions import RedisError

from switchboard.control import ControlError, InvalidRequestError, NotFoundError, OperatorScope, OutOfScopeError
from switchboard.control.identity import link_people, unlink_person
from switchboard.control.reading import budget_views, people_views
from switchboard.core.events import EventAdapter, PersonLinked, PersonUnlinked
from switchboard.queue.segments import OTHER, Segments, quantile, read_segments
from switchboard.web.appkeys import REDIS, SETTINGS
from switchboard.web.console.routes import SECURITY_HEADERS, SIGNIN, acting_only, error, operator_only

__all__ = ["add_budget_routes"]

logger = logging.getLogger(__name__)

_BODY_LIMIT: Final = 16 * 1024


def _scope(request: web.Request) -> OperatorScope:
    signin = request[SIGNIN]
    return OperatorScope(operator=f"console:{signin.operator.name}", tenants=frozenset(signin.operator.tenants))


def _json(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, headers=SECURITY_HEADERS)


def _refused(err: Exception) -> web.Response:
    match err:
        case OutOfScopeError():
            return error(403, "out_of_scope", str(err))
        case NotFoundError():
            return error(404, "not_found", str(err))
        case InvalidRequestError() | ControlError():
            return error(400, "invalid_request", str(err))
        case _:
            logger.warning("console: Redis did not answer (%s)", type(err).__name__)
            return error(503, "queue_unavailable", "Redis did not answer in time; retry")


@dataclasses.dataclass(frozen=True)
class AgentFigures:
    """One agent version's turns in one tenant: how many, how long, what they cost and how many a budget stopped."""

    agent: str
    version: str
    tenant: str
    turns: int
    p50_s: float | None
    p95_s: float | None
    cost_per_task: float | None
    timeouts: int
    stops: int


@dataclasses.dataclass(frozen=True)
class ToolFigures:
    """One agent's calls of one tool in one tenant, by outcome, and the gateway's retries of it."""

    agent: str
    tool: str
    tenant: str
    outcomes: dict[str, int]
    retries: int


@dataclasses.dataclass(frozen=True)
class RunFigures:
    """One agent's runs in one tenant that did not complete: attempts that failed, runs cancelled on request."""

    agent: str
    tenant: str
    failed: int
    cancelled: int


def figures(seg: Segments, scope: OperatorScope) -> tuple[list[AgentFigures], list[ToolFigures], list[RunFigures]]:
    """The segmented figures of the operator's tenants (``other`` sums several tenants: only for one who sees all)."""

    def shown(tenant: str) -> bool:
        return scope.unrestricted if tenant == OTHER else scope.allows(tenant)

    agents = []
    for (agent, version, tenant), (buckets, _) in sorted(seg.turns.items()):
        if not shown(tenant):
            continue
        turns = buckets[-1][1]
        stops = {reason: n for (a, v, t, reason), n in seg.stops.items() if (a, v, t) == (agent, version, tenant)}
        credits = seg.credits.get((agent, version, tenant), 0.0)
        agents.append(
            AgentFigures(
                agent=agent,
                version=version,
                tenant=tenant,
                turns=turns,
                p50_s=quantile(buckets, 0.5),
                p95_s=quantile(buckets, 0.95),
                cost_per_task=round(credits / turns, 6) if turns else None,
                timeouts=stops.get("deadline", 0),
                stops=sum(stops.values()),
            )
        )
    outcomes: dict[tuple[str, str, str], dict[str, int]] = {}
    for (agent, tool, tenant, outcome), n in seg.tools.items():
        if shown(tenant):
            outcomes.setdefault((agent, tool, tenant), {})[outcome] = n
    tools = [
        ToolFigures(agent=a, tool=t, tenant=n, outcomes=found, retries=seg.retries.get((a, t, n), 0))
        for (a, t, n), found in sorted(outcomes.items())
    ]
    ended = sorted({(agent, tenant) for agent, tenant, _ in seg.runs if shown(tenant)})
    runs = [
        RunFigures(
            agent=agent,
            tenant=tenant,
            failed=seg.runs.get((agent, tenant, "failed"), 0),
            cancelled=seg.runs.get((agent, tenant, "cancelled"), 0),
        )
        for agent, tenant in ended
    ]
    return agents, tools, runs


async def budgets(request: web.Request) -> web.StreamResponse:
    """``GET /console/api/budgets``: period spend and alerts, and the figures by agent version, tool and run outcome."""
    scope = _scope(request)
    try:
        rows, alerts = await budget_views(request.app[REDIS], request.app[SETTINGS].file, scope)
        agents, tools, runs = figures(await read_segments(request.app[REDIS]), scope)
    except (ControlError, RedisError, OSError, TimeoutError) as err:
        return _refused(err)
    return _json(
        {
            "budgets": [dataclasses.asdict(r) for r in rows],
            "alerts": [dataclasses.asdict(a) for a in alerts],
            "agents": [dataclasses.asdict(a) for a in agents],
            "tools": [dataclasses.asdict(t) for t in tools],
            "runs": [dataclasses.asdict(r) for r in runs],
        }
    )


async def people(request: web.Request) -> web.StreamResponse:
    """``GET /console/api/people``."""
    try:
        found = await people_views(request.app[REDIS], request.app[SETTINGS].file, _scope(request))
    except (ControlError, RedisError, OSError, TimeoutError) as err:
        return _refused(err)
    return _json({"people": [dataclasses.asdict(p) for p in found]})


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.content.read(_BODY_LIMIT + 1)
    if len(raw) > _BODY_LIMIT:
        raise InvalidRequestError(f"body over {_BODY_LIMIT} bytes")
    try:
        body: Any = json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict):
        raise InvalidRequestError("body must be a JSON object")
    return body


def _string(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f'"{name}" must be a non-empty string')
    return value


def _done(event: PersonLinked | PersonUnlinked) -> web.Response:
    return _json({"ok": True, "result": json.loads(EventAdapter.dump_json(event))})


async def link(request: web.Request) -> web.StreamResponse:
    """``POST /console/api/people/link``."""
    scope = _scope(request)
    try:
        body = await _body(request)
        principals = body.get("principals")
        if not isinstance(principals, list) or not principals or not all(isinstance(p, str) for p in principals):
            raise InvalidRequestError('"principals" must be a list of <channel>:<sender id> strings')
        tenant, person = _string(body, "tenant"), _string(body, "person")
        done = await link_people(request.app[REDIS], scope, tenant, principals, person)
    except (ControlError, RedisError, OSError, TimeoutError) as err:
        return _refused(err)
    logger.info("console: people/link by %s", scope.operator)
    return _done(done)


async def unlink(request: web.Request) -> web.StreamResponse:
    """``POST /console/api/people/unlink``."""
    scope = _scope(request)
    try:
        body = await _body(request)
        done = await unlink_person(request.app[REDIS], scope, _string(body, "tenant"), _string(body, "principal"))
    except (ControlError, RedisError, OSError, TimeoutError) as err:
        return _refused(err)
    logger.info("console: people/unlink by %s", scope.operator)
    return _done(done)


def add_budget_routes(app: web.Application) -> None:
    """Register the budgets and people routes on ``app`` (which must carry SETTINGS and REDIS)."""
    app.router.add_get("/console/api/budgets", operator_only(budgets))
    app.router.add_get("/console/api/people", operator_only(people))
    app.router.add_post("/console/api/people/link", acting_only(link))
    app.router.add_post("/console/api/people/unlink", acting_only(unlink))
