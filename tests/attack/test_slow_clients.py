"""Hostile HTTP against the web tier's server: slow bodies, compressed bodies.

A slow-body client cut off by the server's body timeout leaves one summary line, not a traceback each.

Before, every connection closed for a slow body (or a client that hung up mid-body) made aiohttp log
``ERROR Error handling request`` with a ~20-line ``ConnectionResetError`` traceback from the handler's read: an
attacker could fill the logs with one cheap connection per line.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
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
