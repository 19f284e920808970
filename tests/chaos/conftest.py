"""Fixtures of the chaos tests: the fake Telegram, a worker pool and the web tier, all torn down on failure too."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from switchboard.channels.telegram.fake.platform import FakeTelegram

from .harness import BOT_TOKEN, Gateway, WorkerPool


class _DroppedConnections(logging.Filter):
    """Hides aiohttp's tracebacks for requests whose client (a worker) was SIGKILLed mid-request."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], ConnectionResetError))


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    """The fake Bot API, in the test's event loop on a loopback port."""
    server = FakeTelegram(token=BOT_TOKEN)
    quiet = _DroppedConnections()
    logging.getLogger("aiohttp.server").addFilter(quiet)
    await server.start()
    yield server
    await server.stop()
    logging.getLogger("aiohttp.server").removeFilter(quiet)


@pytest.fixture
async def pools(tmp_path: Path) -> AsyncIterator[Callable[[dict[str, str], int], WorkerPool]]:
    """Start worker pools; every process is killed at teardown, whatever happened."""
    started: list[WorkerPool] = []

    def start(env: dict[str, str], count: int) -> WorkerPool:
        pool = WorkerPool(env, count, tmp_path / f"logs-{len(started)}")
        started.append(pool)
        pool.start()
        return pool

    yield start
    for pool in started:
        await pool.close()


@pytest.fixture
async def gateways() -> AsyncIterator[Callable[[dict[str, str]], Gateway]]:
    """Build web tiers (started by the caller with ``await gateway.start()``); closed at teardown."""
    made: list[Gateway] = []

    def build(env: dict[str, str]) -> Gateway:
        gateway = Gateway(env)
        made.append(gateway)
        return gateway

    yield build
    for gateway in made:
        await gateway.close()
