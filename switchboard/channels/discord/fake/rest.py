"""The fake Discord REST API's handlers and state (served by :mod:`switchboard.channels.discord.fake.platform`)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from switchboard.channels.discord.fake.payloads import snowflake

__all__ = ["FakeCall", "FakeDiscordApi", "FakeDiscordState"]

MAX_CONTENT = 2000
_NONCE_WINDOW_S = 300
_LOADING = 1 << 7


@dataclass(slots=True)
class FakeCall:
    """One request the fake received."""

    seq: int
    method: str
    route: str
    """The route template (``POST /channels/{channel_id}/messages``)."""
    body: dict[str, Any]
    status: int
    channel_id: str | None = None
    token: str | None = None
    """The interaction token of a webhook route."""
    files: list[tuple[str, int]] = field(default_factory=list)
    """``(filename, bytes)`` of uploaded files."""
    deduplicated: bool = False
    """A repeated ``nonce``: Discord answered with the existing message."""
    message_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The call as served by ``/_fake/calls``."""
        return {
            "seq": self.seq,
            "method": self.method,
            "route": self.route,
            "body": self.body,
            "status": self.status,
            "channel_id": self.channel_id,
            "token": self.token,
            "deduplicated": self.deduplicated,
            "message_id": self.message_id,
        }


@dataclass(slots=True)
class _Planned:
    route: str | None
    status: int
    retry_after: float = 0.0
    is_global: bool = False
    delay: float = 0.0
    skip: int = 0


@dataclass
class FakeDiscordState:
    """What the fake remembers."""

    token: str | None
    bot: dict[str, Any]
    application: dict[str, Any]
    calls: list[FakeCall] = field(default_factory=list)
    messages: dict[str, dict[str, Any]] = field(default_factory=dict)
    interactions: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Token → ``{"channel_id", "original"}`` (the ``@original`` message id, once there is one)."""
    commands: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    plan: list[_Planned] = field(default_factory=list)
    bucket_limit: int = 50
    bucket_window: float = 1.0
    gateway_url: str = ""
    _buckets: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    _nonces: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def fail_next(
        self, count: int, *, retry_after: float = 1.0, route: str | None = None, is_global: bool = False, after: int = 0
    ) -> None:
        """Answer ``count`` calls (whose route contains ``route``, or any) with 429, after ``after`` got through."""
        self.plan += [_Planned(route, 429, retry_after, is_global, skip=after if i == 0 else 0) for i in range(count)]

    def refuse_next(self, count: int, *, status: int = 500, route: str | None = None) -> None:
        """Answer the next ``count`` calls (of ``route``, or any) with ``status``."""
        self.plan += [_Planned(route, status) for _ in range(count)]

    def slow_next(self, count: int, *, delay: float, route: str | None = None) -> None:
        """Answer the next ``count`` calls (of ``route``, or any) normally, after ``delay`` seconds."""
        self.plan += [_Planned(route, 200, delay=delay) for _ in range(count)]

    def interaction(self, token: str, channel_id: str, *, original: str | None = None) -> None:
        """Tell the fake about an interaction: its channel and the message its ``@original`` is (a click's)."""
        self.interactions[token] = {"channel_id": channel_id, "original": original}

    def add_file(self, name: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        """Serve ``data`` at ``/_fake/cdn/{name}``; returns the path."""
        self.files[name] = (data, content_type)
        return f"/_fake/cdn/{name}"

    def sent(self, channel_id: str | None = None) -> list[dict[str, Any]]:
        """Messages the fake holds (created and not deduplicated), in order, optionally of one channel."""
        return [m for m in self.messages.values() if channel_id is None or m["channel_id"] == channel_id]

    def _planned(self, route: str) -> _Planned | None:
        for index, planned in enumerate(self.plan):
            if planned.route is None or planned.route in route:
                if planned.skip:
                    planned.skip -= 1
                    return None
                return self.plan.pop(index)
        return None


def _json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """JSON with ``Content-Type: application/json`` exactly, as Discord sends it (no ``charset``)."""
    return web.Response(
        body=json.dumps(data).encode(), status=status, headers={**(headers or {}), "Content-Type": "application/json"}
    )


_COMMAND_NAME = re.compile(r"^[-_a-z0-9]{1,32}$")


def _command_problem(body: Any) -> str:
    """What Discord refuses in a bulk overwrite of commands (``""``: nothing).

    At most 100, unique names of 1-32 lower-case characters, descriptions of 1-100, ``default_member_permissions`` a
    string of digits.
    """
    if not isinstance(body, list) or len(body) > 100:
        return "a list of at most 100 commands"
    names = [c.get("name") for c in body if isinstance(c, dict)]
    if len(names) != len(body) or len(set(names)) != len(names):
        return "command names must be unique"
    for command in body:
        if not _COMMAND_NAME.match(str(command.get("name", ""))):
            return f"name {command.get('name')!r} is invalid"
        if not 1 <= len(str(command.get("description", ""))) <= 100:
            return f"{command['name']}: description must be 1-100 characters"
        rights = command.get("default_member_permissions")
        if rights is not None and not (isinstance(rights, str) and rights.isdigit()):
            return f"{command['name']}: default_member_permissions must be a string of digits"
    return ""


def _error(status: int, message: str, code: int = 0, headers: Mapping[str, str] | None = None) -> web.Response:
    return _json({"message": message, "code": code}, status=status, headers=headers)


def _check_components(rows: Any) -> str | None:
    if not isinstance(rows, list) or len(rows) > 5:
        return "components: at most 5 action rows"
    seen: set[str] = set()
    for row in rows:
        buttons = row.get("components") if isinstance(row, dict) else None
        if row.get("type") != 1 or not isinstance(buttons, list) or not 1 <= len(buttons) <= 5:
            return "components: an action row holds 1 to 5 buttons"
        for button in buttons:
            custom_id, label = str(button.get("custom_id") or ""), str(button.get("label") or "")
            if not 1 <= len(custom_id) <= 100 or custom_id in seen:
                return "components: custom_id must be 1-100 characters and unique"
            if len(label) > 80:
                return "components: label must be at most 80 characters"
            seen.add(custom_id)
    return None


def _check_message(body: dict[str, Any], has_files: bool) -> str | None:
    content = body.get("content")
    if content is not None and not isinstance(content, str):
        return "content: must be a string"
    if content is not None and len(content) > MAX_CONTENT:
        return "content: Must be 2000 or fewer in length."
    nonce = body.get("nonce")
    if nonce is not None and len(str(nonce)) > 25:
        return "nonce: Must be 25 or fewer in length."
    if "components" in body and (problem := _check_components(body["components"])):
        return problem
    if not (content or "").strip() and not body.get("components") and not has_files:
        return "Cannot send an empty message"
    return None


class FakeDiscordApi:
    """The REST handlers (every route under ``/api/v10``)."""

    def __init__(self, state: FakeDiscordState) -> None:
        self.state = state

    def _bucket_headers(self, route: str, major: str) -> dict[str, str]:
        now = time.monotonic()
        used, reset_at = self.state._buckets.get((route, major), (0, now + self.state.bucket_window))
        if now >= reset_at:
            used, reset_at = 0, now + self.state.bucket_window
        used += 1
        self.state._buckets[(route, major)] = (used, reset_at)
        remaining = self.state.bucket_limit - used
        return {
            "X-RateLimit-Limit": str(self.state.bucket_limit),
            "X-RateLimit-Remaining": str(max(remaining, 0)),
            "X-RateLimit-Reset-After": f"{max(reset_at - now, 0.001):.3f}",
            "X-RateLimit-Bucket": f"bucket-{abs(hash(route)) % 10**8}",
            "_over": "1" if remaining < 0 else "",
        }

    def _record(self, call: FakeCall) -> FakeCall:
        self.state.calls.append(call)
        self.state._changed.set()
        self.state._changed = asyncio.Event()
        return call

    def _message(self, channel_id: str, body: dict[str, Any], files: list[tuple[str, int]]) -> dict[str, Any]:
        message_id = snowflake()
        message: dict[str, Any] = {
            "id": message_id,
            "type": 0,
            "channel_id": channel_id,
            "author": self.state.bot,
            "content": body.get("content") or "",
            "components": body.get("components") or [],
            "attachments": [{"id": snowflake(), "filename": name, "size": size} for name, size in files],
            "nonce": body.get("nonce"),
            "flags": int(body.get("flags") or 0),
            "timestamp": "2026-12-01T12:00:00.000000+00:00",
        }
        self.state.messages[message_id] = message
        return message

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Answer one REST request."""
        path = request.match_info["path"]
        method = request.method
        route, params = _route(method, path)
        if route is None:
            return _error(404, "404: Not Found")
        if "wait" in request.query:
            params["wait"] = request.query["wait"]
        authed = not route.split(" ", 1)[1].startswith(("/webhooks/", "/interactions/"))
        if (
            authed
            and self.state.token is not None
            and request.headers.get("Authorization") != f"Bot {self.state.token}"
        ):
            return _error(401, "401: Unauthorized")
        body, files = await _body(request)
        major = params.get("channel_id") or params.get("token") or ""
        headers = self._bucket_headers(route, major)
        channel = params.get("channel_id") or self._channel_of(params.get("token"))
        call = FakeCall(len(self.state.calls) + 1, method, route, body, 200, channel, params.get("token"), files)
        over = headers.pop("_over")
        planned = self.state._planned(route)
        if planned is not None and planned.delay:
            await asyncio.sleep(planned.delay)
        if over or (planned is not None and planned.status == 429):
            retry = planned.retry_after if planned is not None else float(headers["X-RateLimit-Reset-After"])
            is_global = planned.is_global if planned is not None else False
            headers |= {
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset-After": f"{retry:.3f}",
                "Retry-After": str(retry),
            }
            headers |= {"X-RateLimit-Scope": "global" if is_global else "user"}
            if is_global:
                headers["X-RateLimit-Global"] = "true"
            call.status = 429
            self._record(call)
            answer = {"message": "You are being rate limited.", "retry_after": retry, "global": is_global}
            return _json(answer, status=429, headers=headers)
        if planned is not None and planned.status >= 400:
            call.status = planned.status
            self._record(call)
            return _error(planned.status, f"{planned.status}: injected failure", headers=headers)
        response = self._perform(route, params, body, files, call)
        call.status = response.status
        self._record(call)
        response.headers.update(headers)
        return response

    def _channel_of(self, token: str | None) -> str | None:
        if token is None:
            return None
        known = self.state.interactions.get(token)
        if known is not None:
            return str(known["channel_id"])
        return token[4:] if token.startswith("sim-") else "0"

    def _perform(
        self, route: str, params: dict[str, str], body: dict[str, Any], files: list[tuple[str, int]], call: FakeCall
    ) -> web.Response:
        state = self.state
        match route:
            case "GET /users/@me":
                return _json(state.bot)
            case "GET /applications/@me" | "GET /oauth2/applications/@me":
                return _json(state.application)
            case "GET /gateway/bot":
                start = {"total": 1000, "remaining": 999, "reset_after": 0, "max_concurrency": 1}
                return _json({"url": state.gateway_url, "shards": 1, "session_start_limit": start})
            case "PUT /applications/{application_id}/commands":
                problem = _command_problem(body)
                if problem:
                    return _error(400, f"Invalid Form Body: {problem}", 50035)
                state.commands = body if isinstance(body, list) else []
                return _json([{**c, "id": snowflake()} for c in state.commands])
            case "POST /channels/{channel_id}/typing":
                return web.Response(status=204)
            case "POST /interactions/{interaction_id}/{token}/callback":
                token = params["token"]
                if token not in state.interactions:
                    state.interaction(token, call.channel_id or "0")
                return web.Response(status=204)
            case "POST /channels/{channel_id}/messages" | "POST /webhooks/{application_id}/{token}":
                return self._create(route, params, body, files, call)
            case (
                "PATCH /channels/{channel_id}/messages/{message_id}"
                | "PATCH /webhooks/{application_id}/{token}/messages/{message_id}"
            ):
                return self._edit(params, body, call)
            case "GET /webhooks/{application_id}/{token}/messages/{message_id}":
                message = state.messages.get(self._resolve(params, call))
                return _json(message) if message else _error(404, "Unknown Message", 10008)
        return _error(404, "404: Not Found")

    def _resolve(self, params: dict[str, str], call: FakeCall) -> str:
        """The message id a webhook route names (``@original`` made on first use: a deferred response)."""
        if params.get("message_id") != "@original":
            return params.get("message_id", "")
        token = params["token"]
        known = self.state.interactions.setdefault(token, {"channel_id": call.channel_id or "0", "original": None})
        if known["original"] is None:
            placeholder = self._message(str(known["channel_id"]), {"content": "", "flags": _LOADING}, [])
            known["original"] = placeholder["id"]
        return str(known["original"])

    def _create(
        self, route: str, params: dict[str, str], body: dict[str, Any], files: list[tuple[str, int]], call: FakeCall
    ) -> web.Response:
        if problem := _check_message(body, bool(files)):
            return _error(400, f"Invalid Form Body: {problem}", 50035)
        channel = call.channel_id or "0"
        nonce = body.get("nonce")
        if nonce is not None and body.get("enforce_nonce") and route.startswith("POST /channels"):
            known = self.state._nonces.get((channel, str(nonce)))
            if known is not None and time.monotonic() - known[1] < _NONCE_WINDOW_S:
                call.deduplicated, call.message_id = True, known[0]
                return _json(self.state.messages[known[0]])
        message = self._message(channel, body, files)
        call.message_id = message["id"]
        if nonce is not None and body.get("enforce_nonce"):
            self.state._nonces[(channel, str(nonce))] = (message["id"], time.monotonic())
        if route.startswith("POST /webhooks") and params.get("wait") != "true":
            return web.Response(status=204)
        return _json(message)

    def _edit(self, params: dict[str, str], body: dict[str, Any], call: FakeCall) -> web.Response:
        message_id = self._resolve(params, call) if "token" in params else params["message_id"]
        message = self.state.messages.get(message_id)
        if message is None or ("channel_id" in params and message["channel_id"] != params["channel_id"]):
            return _error(404, "Unknown Message", 10008)
        merged = {"content": body.get("content", message["content"]), "components": body.get("components")}
        if problem := _check_message({k: v for k, v in merged.items() if v is not None}, bool(message["attachments"])):
            return _error(400, f"Invalid Form Body: {problem}", 50035)
        message["content"] = merged["content"]
        message["flags"] = int(message["flags"]) & ~_LOADING
        if body.get("components") is not None:
            message["components"] = body["components"]
        call.message_id = message_id
        return _json(message)


_ROUTES = [
    "GET /users/@me",
    "GET /applications/@me",
    "GET /oauth2/applications/@me",
    "GET /gateway/bot",
    "PUT /applications/{application_id}/commands",
    "POST /channels/{channel_id}/typing",
    "POST /channels/{channel_id}/messages",
    "PATCH /channels/{channel_id}/messages/{message_id}",
    "POST /interactions/{interaction_id}/{token}/callback",
    "GET /webhooks/{application_id}/{token}/messages/{message_id}",
    "PATCH /webhooks/{application_id}/{token}/messages/{message_id}",
    "POST /webhooks/{application_id}/{token}",
]


def _route(method: str, path: str) -> tuple[str | None, dict[str, str]]:
    given = [p for p in path.strip("/").split("/") if p]
    for route in _ROUTES:
        verb, template = route.split(" ", 1)
        parts = template.strip("/").split("/")
        if verb != method or len(parts) != len(given):
            continue
        params: dict[str, str] = {}
        for want, got in zip(parts, given, strict=True):
            if want.startswith("{"):
                params[want[1:-1]] = got
            elif want != got:
                break
        else:
            return route, params
    return None, {}


async def _body(request: web.Request) -> tuple[Any, list[tuple[str, int]]]:
    files: list[tuple[str, int]] = []
    if request.content_type.startswith("multipart/"):
        body: Any = {}
        async for part in await request.multipart():
            if not isinstance(part, aiohttp.BodyPartReader):
                continue
            data = await part.read()
            if part.name == "payload_json":
                body = json.loads(data)
            elif part.filename:
                files.append((part.filename, len(data)))
        return body, files
    raw = await request.read()
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {"_invalid": raw[:200].decode(errors="replace")}
    return body, files
