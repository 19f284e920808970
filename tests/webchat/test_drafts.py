"""The web chat never serves a draft agent: no session, a clear message, nothing written."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestClient

from switchboard.settings import load_settings
from tests.webchat.conftest import build_app


async def test_a_session_with_a_draft_agent_is_refused(
    base_env: dict[str, str],
    tmp_path: Path,
    app_redis: aioredis.Redis,
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[Any, Any]]],
) -> None:
    config = tmp_path / "draft.yaml"
    config.write_text("default_agent: helper\nagents:\n  helper:\n    instructions: Help.\n")
    settings = load_settings(base_env | {"SWITCHBOARD_CONFIG": str(config)})
    client = await aiohttp_client(build_app(settings, app_redis))
    before = sorted(await app_redis.keys("*"))
    resp = await client.post("/api/chat/sessions")
    assert resp.status == 409
    body = await resp.json()
    assert "agent_not_ready" in str(body) and "not ready yet (draft): it has no profile" in str(body)
    assert sorted(await app_redis.keys("*")) == before
