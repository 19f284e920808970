"""Shared fixtures: a real Redis-compatible server the suite starts itself, flushed per test."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.web_runner import BaseRunner

from switchboard.queue.embedded import EmbeddedRedis
from switchboard.settings import HttpSettings
from switchboard.web.server import GuardedAppRunner

MINIMAL_CONFIG = """
default_agent: assistant
agents:
  assistant:
    profile: {name: Assistant}
    instructions: You are a test assistant.
    tools: [current_time]
"""


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """One private server for the whole run (AOF on, loopback port and unix socket)."""
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), port=0)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    """The server's URL, with the database flushed before the test."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture
def sync_redis(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
async def async_redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def base_env(redis_url: str, tmp_path: Path) -> dict[str, str]:
    """A clean environment for a gateway under test: real Redis, a private data dir, a minimal YAML file."""
    config = tmp_path / "switchboard.yaml"
    config.write_text(MINIMAL_CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "OPENAI_", "ANTHROPIC_"))}
    env.update(
        {
            "SWITCHBOARD_REDIS_URL": redis_url,
            "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
            "SWITCHBOARD_CONFIG": str(config),
        }
    )
    return env


class GuardedTestServer(TestServer):
    """aiohttp's test server, serving its app through the gateway's own runner (``switchboard web``'s server path)."""

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        return GuardedAppRunner(self.app, HttpSettings(), **kwargs)


@pytest.fixture
def aiohttp_client(aiohttp_client: Any) -> Any:
    """pytest-aiohttp's ``aiohttp_client``; an app given to it is served as ``switchboard web`` serves it.

    So every route test goes through :class:`~switchboard.web.server.GuardedAppRunner`: its guards, its direct webhook
    routes and their fixed answers, not only aiohttp's plain runner.
    """

    async def make(app: Any, **kwargs: Any) -> Any:
        if isinstance(app, web.Application):
            app = GuardedTestServer(app)
        return await aiohttp_client(app, **kwargs)

    return make
