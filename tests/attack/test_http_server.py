"""Hostile HTTP against the web tier's server: slow bodies, compressed bodies, slow heads.

A slow-body client cut off by the body timeout leaves one summary line, not a traceback each (an attacker could
otherwise fill the logs with one cheap connection per line). The head deadline is one lazily re-armed timer per
connection: a fast request is never cut by a stale timer, and every slow head gets its own full deadline.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import random
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from switchboard.settings import HttpSettings
from switchboard.web.server import GuardedAppRunner

GUARD_S = 10.0
"""Only a guard against a hanging test."""


@pytest.fixture
async def reading_server() -> AsyncIterator[tuple[GuardedAppRunner, int, asyncio.Event]]:
    handled = asyncio.Event()

    async def read(request: web.Request) -> web.Response:
        try:
            return web.Response(body=await request.read())
        finally:
            handled.set()

    app = web.Application()
    app.router.add_post("/read", read)
    runner = GuardedAppRunner(app, HttpSettings(header_timeout_s=0.2, body_timeout_s=0.2), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield runner, runner.addresses[0][1], handled
    await runner.cleanup()


@pytest.mark.parametrize("how", ["body timeout", "client hangs up"])
async def test_a_body_cut_short_logs_no_traceback(
    reading_server: tuple[GuardedAppRunner, int, asyncio.Event], caplog: pytest.LogCaptureFixture, how: str
) -> None:
    runner, port, handled = reading_server
    caplog.set_level(logging.DEBUG)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
    await writer.drain()
    async with asyncio.timeout(GUARD_S):
        if how == "client hangs up":
            await asyncio.sleep(0.05)
            writer.close()
        else:
            assert await reader.read() == b""  # closed by the server
            writer.close()
        await handled.wait()  # the handler's read has failed and aiohttp has handled that
    assert [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []
    if how == "body timeout":
        assert runner.guard.total["slow_body"] == 1


async def test_a_compressed_body_is_never_inflated() -> None:
    """A gzip bomb is passed on as the bytes that were sent, never inflated on the event loop.

    Before, aiohttp inflated ``Content-Encoding: gzip`` request bodies as they arrived: four 486 KB bombs held
    ``/healthz`` up for 1.6 s (4 ms idle). Nothing Switchboard serves takes compressed bodies (Telegram sends
    plain JSON), so the compressed bytes now reach the handler as they are (and fail its JSON parsing: a 400).
    """

    async def size(request: web.Request) -> web.Response:
        return web.Response(text=str(len(await request.read())))

    app = web.Application()
    app.router.add_post("/size", size)
    runner = GuardedAppRunner(app, HttpSettings(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    bomb = gzip.compress(b"a" * 20_000_000, compresslevel=9)  # 20 MB inflated, ~20 KB sent
    try:
        async with aiohttp.ClientSession() as http, asyncio.timeout(GUARD_S):
            url = f"http://127.0.0.1:{runner.addresses[0][1]}/size"
            async with http.post(url, data=bomb, headers={"Content-Encoding": "gzip"}) as resp:
                status, text = resp.status, await resp.text()
    finally:
        await runner.cleanup()
    assert (status, text) == (200, str(len(bomb)))  # before: 413, the body inflated past the 1 MiB cap


TOKEN, BOT_ID, BOT, SECRET = "123456:TEST-token-abcdefghijklmnopqrstuv", 123456, "hostile_bot", "hostile-Secret_1"
# ── the head deadline: one lazily re-armed timer per connection ─────────────────────────────────────


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _echo(request: web.Request) -> web.Response:
    return web.Response(text=str(len(await request.read())))


@pytest.fixture
async def server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[GuardedAppRunner, int, float]]:
    timeout = getattr(request, "param", 0.4)
    app = web.Application()
    app.router.add_get("/", _ok)
    app.router.add_post("/echo", _echo)
    http = HttpSettings(header_timeout_s=timeout, body_timeout_s=timeout, max_connections=200)
    runner = GuardedAppRunner(app, http, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield runner, runner.addresses[0][1], timeout
    await runner.cleanup()


GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


async def answer(reader: asyncio.StreamReader) -> bytes:
    async with asyncio.timeout(GUARD_S):
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        return await reader.readexactly(length)


async def closed_no_sooner_than(reader: asyncio.StreamReader, started: float, timeout: float) -> None:
    """The server closes the connection, and not before ``timeout`` after ``started`` (loop time)."""
    async with asyncio.timeout(GUARD_S):
        assert await reader.read() == b""
    assert asyncio.get_running_loop().time() - started >= timeout - 0.01, "a head was cut before its own deadline"


def now() -> float:
    return asyncio.get_running_loop().time()


async def test_pipelined_requests_then_idle_keep_alive_are_served_and_no_slow_head(
    server: tuple[GuardedAppRunner, int, float],
) -> None:
    runner, port, timeout = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(3):  # 40 heads, past aiohttp's queue of 32 (the rest is parsed as it drains), and a short POST
        writer.write(GET * 40 + b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        assert [await answer(reader) for _ in range(41)] == [b"ok"] * 40 + [b"3"]
        await asyncio.sleep(timeout * 2.5)  # idle past the head deadline: keep-alive rules, no slow head
    writer.close()
    assert runner.guard.total["slow_headers"] == 0


async def test_fast_requests_at_every_phase_of_a_stale_timer_are_never_cut(
    server: tuple[GuardedAppRunner, int, float],
) -> None:
    runner, port, timeout = server
    rng = random.Random(5)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(GET)  # the first head is timed from the connection's opening: send it at once
    assert await answer(reader) == b"ok"
    post = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab"
    for n in range(12):  # heads split 0.5 T apart or sent byte by byte, at a random phase of the earlier timers
        await asyncio.sleep(rng.uniform(0, timeout * 1.2))
        sent = GET if n % 2 else post
        if n % 4 == 3:
            for byte in sent:  # 27 bytes 5 ms apart
                writer.write(bytes([byte]))
                await asyncio.sleep(0.005)
        else:
            writer.write(sent[:7])
            await asyncio.sleep(timeout * 0.5)
            writer.write(sent[7:])
        assert await answer(reader) == (b"ok" if n % 2 else b"2")
    writer.close()
    assert runner.guard.total["slow_headers"] == 0


@pytest.mark.parametrize("offset", [-0.03, 0.0, 0.03])
async def test_a_slow_head_starting_as_the_first_timer_fires_gets_its_own_full_deadline(
    server: tuple[GuardedAppRunner, int, float], offset: float
) -> None:
    runner, port, timeout = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    opened = now()
    writer.write(GET)
    assert await answer(reader) == b"ok"
    await asyncio.sleep(max(0.0, opened + timeout + offset - now()))
    started = now()
    writer.write(b"GET / HT")
    await asyncio.sleep(timeout * 0.5)
    writer.write(b"TP/1.1\r\nHost")  # bytes keep coming, the head never ends
    await closed_no_sooner_than(reader, started, timeout)
    writer.close()
    assert runner.guard.total["slow_headers"] == 1


async def test_many_slow_heads_after_fast_requests_are_each_closed_on_their_own_deadline(
    server: tuple[GuardedAppRunner, int, float],
) -> None:
    runner, port, timeout = server

    async def one(n: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(n % 5 * 4 + 1):  # 1 to 17 fast kept-alive requests first
            writer.write(GET)
            assert await answer(reader) == b"ok"
        await asyncio.sleep(n % 7 * timeout / 5)
        started = now()
        writer.write(b"GET /")
        await closed_no_sooner_than(reader, started, timeout)
        writer.close()

    await asyncio.gather(*(one(n) for n in range(25)))
    assert runner.guard.total["slow_headers"] == 25


@pytest.mark.parametrize("how", ["body in a second packet", "large body in one write"])
async def test_a_connection_idle_after_a_body_that_took_several_reads_is_no_slow_head(
    server: tuple[GuardedAppRunner, int, float], how: str
) -> None:
    """Bytes that complete a body are no head: the kept-alive connection idle after it is not closed as a slow head
    (as it was ``header_timeout_s`` after the body, also before this round)."""
    runner, port, timeout = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b"abcd" if how.startswith("body") else b"x" * 300_000
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body))
    if how.startswith("body"):
        await writer.drain()
        await asyncio.sleep(0.05)
    writer.write(body)
    assert await answer(reader) == str(len(body)).encode()
    await asyncio.sleep(timeout * 2.5)  # a webhook sender's pooled connection, idle between updates
    assert runner.guard.total["slow_headers"] == 0
    writer.write(GET)
    assert await answer(reader) == b"ok"
    writer.close()


async def test_a_partial_head_pipelined_behind_a_full_one_is_closed_as_a_slow_head(
    server: tuple[GuardedAppRunner, int, float],
) -> None:
    """A partial head sent in the same packet behind a complete one (which has no body) is timed as a head (before
    this round it stayed open until the keep-alive timeout)."""
    runner, port, timeout = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = now()
    writer.write(GET + b"GET / HT")
    assert await answer(reader) == b"ok"
    try:
        async with asyncio.timeout(timeout + 1.5):
            assert await reader.read() == b""
    except TimeoutError:
        pytest.fail(f"a partial pipelined head was still open {now() - started:.1f} s later (timeout {timeout} s)")
    finally:
        writer.close()
    assert runner.guard.total["slow_headers"] == 1
