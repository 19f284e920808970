"""A fake Slack Web API and Socket Mode server: a small aiohttp app speaking the real wire format.

It answers the Web API methods the gateway calls, with Slack's shapes and errors, serves the Socket Mode websocket and
``url_private`` files, and records every call. It is stricter than Slack on purpose: malformed mrkdwn is refused, so
a rendering mistake fails a test instead of showing garbled on a real workspace. :class:`FakeSlack` lists its routes.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web

from switchboard.channels.fakes import FakeServer, found_within, wait_for_change
from switchboard.channels.registry import FakePlatform, SampleRequest, Simulation
from switchboard.channels.slack.fake.checks import check_mrkdwn, pings
from switchboard.channels.slack.fake.methods import FAKE_STATE, FakeCall, FakeSlackState, Planned, fail, ok, perform
from switchboard.channels.slack.fake.payloads import (
    BOT_ID,
    BOT_USER_ID,
    TEAM_ID,
    make_block_actions,
    make_event,
    sign,
    sign_request,
)
from switchboard.channels.slack.settings import SlackSettings

__all__ = [
    "BOT_ID",
    "BOT_USER_ID",
    "FAKE_STATE",
    "SIMULATION",
    "TEAM_ID",
    "FakeCall",
    "FakeSlack",
    "FakeSlackState",
    "check_mrkdwn",
    "make_block_actions",
    "make_event",
    "pings",
    "sign",
    "sign_request",
]


async def _params(request: web.Request) -> dict[str, Any]:
    if request.content_type == "application/json":
        body = await request.json()
        return body if isinstance(body, dict) else {}
    form = await request.post()
    return {k: v for k, v in form.items() if isinstance(v, str)}


async def _api(request: web.Request) -> web.Response:
    state = request.app[FAKE_STATE]
    method = request.match_info["method"]
    try:
        params = await _params(request)
    except ValueError:
        state.record(method, {}, 200, "invalid_json")
        return fail("invalid_json")
    token = request.headers.get("Authorization", "").removeprefix("Bearer ")
    expected = state.app_token if method == "apps.connections.open" else state.bot_token
    if expected is not None and token != expected:
        state.record(method, params, 200, "invalid_auth")
        return fail("invalid_auth")
    planned = state.planned(method)
    if planned is not None:
        if planned.delay_s:
            await asyncio.sleep(planned.delay_s)
        if planned.status:
            state.record(method, params, planned.status, planned.error)
            headers = {"Retry-After": f"{planned.retry_after:g}"} if planned.retry_after is not None else None
            return web.json_response({"ok": False, "error": planned.error}, status=planned.status, headers=headers)
    if method == "apps.connections.open":
        response = ok(url=f"{state.base_url.replace('http', 'ws', 1)}/_fake/socket?ticket={secrets.token_hex(4)}")
    else:
        response = perform(state, method, params)
    answer = json.loads(response.body) if isinstance(response.body, bytes) else {}
    state.record(method, params, response.status, None if answer.get("ok") else answer.get("error"))
    return response


async def _upload(request: web.Request) -> web.Response:
    state = request.app[FAKE_STATE]
    upload = state.uploads.get(request.match_info["file_id"])
    if upload is None:
        return web.Response(status=404, text="no such upload")
    content = b""
    if request.content_type.startswith("multipart/"):
        async for part in await request.multipart():
            if isinstance(part, aiohttp.BodyPartReader) and part.name == "file":
                content = bytes(await part.read())
    else:
        content = await request.read()
    if len(content) != upload["length"]:
        return web.Response(status=400, text="length mismatch")
    upload["content"] = content
    return web.Response(text=f"OK - {len(content)}")


async def _file(request: web.Request) -> web.Response:
    state = request.app[FAKE_STATE]
    if state.bot_token is not None and request.headers.get("Authorization") != f"Bearer {state.bot_token}":
        return web.Response(status=200, text="<html>sign in</html>", content_type="text/html")
    found = state.hosted.get(request.match_info["name"])
    if found is None:
        return web.Response(status=404)
    return web.Response(body=found[0], content_type=found[1])


async def _socket(request: web.Request) -> web.WebSocketResponse:
    state = request.app[FAKE_STATE]
    ws = web.WebSocketResponse(heartbeat=30)
    await ws.prepare(request)
    state.sockets.append(ws)
    await ws.send_json({"type": "hello", "num_connections": len(state.sockets), "debug_info": {"host": "fake"}})
    try:
        async for message in ws:
            if message.type == aiohttp.WSMsgType.TEXT:
                data = json.loads(message.data)
                if isinstance(data, dict) and isinstance(data.get("envelope_id"), str):
                    state.acks.append(data["envelope_id"])
                    state._changed.set()
                    state._changed = asyncio.Event()
    finally:
        state.sockets.remove(ws)
    return ws


async def _calls(request: web.Request) -> web.Response:
    state = request.app[FAKE_STATE]
    query = request.query
    try:
        since, wait = int(query.get("since", "0")), min(float(query.get("wait", "0")), 30.0)
    except ValueError:
        return web.json_response({"error": "since must be an integer and wait a number"}, status=400)
    method, channel = query.get("method", "*"), query.get("channel")

    def matching() -> list[FakeCall]:
        return [
            c
            for c in state.calls[since:]
            if (method == "*" or c.method == method)
            and (channel is None or c.params.get("channel", c.params.get("channel_id")) == channel)
        ]

    found = await found_within(matching, lambda: state._changed, wait)
    return web.json_response([c.to_json() for c in found])


async def _messages(request: web.Request) -> web.Response:
    """``GET /_fake/messages?channel=C``: the current text of every message the bot has in a channel, in order.

    Edits are applied; streams show as far as they got.
    """
    state = request.app[FAKE_STATE]
    channel = request.query.get("channel", "")
    found = [(ts, m["text"]) for (c, ts), m in state.messages.items() if c == channel]
    found += [(ts, m["text"]) for (c, ts), m in state.streams.items() if c == channel]
    return web.json_response([{"ts": ts, "text": text} for ts, text in sorted(found)])


def create_fake_slack(bot_token: str | None = None, app_token: str | None = None) -> web.Application:
    """The fake as an aiohttp application (``None`` tokens accept any)."""
    app = web.Application(client_max_size=64 * 2**20)
    app[FAKE_STATE] = FakeSlackState(bot_token=bot_token, app_token=app_token)
    app.router.add_post("/api/{method}", _api)
    app.router.add_post("/_fake/upload/{file_id}", _upload)
    app.router.add_get("/_fake/files/{name}", _file)
    app.router.add_get("/_fake/socket", _socket)
    app.router.add_get("/_fake/calls", _calls)
    app.router.add_get("/_fake/messages", _messages)
    return app


class FakeSlack(FakeServer):
    """Runs the fake on a loopback port; ``api_url`` is the ``SWITCHBOARD_SLACK__API_BASE_URL`` to configure.

    ``POST /api/<method>`` (JSON or form, ``Authorization: Bearer``) answers ``auth.test``, ``chat.postMessage``,
    ``chat.update``, ``chat.startStream`` / ``appendStream`` / ``stopStream``, ``assistant.threads.setStatus``,
    ``files.getUploadURLExternal`` / ``files.completeUploadExternal`` (the bytes go to ``/_fake/upload/<id>``),
    ``conversations.info`` and ``apps.connections.open`` (with the app token) in Slack's shapes, with its errors:
    ``invalid_auth``, ``channel_not_found``, ``msg_too_long`` (over 40,000 characters), ``invalid_blocks`` (section
    text over 3,000, a button label over 75, a value over 2,000, an ``action_id`` over 255 or repeated, over 25
    elements or 50 blocks), ``message_not_found``, ``message_not_in_streaming_state``. It is stricter than Slack in
    one way, on purpose: text that is not well-formed mrkdwn (a bare ``&`` or ``<``, an unclosed code fence) is refused
    with ``invalid_mrkdwn``, so a rendering mistake fails a test instead of showing garbled on a real workspace. Every
    call is recorded with the mentions in it that would notify someone (:attr:`FakeCall.pings`).

    ``/_fake/socket`` is the Socket Mode websocket ``apps.connections.open`` points at: it says ``hello``,
    :meth:`FakeSlack.push` sends envelopes down every open socket, acknowledgements are recorded
    (:attr:`FakeSlackState.acks`) and :meth:`FakeSlack.disconnect` asks clients to reconnect. Files for
    ``url_private`` downloads are served (with the bot token) from ``/_fake/files/<name>``.

    Failure injection: :meth:`FakeSlack.fail_next` (429 with ``Retry-After``), :meth:`FakeSlack.refuse_next` (any
    status and error, e.g. 500), :meth:`FakeSlack.slow_next` (answers after a delay). Inspection for ``simulate`` and
    the benchmarks: ``GET /_fake/calls?since=&channel=&method=&wait=`` and ``GET /_fake/messages?channel=`` (each
    message's current text).
    """

    def __init__(self, bot_token: str | None = None, app_token: str | None = None) -> None:
        self.app = create_fake_slack(bot_token, app_token)
        self.state = self.app[FAKE_STATE]

    @property
    def api_url(self) -> str:
        """The Web API root (with its trailing slash)."""
        return f"{self.base_url}/api/"

    @property
    def calls(self) -> list[FakeCall]:
        """Every call received, in order."""
        return self.state.calls

    def sent(self, method: str = "chat.postMessage", channel: str | None = None) -> list[FakeCall]:
        """Successful calls of ``method``, optionally into one channel."""
        return self.state.sent(method, channel)

    def fail_next(self, count: int, *, retry_after: float = 1, method: str | None = None) -> None:
        """Answer ``count`` calls (of ``method``, or any) with 429, ``Retry-After`` and ``ratelimited``."""
        self.state.plan.extend(Planned(method, 429, "ratelimited", retry_after) for _ in range(count))

    def refuse_next(self, count: int, *, error: str, status: int = 200, method: str | None = None) -> None:
        """Answer ``count`` calls (of ``method``, or any) with ``status`` and ``{"ok": false, "error": error}``."""
        self.state.plan.extend(Planned(method, status, error) for _ in range(count))

    def slow_next(self, count: int, *, delay_s: float, method: str | None = None) -> None:
        """Answer ``count`` calls (of ``method``, or any) normally, after ``delay_s`` seconds."""
        self.state.plan.extend(Planned(method, 0, "", delay_s=delay_s) for _ in range(count))

    def host_file(self, name: str, content: bytes, mime_type: str = "application/octet-stream") -> str:
        """Serve ``content`` for download with the bot token; returns its ``url_private``."""
        self.state.hosted[name] = (content, mime_type)
        return f"{self.base_url}/_fake/files/{name}"

    async def push(self, kind: str, payload: dict[str, Any], *, envelope_id: str | None = None) -> str:
        """Send one Socket Mode envelope down every open socket; returns its ``envelope_id``."""
        envelope_id = envelope_id or secrets.token_hex(8)
        envelope = {
            "envelope_id": envelope_id,
            "type": kind,
            "payload": payload,
            "accepts_response_payload": False,
            "retry_attempt": 0,
            "retry_reason": "",
        }
        for ws in list(self.state.sockets):
            await ws.send_json(envelope)
        return envelope_id

    async def disconnect(self, reason: str = "refresh_requested") -> None:
        """Ask every Socket Mode client to reconnect."""
        for ws in list(self.state.sockets):
            await ws.send_json({"type": "disconnect", "reason": reason})

    async def wait_for(self, predicate: Any, within_s: float = 5.0) -> None:
        """Wait until ``predicate()`` holds (after calls or acks arrive)."""
        await wait_for_change(predicate, lambda: self.state._changed, within_s)

    def serving(self, host: str, port: int) -> None:  # noqa: D102
        self.state.base_url = self.base_url

    async def closing(self) -> None:
        """Close open sockets."""
        for ws in list(self.state.sockets):
            await ws.close()


# ---------------------------------------------------------------- switchboard run / simulate


async def _sim_start(settings: SlackSettings) -> tuple[SlackSettings, FakePlatform]:
    fake = FakeSlack()
    await fake.start()
    block = SlackSettings(
        bot_token="xoxb-fake-" + secrets.token_hex(8),
        signing_secret=secrets.token_hex(16),
        api_base_url=fake.api_url,
    )
    return block, fake


def _sim_details(settings: SlackSettings) -> dict[str, str]:
    secret = settings.signing_secret.get_secret_value() if settings.signing_secret else ""
    return {"fake_url": settings.api_base_url.removesuffix("/api/"), "signing_secret": secret}


def _sim_request(details: Mapping[str, str], text: str) -> SampleRequest:
    channel = "D" + secrets.token_hex(5).upper()
    body, headers = sign_request(make_event(text, channel=channel), details["signing_secret"])
    return SampleRequest(body=body, headers=headers, conversation=channel)


async def _sim_replies(http: aiohttp.ClientSession, details: Mapping[str, str], conversation: str) -> list[str]:
    url = f"{details['fake_url'].rstrip('/')}/_fake/messages"
    async with http.get(url, params={"channel": conversation}) as resp:
        messages = await resp.json()
    return [str(m["text"]) for m in messages]


SIMULATION: Simulation[SlackSettings] = Simulation(
    start=_sim_start, details=_sim_details, request=_sim_request, replies=_sim_replies
)
"""How ``switchboard run`` fakes Slack without credentials, and how ``switchboard simulate slack`` talks to it."""
