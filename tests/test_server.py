"""Slow clients and connection floods against the web tier's server, over real sockets."""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from switchboard.settings import HttpSettings, load_settings
from switchboard.web.server import ConnectionGuard, GuardedAppRunner

GUARD_S = 10.0
"""Only a guard against a hanging test: every close below is expected well before it."""
HANDLER_S = 0.6


async def _slow(request: web.Request) -> web.Response:
    await asyncio.sleep(HANDLER_S)  # longer than the header timeout: the head has arrived, so it must not count
    return web.Response(text="slow ok")


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _echo(request: web.Request) -> web.Response:
    return web.Response(body=await request.read())


@pytest.fixture
async def server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[GuardedAppRunner, int]]:
    http: HttpSettings = getattr(request, "param", None) or HttpSettings(
        header_timeout_s=0.2, body_timeout_s=0.2, max_connections=50
    )
    app = web.Application()
    app.router.add_get("/", _ok)
    app.router.add_get("/slow", _slow)
    app.router.add_post("/echo", _echo)
    runner = GuardedAppRunner(app, http, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield runner, runner.addresses[0][1]
    await runner.cleanup()


async def _closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    async with asyncio.timeout(GUARD_S):
        return await reader.read()


async def _get(port: int, path: str = "/") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    answer = await _closed_by_server(reader)
    writer.close()
    return answer


async def test_a_half_sent_request_line_is_closed_after_the_header_timeout(
    server: tuple[GuardedAppRunner, int], caplog: pytest.LogCaptureFixture
) -> None:
    runner, port = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HT")
    await writer.drain()
    assert await _closed_by_server(reader) == b""
    writer.close()
    assert runner.guard.total["slow_headers"] == 1


async def test_headers_trickling_in_are_closed_even_while_bytes_keep_coming(
    server: tuple[GuardedAppRunner, int],
) -> None:
    runner, port = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
    closed = asyncio.ensure_future(_closed_by_server(reader))
    async with asyncio.timeout(GUARD_S):
        while not closed.done():
            writer.write(b"X-a: b\r\n")  # one header every 50 ms, never the blank line
            await asyncio.sleep(0.05)
    assert closed.result() == b""
    writer.close()
    assert runner.guard.total["slow_headers"] == 1


@pytest.mark.parametrize(
    "server", [HttpSettings(header_timeout_s=0.6, body_timeout_s=0.6, max_connections=50)], indirect=True
)
async def test_a_slow_head_after_a_served_request_is_timed_from_its_own_first_byte(
    server: tuple[GuardedAppRunner, int],
) -> None:
    """The deadline timer armed when the connection opened fires while the second head is young: it waits on for it."""
    runner, port = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    opened = asyncio.get_running_loop().time()
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    async with asyncio.timeout(GUARD_S):
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        assert await reader.readexactly(2) == b"ok"
    await asyncio.sleep(0.3)
    writer.write(b"GET / HT")  # a second head begins 0.3 s after the first, and never ends
    started = asyncio.get_running_loop().time()
    closed = asyncio.ensure_future(_closed_by_server(reader))
    await asyncio.sleep(max(0.0, opened + 0.6 + 0.15 - asyncio.get_running_loop().time()))
    assert not closed.done(), "closed by the first head's deadline, not its own"
    assert await closed == b""
    assert asyncio.get_running_loop().time() - started >= 0.6
    writer.close()
    assert runner.guard.total["slow_headers"] == 1


async def test_a_body_that_stops_short_is_closed_after_the_body_timeout(
    server: tuple[GuardedAppRunner, int],
) -> None:
    runner, port = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
    await writer.drain()
    assert await _closed_by_server(reader) == b""
    writer.close()
    assert runner.guard.total["slow_body"] == 1


async def test_a_request_that_arrived_in_time_is_answered_however_long_its_handler_takes(
    server: tuple[GuardedAppRunner, int],
) -> None:
    runner, port = server
    answer = await _get(port, "/slow")
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"slow ok")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 4\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.write(b"abcd")  # the body in a second packet, inside its timeout
    answer = await _closed_by_server(reader)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"abcd")
    assert sum(runner.guard.total.values()) == 0


async def test_a_kept_alive_connection_serves_a_second_request(server: tuple[GuardedAppRunner, int]) -> None:
    _, port = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(2):
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(GUARD_S):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            assert await reader.readexactly(2) == b"ok"
        await asyncio.sleep(0.3)  # idle between requests for longer than the header timeout: keep-alive rules
    writer.close()


async def test_a_kept_alive_connection_idle_after_a_posted_body_is_no_slow_head(
    server: tuple[GuardedAppRunner, int],
) -> None:
    """Reading a body makes aiohttp resume its parser with no bytes: that is no further request's first bytes."""
    runner, port = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for body in (b"abcd", b"efgh"):
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n" + body)
        async with asyncio.timeout(GUARD_S):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            assert await reader.readexactly(4) == body
        await asyncio.sleep(0.3)  # idle for longer than the header timeout, as a webhook sender's pooled connection
    writer.close()
    assert runner.guard.total["slow_headers"] == 0


@pytest.mark.parametrize(
    "server", [HttpSettings(header_timeout_s=60, body_timeout_s=60, max_connections=5)], indirect=True
)
async def test_over_the_cap_the_oldest_idle_connections_are_shed_logged_and_service_goes_on(
    server: tuple[GuardedAppRunner, int], caplog: pytest.LogCaptureFixture
) -> None:
    runner, port = server
    caplog.set_level(logging.WARNING, logger="switchboard.web.server")
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    for _ in range(8):  # partial requests that would hold their connection for a minute
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\n")
        await writer.drain()
        idle.append((reader, writer))
        await asyncio.sleep(0.02)
    for reader, _ in idle[:3]:  # the three oldest made room for the newest
        assert await _closed_by_server(reader) == b""
    answer = await _get(port)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok")
    assert runner.guard.total["shed"] >= 4
    assert runner.guard.open_connections <= 5
    shed_lines = [r.getMessage() for r in caplog.records if "over the cap of 5" in r.getMessage()]
    assert len(shed_lines) == 1  # one summary line per interval, not one per connection
    for _, writer in idle:
        writer.close()


def test_the_limits_come_from_the_environment(base_env: dict[str, str]) -> None:
    env = base_env | {"SWITCHBOARD_HTTP__HEADER_TIMEOUT_S": "2.5", "SWITCHBOARD_HTTP__MAX_CONNECTIONS": "7"}
    http = load_settings(env).http
    assert (http.header_timeout_s, http.body_timeout_s, http.max_connections) == (2.5, 30.0, 7)


def test_the_cap_stays_inside_the_file_descriptor_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    assert ConnectionGuard(HttpSettings(max_connections=10_000)).max_connections == 1024 - 256
    assert ConnectionGuard(HttpSettings(max_connections=100)).max_connections == 100
