"""The console's HTTP surface: the page, sign-in and sign-out, and the guard every other route sits behind.

Anonymous requests get ``401`` (JSON) under ``/console/api/`` and a redirect to sign in for pages; every request but
``GET``/``HEAD`` must carry the sign-in's CSRF token. With no operator configured the pages say how to add one and the
API answers ``403``. The data and actions are :mod:`switchboard.web.console.api`'s.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from switchboard.control.scope import is_text
from switchboard.errors import QueueUnavailableError
from switchboard.settings import Settings
from switchboard.web.appkeys import SETTINGS
from switchboard.web.console.auth import (
    CSRF_HEADER,
    Signin,
    Throttle,
    authenticate,
    clear_cookie,
    end_signin,
    set_cookie,
    start_signin,
)
from switchboard.web.console.passwords import MAX_PASSWORD_CHARS, verify_password

__all__ = ["SIGNIN", "STATIC_DIR", "Handler", "acting_only", "add_routes", "error", "operator_only"]

logger = logging.getLogger(__name__)

STATIC_DIR: Final = Path(__file__).parent / "static"
_STATIC_FILES: Final = {
    "console.js": "text/javascript",
    "console.css": "text/css",
    "login.js": "text/javascript",
}
_LOGIN_BODY_LIMIT: Final = 4096
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
SIGNIN: Final = web.RequestKey("console_signin", Signin)
"""``request[SIGNIN]``: the :class:`.auth.Signin` of a request that passed :func:`operator_only`."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON error ``{"ok": false, "error": {"code", "message"}}`` with the console's headers."""
    body = {"ok": False, "error": {"code": code, "message": message}}
    return web.json_response(body, status=status, headers={**SECURITY_HEADERS, **(headers or {})})


def _no_operator() -> str:
    return (
        "no console operator is configured: make a password hash with `switchboard console hash-password` and add "
        "it under console.operators in the YAML file (see /console)"
    )


def _is_api(request: web.Request) -> bool:
    return request.path.startswith("/console/api/")


def operator_only(handler: Handler) -> Handler:
    """Wrap ``handler`` so that it runs only for a signed-in operator (and, for writes, with the CSRF token)."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        settings: Settings = request.app[SETTINGS]
        if not settings.file.console.operators:
            if _is_api(request):
                return error(403, "no_operator", _no_operator())
            return _file("setup.html")
        try:
            signin = await authenticate(request)
        except QueueUnavailableError:
            return error(503, "queue_unavailable", "Redis did not answer in time; retry")
        if signin is None:
            if _is_api(request):
                return error(401, "unauthorized", "sign in at /console/login")
            raise web.HTTPFound("/console/login", headers=SECURITY_HEADERS)
        if request.method not in {"GET", "HEAD"} and not signin.csrf_ok(request.headers.get(CSRF_HEADER)):
            return error(403, "csrf", f"missing or wrong {CSRF_HEADER} header (reload the console)")
        request[SIGNIN] = signin
        response = await handler(request)
        if signin.new_token is not None:
            set_cookie(request, response, signin.new_token)
        return response

    return guarded


def acting_only(handler: Handler) -> Handler:
    """Like :func:`operator_only`, and refuse (``403``) an operator whose role only watches (``viewer``)."""

    async def acting(request: web.Request) -> web.StreamResponse:
        if request[SIGNIN].operator.role != "operator":
            return error(403, "viewer", "a viewer cannot act: ask for the operator role (console.operators[].role)")
        return await handler(request)

    return operator_only(acting)


def _file(name: str, *, content_type: str = "text/html") -> web.StreamResponse:
    headers = {**SECURITY_HEADERS, "Content-Type": f"{content_type}; charset=utf-8"}
    return web.FileResponse(STATIC_DIR / name, headers=headers)


async def page(request: web.Request) -> web.StreamResponse:
    """``GET /console``: the console page."""
    return _file("console.html")


async def slash(request: web.Request) -> web.StreamResponse:
    """``GET /console/``: the console's address has no trailing slash (its pages use absolute paths)."""
    raise web.HTTPMovedPermanently("/console", headers=SECURITY_HEADERS)


async def login_page(request: web.Request) -> web.StreamResponse:
    """``GET /console/login``: the sign-in page (or how to add an operator, when there is none)."""
    if not request.app[SETTINGS].file.console.operators:
        return _file("setup.html")
    return _file("login.html")


async def static(request: web.Request) -> web.StreamResponse:
    """``GET /console/static/{name}``: the pages' scripts and style sheet (a fixed list, nothing else on disk)."""
    name = request.match_info["name"]
    content_type = _STATIC_FILES.get(name)
    if content_type is None:
        raise web.HTTPNotFound()
    return _file(name, content_type=content_type)


async def _credentials(request: web.Request) -> tuple[str, str] | web.Response:
    if request.content_type != "application/json":
        return error(415, "unsupported_media_type", 'send {"name", "password"} as application/json')
    if request.content_length is None or request.content_length > _LOGIN_BODY_LIMIT:
        return error(413, "body_too_large", f"body over {_LOGIN_BODY_LIMIT} bytes (or without a length)")
    try:
        raw: Any = json.loads(await request.read())
    except (ValueError, RecursionError):
        raw = None
    name = raw.get("name") if isinstance(raw, dict) else None
    password = raw.get("password") if isinstance(raw, dict) else None
    if not isinstance(name, str) or not isinstance(password, str) or not is_text(name + password):
        name = password = None
    if not name or not password:
        return error(400, "malformed_body", 'body must be {"name": "<operator>", "password": "<password>"}')
    if len(name) > 64 or len(password) > MAX_PASSWORD_CHARS:
        return error(401, "bad_credentials", "wrong operator name or password")
    return name, password


async def login(request: web.Request) -> web.StreamResponse:
    """``POST /console/login``: check a password (throttled) and start a sign-in."""
    settings: Settings = request.app[SETTINGS]
    if not settings.file.console.operators:
        return error(403, "no_operator", _no_operator())
    parsed = await _credentials(request)
    if isinstance(parsed, web.Response):
        return parsed
    name, password = parsed
    throttle = Throttle(request, name)
    try:
        wait_s = await throttle.admit()
        if wait_s:
            logger.warning("console: sign-in refused, too many failures (operator name or address)")
            return error(
                429, "throttled", f"too many failed sign-ins; retry in {wait_s} s", {"Retry-After": str(wait_s)}
            )
        operator = settings.file.console.operator(name)
        if not await verify_password(operator.password_hash if operator is not None else None, password):
            logger.info("console: a sign-in failed (wrong operator name or password)")
            return error(401, "bad_credentials", "wrong operator name or password")
        assert operator is not None  # a password matched a stored hash
        await throttle.succeeded()
        await end_signin(request)  # the browser's older sign-in, if any, ends here
        signin = await start_signin(request, operator, "password")
    except QueueUnavailableError:
        return error(503, "queue_unavailable", "Redis did not answer in time; retry")
    logger.info("console: operator %s signed in", operator.name)
    response = _me(signin)
    assert signin.new_token is not None
    set_cookie(request, response, signin.new_token)
    return response


def _me(signin: Signin) -> web.Response:
    body = {
        "operator": signin.operator.name,
        "tenants": list(signin.operator.tenants),
        "role": signin.operator.role,
        "csrf": signin.csrf,
        "via": signin.via,
    }
    return web.json_response(body, headers=SECURITY_HEADERS)


async def me(request: web.Request) -> web.StreamResponse:
    """``GET /console/api/me``: who is signed in, their tenants, and the CSRF token for writes."""
    signin: Signin = request[SIGNIN]
    return _me(signin)


async def logout(request: web.Request) -> web.StreamResponse:
    """``POST /console/api/logout``: end the sign-in and clear the cookie."""
    try:
        await end_signin(request)
    except QueueUnavailableError:
        return error(503, "queue_unavailable", "Redis did not answer in time; retry")
    response = web.json_response({"ok": True}, headers=SECURITY_HEADERS)
    clear_cookie(response)
    return response


def add_routes(app: web.Application) -> None:
    """Register the console's page and sign-in on ``app`` (its API: :func:`.api.add_api_routes`)."""
    app.router.add_get("/console", operator_only(page))
    app.router.add_get("/console/", slash)
    app.router.add_get("/console/login", login_page)
    app.router.add_post("/console/login", login)
    app.router.add_get("/console/static/{name}", static)
    app.router.add_get("/console/api/me", operator_only(me))
    app.router.add_post("/console/api/logout", operator_only(logout))
