"""A slow embeddings server against ``remember``: the gateway's 30-second tool timeout fired first, and a timed-out
write is "ambiguous" (it may have happened, so it is never repeated), although nothing had been written. The tool
bounds its embedding below that and answers a plain "try again later", with nothing stored.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from switchboard.core.memory.embeddings import OpenAIEmbedder
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.core.memory.tools import memory_tools
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.gateway import ToolGateway
from switchboard.settings import FileConfig
from tests.memory.conftest import CONFIG, Memory, Turn, inbound


@pytest.fixture
async def base_url(aiohttp_server: Any) -> AsyncIterator[str]:
    async def embeddings(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({"object": "list", "model": "m", "data": []})

    app = web.Application()
    app.router.add_post("/v1/embeddings", embeddings)
    server = await aiohttp_server(app)
    yield str(server.make_url("/v1"))


async def test_a_slow_embeddings_server_is_a_plain_transient_error_and_nothing_is_kept(
    base_url: str, tmp_path: Path
) -> None:
    embedder = OpenAIEmbedder(model="some-model", dims=4, api_key="k", base_url=base_url, max_retries=0)
    store = SQLiteMemoryStore(tmp_path / "memory")
    connected = FileConfig.model_validate(CONFIG).connected_projects
    tools = [  # the gateway's bound (30 s by default) and the embedding's, both shortened for the test
        dataclasses.replace(tool, timeout_s=3.0)
        for tool in memory_tools(store, connected, embedder=embedder, embed_timeout_s=1.0)
    ]
    memory = Memory(store, ToolGateway(ToolRegistry(tools), workspace_root=tmp_path), tmp_path, [1_800_000_000.0])
    try:
        turn = Turn(inbound=[inbound("Ann prefers email over phone", "m1")])
        args = {"text": "Ann prefers email", "source": {"kind": "message", "quote": "prefers email"}, "project": "shop"}
        outcome = await memory.call("remember", args, turn)
        assert not outcome.ok and outcome.error_class == "transient", outcome
        assert "try again later" in str(outcome.error)
        assert await store.facts("acme", ["shop"]) == [] and turn.events == []
    finally:
        await embedder.aclose()
        store.close()
