"""Property: no request to any public route gets a 5xx or an unhandled-exception log, whatever it carries.

The real app (web chat and a Telegram account, so both kinds of route are live) with real Redis, served by the
production server stack (:class:`~switchboard.web.server.GuardedAppRunner`), driven through the aiohttp test client
for well-formed HTTP with arbitrary content, and over a raw socket for bytes no client library would send
(non-UTF-8 header values, control characters, odd methods and targets).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import ClientTimeout
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.web_runner import BaseRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from switchboard.channels.telegram.fake.platform import FakeTelegram, make_update
from switchboard.settings import HttpSettings, load_settings
from switchboard.web.app import create_app
from switchboard.web.server import GuardedAppRunner

SECRET = "fuzz_secret-123"
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
    derandomize=True,
)
TIMEOUT = ClientTimeout(total=10)
"""A guard against a hanging request (one would fail the test), not a timing assertion."""


@pytest.fixture
async def fake_tg() -> AsyncIterator[FakeTelegram]:
    fake = FakeTelegram(token="42:fuzz")
    await fake.start()
    yield fake
    await fake.stop()


class _ProductionServer(TestServer):
    """The test server, on the runner ``switchboard web`` uses."""

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        return GuardedAppRunner(self.app, HttpSettings(), **kwargs)


@pytest.fixture
async def client(base_env: dict[str, str], fake_tg: FakeTelegram, aiohttp_client: Any) -> TestClient[Any, Any]:
    env = base_env | {
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": "42:fuzz",
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": fake_tg.base_url,
    }
    return await aiohttp_client(_ProductionServer(create_app(load_settings(env))))  # type: ignore[no-any-return]


def _route_templates(client: TestClient[Any, Any]) -> list[str]:
    """Every path the app serves, placeholders and all (so routes added later are fuzzed too)."""
    found = {r.canonical for r in client.app.router.resources()}
    assert {"/", "/api/chat/sessions", "/api/chat/messages", "/webhooks/{channel}", "/healthz", "/metrics"} <= found
    return sorted(found)


def _fill(template: str, values: list[str]) -> str:
    parts = []
    for part in template.split("/"):
        if part.startswith("{") and values:
            part = values.pop()
        parts.append(part)
    return "/".join(parts)


_path_piece = st.one_of(
    st.sampled_from(["telegram", "web", "chat.js", "index.html", "..", "%2e%2e", "default", "x" * 300]),
    st.text(st.characters(codec="utf-8", exclude_characters="/?#"), min_size=1, max_size=40),
)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
_body = st.one_of(
    st.none(),
    st.binary(max_size=2_000),
    _json.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"text": _json}, optional={"client_id": _json, "agent": _json}).map(
        lambda v: json.dumps(v).encode()
    ),
    st.integers(1, 100_000).map(lambda n: b"[" * n),
    st.builds(lambda u: json.dumps(make_update(u, chat_id=7, update_id=9)).encode(), st.text(max_size=30)),
)
_header_text = st.text(st.characters(codec="latin-1", exclude_categories=("Cc",)), max_size=60)


@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "HEAD"]),
    route=st.integers(0, 1_000),
    pieces=st.lists(_path_piece, min_size=2, max_size=2),
    query=st.dictionaries(st.sampled_from(["token", "ticket", "hub.mode", "hub.challenge", "x"]), st.text(max_size=40)),
    body=_body,
    auth=st.one_of(st.none(), st.just("valid"), _header_text, _header_text.map(lambda t: "Bearer " + t)),
    extra=st.dictionaries(
        st.sampled_from(
            ["Content-Type", "Last-Event-ID", "X-Telegram-Bot-Api-Secret-Token", "X-Forwarded-For", "Origin"]
        ),
        st.one_of(_header_text, st.just(SECRET)),
        max_size=3,
    ),
)
@example(  # found in the wild: a nesting bomb behind a valid token
    method="POST", route=-1, pieces=["", ""], query={}, body=b"[" * 2_000, auth="valid", extra={}
).via("issue #6")
@example(method="POST", route=-2, pieces=["", ""], query={}, body=b"[" * 100_000, auth=None, extra={}).via("issue #6")
async def test_no_request_gets_a_5xx(
    client: TestClient[Any, Any],
    caplog: pytest.LogCaptureFixture,
    method: str,
    route: int,
    pieces: list[str],
    query: dict[str, str],
    body: bytes | None,
    auth: str | None,
    extra: dict[str, str],
) -> None:
    templates = _route_templates(client)
    pinned = {-1: "/api/chat/messages", -2: "/api/chat/sessions"}
    path = pinned.get(route) or _fill(templates[route % len(templates)], list(pieces))
    headers = dict(extra)
    if auth == "valid":
        session = await client.post("/api/chat/sessions")
        headers["Authorization"] = f"Bearer {(await session.json())['token']}"
    elif auth is not None:
        headers["Authorization"] = auth
    caplog.clear()
    async with client.request(
        method, path, params=query, data=body, headers=headers, timeout=TIMEOUT, allow_redirects=False
    ) as resp:
        assert resp.status < 500, (method, path, resp.status, await resp.read() if resp.status >= 500 else b"")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


_token = st.binary(min_size=1, max_size=12).filter(lambda b: not any(c in b for c in b" \r\n\t\x00"))
_raw_value = st.binary(max_size=80).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
_raw_bearer = _raw_value.map(lambda b: b"Bearer " + b)


@FUZZ
@given(
    method=st.one_of(st.sampled_from([b"GET", b"POST", b"DELETE"]), _token),
    target=st.one_of(
        st.sampled_from([b"/", b"/api/chat/messages", b"/api/chat/sessions", b"/webhooks/telegram", b"/metrics"]),
        _token.map(lambda b: b"/" + b),
    ),
    headers=st.lists(
        st.tuples(st.sampled_from([b"Authorization", b"Content-Type", b"X-Any"]), _raw_value | _raw_bearer), max_size=4
    ),
    body=st.binary(max_size=200),
)
@example(  # found in the wild: a raw non-UTF-8 byte in the bearer token
    method=b"POST", target=b"/api/chat/messages", headers=[(b"Authorization", b"Bearer \xff\xfe")], body=b"{}"
).via("issue #6")
async def test_no_raw_request_gets_a_5xx(
    client: TestClient[Any, Any],
    caplog: pytest.LogCaptureFixture,
    method: bytes,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> None:
    lines = [method + b" " + target + b" HTTP/1.1", b"Host: fuzz", b"Connection: close"]
    lines += [name + b": " + value for name, value in headers]
    lines.append(b"Content-Length: " + str(len(body)).encode())
    caplog.clear()
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    try:
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        await writer.drain()
        async with asyncio.timeout(10):
            status_line = await reader.readline()
    finally:
        writer.close()
    assert status_line.startswith(b"HTTP/1.")
    assert int(status_line.split()[1]) < 500, (lines, status_line)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
