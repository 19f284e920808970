"""Shared by the ``mcp serve`` tests: two tenants' agents, their clients, a real web tier and real worker processes.

Tenant ``default`` has the web chat, whose sessions may name ``assistant`` and ``helper``; tenant ``other`` has a
Telegram account routed to ``rival``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final

import pytest
import redis.asyncio as aioredis
from mcp.client.session import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.types import CallToolResult, TextContent

from switchboard.queue.mcpclients import McpClientStore
from switchboard.web.api.tokens import new_token, token_hash
from tests.chaos import conftest as chaos
from tests.chaos.harness import Gateway, WorkerPool

gateways, pools = chaos.gateways, chaos.pools

CONFIG: Final = """
default_agent: assistant
agents:
  assistant:
    profile: {name: Assistant}
    instructions: You are a test assistant.
    tools: [current_time]
  helper:
    profile: {name: Helper, description: Answers questions about orders.}
    instructions: You help with orders.
    tools: [current_time]
  rival:
    profile: {name: Rival}
    instructions: You are the other tenant's agent.
    tools: []
channels:
  web: {agents: [assistant, helper]}
  telegram: {tenant: other, agent: rival, send_rate: 0, chat_send_rate: 0}
"""

DESK: Final = new_token()
"""Client ``desk`` of tenant ``default``."""
INTRUDER: Final = new_token()
"""Client ``intruder`` of tenant ``other``."""


@pytest.fixture
def serve_env(base_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "serve.yaml"
    config.write_text(CONFIG)
    return base_env | {
        "SWITCHBOARD_CONFIG": str(config),
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": "42:serve",
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": "http://127.0.0.1:9",
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": "serve-secret",
        "SWITCHBOARD_QUEUE__LEASE_MS": "2000",
        "SWITCHBOARD_MCP_SERVE__WAIT_S": "60",
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
async def clients(async_redis: aioredis.Redis) -> None:
    store = McpClientStore(async_redis)
    await store.add("default", "desk", token_hash(DESK))
    await store.add("other", "intruder", token_hash(INTRUDER))


@contextlib.asynccontextmanager
async def http_session(url: str, token: str) -> AsyncIterator[ClientSession]:
    """A real SDK client session on ``url`` (``/mcp``) with a bearer token."""
    async with (
        create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http,
        streamable_http_client(url, http_client=http) as streams,
        ClientSession(*streams[:2]) as session,
    ):
        await session.initialize()
        yield session


async def served(gateways: Callable[[dict[str, str]], Gateway], env: dict[str, str]) -> str:
    """Start a real web tier on ``env``; returns its ``/mcp`` URL."""
    return await gateways(env).start() + "/mcp"


async def workers(pools: Callable[[dict[str, str], int], WorkerPool], env: dict[str, str]) -> WorkerPool:
    """One real worker process on ``env``, listening."""
    pool = pools(env, 1)
    await pool.ready()
    return pool


def text_of(result: Any) -> str:
    """The text of a tool result's content blocks."""
    assert isinstance(result, CallToolResult), result
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))
