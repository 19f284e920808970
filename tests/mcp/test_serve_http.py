"""``/mcp`` under a real web tier, with real worker processes, the offline model and a real SDK client over HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from mcp.types import CallToolResult

from switchboard.core.messages import session_key
from switchboard.queue.drafts import DraftStore
from switchboard.queue.eventlog import decode_entries
from switchboard.queue.keys import SessionKeys
from switchboard.settings import load_settings
from tests.chaos.harness import Gateway, WorkerPool
from tests.mcp.serving import (
    DESK,
    INTRUDER,
    clients,
    gateways,
    http_session,
    pools,
    serve_env,
    served,
    text_of,
    workers,
)
from tests.shardindexes import count_of

pytestmark = [pytest.mark.timeout(120)]
_fixtures = (clients, gateways, pools, serve_env)


async def test_a_client_asks_its_tenants_agents_and_continues_a_conversation(
    serve_env: dict[str, str],
    clients: None,
    gateways: Callable[[dict[str, str]], Gateway],
    pools: Callable[[dict[str, str], int], WorkerPool],
    async_redis: aioredis.Redis,
) -> None:
    url = await served(gateways, serve_env)
    await workers(pools, serve_env)
    async with http_session(url, DESK) as session:
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert listed == {"ask_assistant", "ask_helper", "propose_agent"}  # no draft, no other tenant's agent
        first = await session.call_tool("ask_helper", {"message": "where is order 1042?"})
        assert isinstance(first, CallToolResult) and not first.is_error, first
        assert 'You said: "where is order 1042?"' in text_of(first)
        assert first.structured_content is not None
        conversation = first.structured_content["conversation"]
        again = await session.call_tool("ask_helper", {"message": "and 1043?", "conversation": conversation})
        assert isinstance(again, CallToolResult) and not again.is_error, again
        assert 'You said: "and 1043?"' in text_of(again)
        assert again.structured_content is not None and again.structured_content["conversation"] == conversation
    session_id = session_key("default", "helper", "web", "default", f"mcp-desk-{conversation}")
    entries: Any = await async_redis.xrange(SessionKeys(session_id).events)
    kinds = [entry["kind"] for entry in decode_entries(entries)]
    assert kinds.count("run_started") == 2, kinds  # two real turns, in one session of the client's tenant


async def test_another_tenants_client_never_sees_or_reaches_these_agents(
    serve_env: dict[str, str], clients: None, gateways: Callable[[dict[str, str]], Gateway]
) -> None:
    url = await served(gateways, serve_env)
    async with http_session(url, INTRUDER) as session:
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert listed == {"ask_rival", "propose_agent"}
        refused = await session.call_tool("ask_helper", {"message": "hello"})
        assert isinstance(refused, CallToolResult) and refused.is_error
        assert "ask_helper" in text_of(refused)
        proposed = await session.call_tool("propose_agent", {"name": "rival_two", "instructions": "Be brief."})
        assert isinstance(proposed, CallToolResult) and not proposed.is_error
    async with http_session(url, DESK) as session:  # this tenant's client never sees the other tenant's draft
        assert "ask_rival" not in {tool.name for tool in (await session.list_tools()).tools}


@pytest.mark.parametrize(
    ("headers", "body", "status", "code"),
    [
        ({}, b"{}", 401, "unauthenticated"),
        ({"Authorization": "Bearer sb_not-a-client-token"}, b"{}", 401, "unauthenticated"),
        ({"Authorization": "Basic ZGVzazp4"}, b"{}", 401, "unauthenticated"),
        ({"Authorization": f"Bearer {DESK}"}, b"x" * (256 * 1024 + 1), 413, "too_large"),
    ],
)
async def test_refusals_are_clear_and_never_500(
    serve_env: dict[str, str],
    clients: None,
    gateways: Callable[[dict[str, str]], Gateway],
    headers: dict[str, str],
    body: bytes,
    status: int,
    code: str,
) -> None:
    url = await served(gateways, serve_env)
    sent = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers}
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=sent) as resp:
        answer: Any = await resp.json()
        assert resp.status == status, answer
        assert answer["error"]["code"] == code
        if status == 401:
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")


async def test_a_malformed_body_of_a_valid_client_is_400(
    serve_env: dict[str, str], clients: None, gateways: Callable[[dict[str, str]], Gateway]
) -> None:
    url = await served(gateways, serve_env)
    sent = {
        "Authorization": f"Bearer {DESK}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    async with aiohttp.ClientSession() as http:
        for body in (b"{not json", b'{"jsonrpc": "2.0", "method": 42}', b"[]"):
            async with http.post(url, data=body, headers=sent) as resp:
                assert resp.status == 400, (body, resp.status, await resp.text())


async def test_a_proposed_agent_is_a_draft_nobody_reaches_until_its_owner_accepts_it(
    serve_env: dict[str, str],
    clients: None,
    gateways: Callable[[dict[str, str]], Gateway],
    async_redis: aioredis.Redis,
) -> None:
    url = await served(gateways, serve_env)
    async with http_session(url, DESK) as session:
        proposed = await session.call_tool(
            "propose_agent",
            {"name": "scout", "instructions": "You scout for deals.", "description": "Finds deals.", "tools": []},
        )
        assert isinstance(proposed, CallToolResult) and not proposed.is_error, proposed
        assert "draft" in text_of(proposed)
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert "ask_scout" not in listed
        unreachable = await session.call_tool("ask_scout", {"message": "hi"})
        assert isinstance(unreachable, CallToolResult) and unreachable.is_error
        bad = await session.call_tool("propose_agent", {"name": "Scout!", "instructions": "x"})
        assert isinstance(bad, CallToolResult) and bad.is_error
        taken = await session.call_tool("propose_agent", {"name": "helper", "instructions": "x"})
        assert isinstance(taken, CallToolResult) and taken.is_error and "exists" in text_of(taken)
        unknown_tool = await session.call_tool("propose_agent", {"name": "x1", "instructions": "x", "tools": ["rm"]})
        assert isinstance(unknown_tool, CallToolResult) and unknown_tool.is_error
    drafts = DraftStore(async_redis)
    assert [d.agent.name for d in await drafts.all("default")] == ["scout"]
    assert await drafts.all("other") == []
    assert "scout" not in load_settings(serve_env).file.agents
    chat = url.removesuffix("/mcp") + "/api/chat/sessions"
    async with aiohttp.ClientSession() as http, http.post(chat, json={"agent": "scout"}) as resp:
        assert resp.status == 403  # the web chat may not start it either


async def test_text_that_is_not_unicode_is_400_and_queues_nothing(
    serve_env: dict[str, str], clients: None, gateways: Callable[[dict[str, str]], Gateway], async_redis: aioredis.Redis
) -> None:
    url = await served(gateways, serve_env)
    call = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "ask_helper", "arguments": '
    body = call + b'{"message": "bad \\ud800 text"}}}'
    sent = {
        "Authorization": f"Bearer {DESK}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18",
    }
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=sent) as resp:
        answer: Any = await resp.json()
    assert resp.status == 400, answer  # a lone surrogate never reaches the agent
    assert answer["error"]["code"] == -32700, answer
    assert await count_of(async_redis, lambda s: s.sessions) == 0


async def test_other_methods_than_post_are_405_and_need_a_token_first(
    serve_env: dict[str, str], clients: None, gateways: Callable[[dict[str, str]], Gateway]
) -> None:
    url = await served(gateways, serve_env)
    headers = {"Authorization": f"Bearer {DESK}", "Accept": "application/json, text/event-stream"}
    async with aiohttp.ClientSession() as http:
        for method in ("GET", "DELETE"):
            async with http.request(method, url, headers=headers) as resp:
                assert resp.status == 405 and resp.headers["Allow"] == "POST", (method, resp.status)
        async with http.get(url) as resp:
            assert resp.status == 401
