"""The console's review queue: finished runs sampled in production, their transcripts, verdicts, and replay cases.

============================================== =================================================================
``GET /console/api/review``                     ``{"samples": [{run_id, session, tenant, agent, channel, at,
                                                steps, tools, answered, verdict}…], "redacted", "sampling"}`` of
                                                the operator's tenants, newest first
``GET /console/api/review/transcript``          ``?session=KEY``: ``{"session", "redacted", "transcript": [...]}``
``POST /console/api/review/verdict``            ``{"session", "run", "verdict": "pass"|"fail", "note"}`` → 200
``GET /console/api/review/case``                ``?session=KEY&run=RUN``: the replay scenario (YAML, a download)
============================================== =================================================================

Words are withheld from a ``viewer``, and from everyone when ``SWITCHBOARD_EVALS__REDACT`` is set; a replay case holds
the words, so neither may make one here. The case is the one ``switchboard eval record`` writes (the same code).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Final

from aiohttp import web
from redis.exceptions import RedisError

from switchboard.control import ControlError, InvalidRequestError, OutOfScopeError
from switchboard.control.replay import case_yaml
from switchboard.errors import QueueUnavailableError
from switchboard.web.appkeys import SETTINGS
from switchboard.web.console.api import failure, plain, service_of
from switchboard.web.console.routes import SECURITY_HEADERS, SIGNIN, acting_only, error, operator_only

__all__ = ["add_review_routes"]

logger = logging.getLogger(__name__)

_BODY_LIMIT: Final = 8 * 1024
_ERRORS: Final = (ControlError, QueueUnavailableError, RedisError, OSError, TimeoutError)


def _redacted(request: web.Request) -> bool:
    return request.app[SETTINGS].evals.redact or not request[SIGNIN].operator.reads_messages


async def samples(request: web.Request) -> web.StreamResponse:
    """``GET /console/api/review``."""
    service, scope = service_of(request)
    try:
        found = await service.review_samples(scope)
    except _ERRORS as err:
        return failure(err)
    evals = request.app[SETTINGS].evals
    body = {
        "samples": [
            {**sample.model_dump(mode="json"), "verdict": verdict.model_dump(mode="json") if verdict else None}
            for sample, verdict in found
        ],
        "redacted": _redacted(request),
        "sampling": {"rate": evals.sample_rate, "agent_rates": evals.agent_rates, "on": evals.sampling},
    }
    return web.json_response(body, headers=SECURITY_HEADERS)


async def transcript(request: web.Request) -> web.StreamResponse:
    """``GET /console/api/review/transcript?session=KEY``: the run's session, words withheld where they must be."""
    session = request.query.get("session", "")
    if not session:
        return error(400, "malformed_request", "name the session: ?session=<key>")
    service, scope = service_of(request)
    if _redacted(request):
        scope = type(scope)(operator=scope.operator, tenants=scope.tenants, reads_messages=False)
    try:
        lines = await service.transcript(scope, session)
    except _ERRORS as err:
        return failure(err)
    body = {"session": session, "redacted": not scope.reads_messages, "transcript": plain(lines)}
    return web.json_response(body, headers=SECURITY_HEADERS)


async def verdict(request: web.Request) -> web.StreamResponse:
    """``POST /console/api/review/verdict``."""
    raw = await request.content.read(_BODY_LIMIT + 1)
    if len(raw) > _BODY_LIMIT:
        return error(413, "body_too_large", f"body over {_BODY_LIMIT} bytes")
    try:
        body: Any = json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        body = None
    fields = ("session", "run", "verdict")
    if not isinstance(body, dict) or not all(isinstance(body.get(k), str) and body[k] for k in fields):
        return error(400, "malformed_body", 'body must be {"session", "run", "verdict": "pass"|"fail", "note"}')
    note = body.get("note", "")
    service, scope = service_of(request)
    try:
        if not isinstance(note, str):
            raise InvalidRequestError('"note" must be a string')
        judged = await service.judge_run(scope, body["session"], body["run"], body["verdict"], note)
    except _ERRORS as err:
        return failure(err)
    logger.info("console: run %s judged %s by %s", body["run"][:80], judged.verdict, scope.operator)
    return web.json_response({"ok": True, "result": judged.model_dump(mode="json")}, headers=SECURITY_HEADERS)


async def case(request: web.Request) -> web.StreamResponse:
    """``GET /console/api/review/case?session=KEY&run=RUN``: the run as a replay scenario, to download."""
    session, run = request.query.get("session", ""), request.query.get("run") or None
    if not session:
        return error(400, "malformed_request", "name the session: ?session=<key>&run=<run id>")
    if request.app[SETTINGS].evals.redact:
        return error(403, "redacted", "reviews are redacted here: make the case with `switchboard eval record`")
    service, scope = service_of(request)
    try:
        if not scope.reads_messages:
            raise OutOfScopeError("a viewer cannot make a replay case: it holds the conversation's words")
        built = await service.replay_case(scope, session, run_id=run)
    except _ERRORS as err:
        return failure(err)
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", str(built["id"]))
    headers = {
        **SECURITY_HEADERS,
        "Content-Type": "application/yaml; charset=utf-8",
        "Content-Disposition": f'attachment; filename="{name}.yaml"',
    }
    logger.info("console: replay case of %s made by %s", run or "every run", scope.operator)
    return web.Response(text=case_yaml(built), headers=headers)


def add_review_routes(app: web.Application) -> None:
    """Register the review queue's routes on ``app`` (which must carry SETTINGS, REDIS and INGESTOR)."""
    app.router.add_get("/console/api/review", operator_only(samples))
    app.router.add_get("/console/api/review/transcript", operator_only(transcript))
    app.router.add_get("/console/api/review/case", operator_only(case))
    app.router.add_post("/console/api/review/verdict", acting_only(verdict))
