"""The console's scheduled jobs: list, create, remove and run now, within the operator's tenants.

========================================== ==================================================================
``GET /console/api/schedules[?session=K]``  ``{"schedules": [job…]}`` (each with ``next_at``, ``last_outcome``,
                                             ``last_reason``: why its last occurrence was not delivered)
``POST /console/api/schedules``             a job (``docs/schedules.md``) → 201 ``{"ok": true, "result": job}``
``POST /console/api/schedules/remove``      ``{"id"}`` → 200
``POST /console/api/schedules/run-now``     ``{"id"}`` → 200 ``{"ok": true, "result": {"outcome", "job"}}``
========================================== ==================================================================

Errors as the rest of the console API: ``400`` malformed or refused (nothing stored), ``403`` another tenant's,
``404`` unknown, ``409`` the id is taken, ``503`` Redis.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import web
from pydantic import ValidationError
from redis.exceptions import RedisError

from switchboard.control import OperatorScope
from switchboard.control.scope import is_text
from switchboard.core.schedules import ScheduleSpec
from switchboard.errors import QueueUnavailableError
from switchboard.queue import schedules
from switchboard.types import SessionKey
from switchboard.web.appkeys import REDIS, SETTINGS
from switchboard.web.console.routes import SECURITY_HEADERS, SIGNIN, acting_only, error, operator_only

__all__ = ["add_schedule_routes"]

logger = logging.getLogger(__name__)

_BODY_LIMIT: Final = 16 * 1024
_UNAVAILABLE: Final = (QueueUnavailableError, RedisError, OSError, TimeoutError)


def _scope(request: web.Request) -> OperatorScope:
    signin = request[SIGNIN]
    return OperatorScope(operator=f"console:{signin.operator.name}", tenants=frozenset(signin.operator.tenants))


def _sees(scope: OperatorScope, tenant: str) -> bool:
    return scope.unrestricted or tenant in scope.tenants


def _json(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, headers=SECURITY_HEADERS)


def _unavailable(err: Exception) -> web.Response:
    logger.warning("console: Redis did not answer (%s)", type(err).__name__)
    return error(503, "queue_unavailable", "Redis did not answer in time; retry")


async def _body(request: web.Request) -> dict[str, Any] | web.Response:
    raw = await request.content.read(_BODY_LIMIT + 1)
    if len(raw) > _BODY_LIMIT:
        return error(413, "body_too_large", f"body over {_BODY_LIMIT} bytes")
    try:
        body: Any = json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict):
        return error(400, "malformed_body", "body must be a JSON object")
    return body


async def list_schedules(request: web.Request) -> web.StreamResponse:
    """``GET /console/api/schedules``: the jobs of the operator's tenants (or of one session)."""
    scope = _scope(request)
    session = request.query.get("session") or None
    if session is not None and not is_text(session):
        return error(400, "invalid_request", "not a session key")
    try:
        views = await schedules.list_jobs(request.app[REDIS], session=SessionKey(session) if session else None)
    except _UNAVAILABLE as err:
        return _unavailable(err)
    return _json({"schedules": [v.as_dict() for v in views if _sees(scope, v.spec.tenant)]})


async def create_schedule(request: web.Request) -> web.StreamResponse:
    """``POST /console/api/schedules``: store a job made by the operator."""
    body = await _body(request)
    if isinstance(body, web.Response):
        return body
    settings = request.app[SETTINGS]
    scope = _scope(request)
    body = {"tenant": settings.file.tenant, **body, "created_by": scope.operator}
    target = body.get("target")
    if isinstance(target, dict) and not target.get("agent"):
        body["target"] = {**target, "agent": settings.file.default_agent}
    try:
        spec = ScheduleSpec.model_validate(body)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'job'}: {e['msg']}" for e in err.errors())
        return error(400, "invalid_request", f"not a valid job: {problems}")
    if not _sees(scope, spec.tenant):
        return error(403, "out_of_scope", f"tenant {spec.tenant!r} is not one of yours")
    try:
        view = await schedules.create_job(request.app[REDIS], spec, per_session=settings.queue.schedules_per_session)
    except schedules.JobExistsError as err:
        return error(409, "exists", str(err))
    except ValueError as err:
        return error(400, "invalid_request", str(err))
    except _UNAVAILABLE as err:
        return _unavailable(err)
    logger.info("console: schedule %s created by %s", spec.id, scope.operator)
    return _json({"ok": True, "result": view.as_dict()}, status=201)


def _by_id(act: Callable[[web.Request, str], Awaitable[Any]]) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        job_id = body.get("id")
        if not isinstance(job_id, str) or not job_id:
            return error(400, "invalid_request", '"id" must be a non-empty string')
        scope = _scope(request)
        try:
            view = await schedules.get_job(request.app[REDIS], job_id)
            if view is None or not _sees(scope, view.spec.tenant):  # another tenant's job is not said to exist
                return error(404, "not_found", f"no scheduled job {job_id[:64]!r}")
            result = await act(request, job_id)
        except _UNAVAILABLE as err:
            return _unavailable(err)
        logger.info("console: %s of schedule %s by %s", request.path.rsplit("/", 1)[-1], job_id, scope.operator)
        return _json({"ok": True, "result": result})

    return handler


async def _remove(request: web.Request, job_id: str) -> dict[str, Any]:
    return {"removed": await schedules.remove_job(request.app[REDIS], job_id)}


async def _run_now(request: web.Request, job_id: str) -> dict[str, Any]:
    redis = request.app[REDIS]
    outcome = await schedules.run_now(redis, request.app[SETTINGS].queue, job_id)
    view = await schedules.get_job(redis, job_id)
    return {"outcome": outcome, "job": view.as_dict() if view is not None else None}


def add_schedule_routes(app: web.Application) -> None:
    """Register the schedule routes on ``app`` (which must carry SETTINGS and REDIS)."""
    app.router.add_get("/console/api/schedules", operator_only(list_schedules))
    app.router.add_post("/console/api/schedules", acting_only(create_schedule))
    app.router.add_post("/console/api/schedules/remove", acting_only(_by_id(_remove)))
    app.router.add_post("/console/api/schedules/run-now", acting_only(_by_id(_run_now)))
