"""Hostile input on the web chat API: a clear 4xx, one short log line at most, nothing written, nothing echoed."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.queue.keys import GlobalKeys
from switchboard.settings import load_settings
from switchboard.web.webchat import access

from .conftest import Chat, build_app

TWO_AGENTS = (
    "agents:\n"
    "  assistant: {profile: {name: A}, instructions: be brief}\n"
    "  analyst: {profile: {name: B}, instructions: write programs}\n"
    "channels:\n"
    "  web: {agent: assistant}\n"
)


def _no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    assert [r for r in caplog.records if r.exc_info] == []
    assert len(caplog.records) <= 1


# ---- nesting bombs ----


@pytest.mark.parametrize("depth", [2_000, 100_000])
async def test_a_nesting_bomb_on_messages_is_400_without_a_traceback(
    chat: Chat, caplog: pytest.LogCaptureFixture, depth: int
) -> None:
    _, token = await chat.new_session()
    before = await chat.snapshot()
    caplog.clear()
    resp = await chat.post(token, b"[" * depth, headers={"Content-Type": "application/json"})
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == "malformed_body"
    _no_tracebacks(caplog)
    assert await chat.snapshot() == before


async def test_a_nesting_bomb_inside_the_text_object_is_400(chat: Chat) -> None:
    _, token = await chat.new_session()
    resp = await chat.post(token, b'{"text": "hi", "x": ' + b"[" * 3_000 + b"]" * 3_000 + b"}")
    assert resp.status == 400


async def test_a_nesting_bomb_on_sessions_is_400_without_a_traceback(
    chat: Chat, caplog: pytest.LogCaptureFixture
) -> None:
    resp = await chat.client.post("/api/chat/sessions", data=b"[" * 2_000)
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == "malformed_body"
    _no_tracebacks(caplog)
    assert await chat.snapshot() == {}


# ---- raw bytes in Authorization ----


async def _raw_request(chat: Chat, request: bytes) -> bytes:
    """Send bytes no HTTP client library would produce; the whole answer (the server closes after it)."""
    server = chat.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(request)
    await writer.drain()
    async with asyncio.timeout(10):
        answer = await reader.read()
    writer.close()
    return answer


@pytest.mark.parametrize(
    "route",
    [b"POST /api/chat/messages", b"DELETE /api/chat/sessions"],
)
@pytest.mark.parametrize("value", [b"Bearer \xff\xfe", b"Bearer abc\xe9def", b"\xff"])
async def test_a_non_utf8_authorization_header_is_401(
    chat: Chat, caplog: pytest.LogCaptureFixture, route: bytes, value: bytes
) -> None:
    body = b'{"text": "hi"}'
    answer = await _raw_request(
        chat,
        route + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
        b"Authorization: " + value + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body,
    )
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    _no_tracebacks(caplog)
    assert await chat.snapshot() == {}


# ---- which agent a web chat may start ----


async def test_the_web_chat_may_not_start_an_agent_its_channel_does_not_allow(
    aiohttp_client: Any, base_env: dict[str, str], tmp_path: Path, app_redis: aioredis.Redis
) -> None:
    config = tmp_path / "switchboard.yaml"
    config.write_text(TWO_AGENTS)
    settings = load_settings({**base_env, "SWITCHBOARD_CONFIG": str(config)})
    client = await aiohttp_client(build_app(settings, app_redis))
    resp = await client.post("/api/chat/sessions", json={"agent": "analyst"})
    assert resp.status == 403
    error = (await resp.json())["error"]
    assert error["code"] == "agent_not_allowed"
    assert "analyst" in error["message"] and "allowed: assistant" in error["message"]
    assert await app_redis.keys("*") == []
    assert (await client.post("/api/chat/sessions", json={"agent": "assistant"})).status == 201


async def test_an_operator_may_allow_more_agents(
    aiohttp_client: Any, base_env: dict[str, str], tmp_path: Path, app_redis: aioredis.Redis
) -> None:
    config = tmp_path / "switchboard.yaml"
    config.write_text(
        TWO_AGENTS.replace("web: {agent: assistant}", "web: {agent: assistant, agents: [assistant, analyst]}")
    )
    settings = load_settings({**base_env, "SWITCHBOARD_CONFIG": str(config)})
    client = await aiohttp_client(build_app(settings, app_redis))
    resp = await client.post("/api/chat/sessions", json={"agent": "analyst"})
    assert resp.status == 201
    key = await app_redis.get(GlobalKeys().web_token(access.hash_token((await resp.json())["token"])))
    assert key is not None and key.decode().startswith("default/analyst/web/")


# ---- tokens: not cached by intermediaries, revocable ----


async def test_session_creation_is_not_stored_by_caches(chat: Chat) -> None:
    resp = await chat.client.post("/api/chat/sessions")
    assert resp.status == 201
    assert resp.headers["Cache-Control"] == "no-store"


async def test_a_revoked_token_is_refused_at_once(chat: Chat) -> None:
    _, token = await chat.new_session()
    await chat.send(token, "hello")  # the token is now in this process's cache too
    auth = {"Authorization": f"Bearer {token}"}
    resp = await chat.client.delete("/api/chat/sessions", headers=auth)
    assert resp.status == 204
    assert resp.headers["Cache-Control"] == "no-store"
    assert await chat.redis.get(GlobalKeys().web_token(access.hash_token(token))) is None
    assert (await chat.post(token, {"text": "again"})).status == 401
    assert (await chat.client.delete("/api/chat/sessions", headers=auth)).status == 401


async def test_revoking_without_a_valid_token_is_401_and_revokes_nothing(chat: Chat) -> None:
    _, token = await chat.new_session()
    before = await chat.snapshot()
    assert (await chat.client.delete("/api/chat/sessions")).status == 401
    resp = await chat.client.delete("/api/chat/sessions", headers={"Authorization": "Bearer not-a-token"})
    assert resp.status == 401
    assert await chat.snapshot() == before
    assert (await chat.post(token, {"text": "still mine"})).status == 202


# ---- error bodies never echo kilobytes of input ----


async def test_error_bodies_do_not_echo_a_long_agent_name(chat: Chat) -> None:
    name = "A" * 4_000  # the longest a session body allows
    resp = await chat.client.post("/api/chat/sessions", json={"agent": name})
    assert resp.status == 403
    text = await resp.text()
    assert len(text) < 400 and "A" * 100 not in text


@pytest.mark.parametrize("field", ["client_id", "text_type"])
async def test_error_bodies_do_not_echo_a_30_kb_bad_field(chat: Chat, field: str) -> None:
    _, token = await chat.new_session()
    big = "B" * 30_000
    body: dict[str, Any] = {"text": "hi", "client_id": big} if field == "client_id" else {"text": [big]}
    resp = await chat.post(token, body)
    assert resp.status == 400
    text = await resp.text()
    assert len(text) < 400 and "B" * 100 not in text


async def test_a_refused_request_logs_nothing_above_debug(chat: Chat, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    _, token = await chat.new_session()
    caplog.clear()
    await chat.post(token, b"[" * 50_000)
    await chat.post(None, {"text": "x"})
    logged = [r for r in caplog.records if r.name.startswith(("switchboard", "aiohttp"))]
    assert [r.getMessage() for r in logged if r.name != "aiohttp.access"] == []  # the access log is off in production


def test_hashing_a_token_never_raises_on_a_lone_surrogate() -> None:
    assert access.hash_token("abc\udcff") != access.hash_token("abc")
    assert access.hash_token("\ud800") != access.hash_token("")
