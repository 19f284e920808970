"""The web chat API of docs/ARCHITECTURE.md §10: sessions and messages."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from switchboard.queue.connection import async_client
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.settings import HttpSettings, load_settings
from switchboard.web.server import GuardedAppRunner
from switchboard.web.webchat import access

from .conftest import Chat, build_app


async def _web_entries(chat: Chat, session: str) -> list[tuple[str, dict[str, Any]]]:
    entries = await chat.redis.xrange(SessionKeys(session).web)  # type: ignore[arg-type]
    return [(f[b"type"].decode(), json.loads(f[b"data"])) for _, f in entries]


# ---- POST /api/chat/sessions ----


@pytest.mark.parametrize("body", [None, {}, {"agent": "assistant"}])
async def test_create_session_answers_201_with_session_and_token(chat: Chat, body: Any) -> None:
    session_id, token = await chat.new_session(body)
    assert session_id and token and session_id != token
    assert len(token) >= 43  # token_urlsafe(32)
    key = await chat.session_key(token)
    assert key.split("/") == ["default", "assistant", "web", "default", session_id]
    ttl = await chat.redis.ttl(GlobalKeys().web_token(hashlib.sha256(token.encode()).hexdigest()))
    assert 0 < ttl <= access.TOKEN_TTL_S


async def test_token_is_stored_only_hashed(chat: Chat) -> None:
    _, token = await chat.new_session()
    for key in await chat.redis.keys("*"):
        assert token.encode() not in key
        if (await chat.redis.type(key)) == b"string":
            assert token.encode() not in (await chat.redis.get(key) or b"")


async def test_create_session_accepts_an_empty_body_with_a_json_content_type(chat: Chat) -> None:
    resp = await chat.client.post("/api/chat/sessions", data=b"", headers={"Content-Type": "application/json"})
    assert resp.status == 201
    body = await resp.json()
    assert set(body) == {"session", "token", "agent"}
    assert body["agent"] == {"id": "assistant", "name": "Assistant", "description": "", "starters": []}


async def test_sessions_are_distinct(chat: Chat) -> None:
    a, ta = await chat.new_session()
    b, tb = await chat.new_session()
    assert a != b and ta != tb


async def test_unknown_agent_is_403_naming_the_allowed_agents_and_writes_nothing(chat: Chat) -> None:
    resp = await chat.client.post("/api/chat/sessions", json={"agent": "nobody"})
    assert resp.status == 403
    error = (await resp.json())["error"]
    assert error["code"] == "agent_not_allowed"
    assert "nobody" in error["message"] and "assistant" in error["message"]
    assert await chat.snapshot() == {}


@pytest.mark.parametrize("body", [b"not json", b"[]", b'"x"', b'{"agent": 3}'])
async def test_malformed_session_body_is_400(chat: Chat, body: bytes) -> None:
    resp = await chat.client.post("/api/chat/sessions", data=body)
    assert resp.status == 400
    assert await chat.snapshot() == {}


async def test_named_agent_from_the_yaml_file(
    aiohttp_client: Any, base_env: dict[str, str], tmp_path: Path, app_redis: aioredis.Redis
) -> None:
    config = tmp_path / "switchboard.yaml"
    config.write_text(
        "agents:\n"
        "  assistant: {profile: {name: A}, instructions: be brief}\n"
        "  support: {profile: {name: S}, instructions: help}\n"
        "channels:\n"
        "  web: {agents: [assistant, support]}\n"
    )
    settings = load_settings({**base_env, "SWITCHBOARD_CONFIG": str(config)})
    client = await aiohttp_client(build_app(settings, app_redis))
    resp = await client.post("/api/chat/sessions", json={"agent": "support"})
    assert resp.status == 201
    token = (await resp.json())["token"]
    key = await app_redis.get(GlobalKeys().web_token(access.hash_token(token)))
    assert key is not None and key.decode().startswith("default/support/web/default/")
    resp = await client.post("/api/chat/sessions", json={"agent": "sales"})
    assert resp.status == 403
    message = (await resp.json())["error"]["message"]
    assert "assistant" in message and "support" in message


# ---- POST /api/chat/messages ----


async def test_message_is_queued_with_its_echo_and_answered_202(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    resp = await chat.post(token, {"text": "hello", "client_id": "c-1"})
    assert resp.status == 202
    message_id = (await resp.json())["message_id"]
    assert message_id
    keys = SessionKeys(session)
    assert [m.decode() for m in await chat.redis.lrange(keys.inbox, 0, -1)] == [message_id]
    stored = json.loads(await chat.redis.hget(keys.messages, message_id))  # type: ignore[arg-type]
    assert stored["text"] == "hello" and stored["conversation"]["channel"] == "web"
    assert await _web_entries(chat, session) == [
        ("user", {"text": "hello", "client_id": "c-1"}),
        ("status", {"status": "queued"}),
    ]


@pytest.mark.parametrize("text", ['say "hi"\\ \n\t\x01 é ✓ 🎉 \u2028', "plain"])
async def test_the_echo_is_the_json_of_text_and_client_id_byte_for_byte(chat: Chat, text: str) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    await chat.send(token, text, client_id='c-"1"')
    entries = await chat.redis.xrange(SessionKeys(session).web)  # type: ignore[arg-type]
    expected = json.dumps({"text": text, "client_id": 'c-"1"'}, ensure_ascii=False).encode()
    assert entries[0][1][b"data"] == expected


async def test_same_client_id_twice_is_one_message_with_the_same_id(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    first = await chat.send(token, "hello", client_id="same")
    second = await chat.send(token, "hello", client_id="same")
    assert first == second
    assert await chat.redis.llen(SessionKeys(session).inbox) == 1
    assert [t for t, _ in await _web_entries(chat, session)] == ["user", "status"]


async def test_client_id_is_scoped_to_the_session(chat: Chat) -> None:
    _, ta = await chat.new_session()
    _, tb = await chat.new_session()
    a = await chat.send(ta, "hi", client_id="shared")
    b = await chat.send(tb, "hi", client_id="shared")
    assert a != b
    assert await chat.redis.llen(SessionKeys(await chat.session_key(tb)).inbox) == 1


async def test_messages_without_client_id_are_distinct(chat: Chat) -> None:
    _, token = await chat.new_session()
    first = await chat.send(token, "one")
    second = await chat.send(token, "one")
    assert first != second
    assert await chat.redis.llen(SessionKeys(await chat.session_key(token)).inbox) == 2


async def test_messages_keep_their_order(chat: Chat) -> None:
    _, token = await chat.new_session()
    ids = [await chat.send(token, f"m{i}", client_id=f"c{i}") for i in range(5)]
    inbox = await chat.redis.lrange(SessionKeys(await chat.session_key(token)).inbox, 0, -1)
    assert [m.decode() for m in inbox] == ids


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer not-a-token"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
    ],
)
async def test_wrong_or_missing_token_is_401_and_writes_nothing(chat: Chat, headers: dict[str, str]) -> None:
    await chat.new_session()
    before = await chat.snapshot()
    resp = await chat.client.post("/api/chat/messages", json={"text": "hi"}, headers=headers)
    assert resp.status == 401
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert await chat.snapshot() == before


async def test_token_in_the_query_is_not_accepted_for_posting(chat: Chat) -> None:
    _, token = await chat.new_session()
    resp = await chat.client.post(f"/api/chat/messages?token={token}", json={"text": "hi"})
    assert resp.status == 401


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        b'"text"',
        b"{}",
        b'{"text": ""}',
        b'{"text": "   \\n "}',
        b'{"text": 5}',
        b'{"text": null}',
        b'{"text": ["a"]}',
        b'{"text": "hi", "client_id": 7}',
        b'{"text": "hi", "client_id": ""}',
        b'{"text": "hi", "client_id": "' + b"x" * 201 + b'"}',
        b"\xff\xfe",
        b'{"text": "\\ud800"}',
        b'{"text": "hi", "client_id": "\\udfff"}',
    ],
)
async def test_malformed_message_is_400_and_writes_nothing(chat: Chat, body: bytes) -> None:
    _, token = await chat.new_session()
    before = await chat.snapshot()
    resp = await chat.post(token, body, headers={"Content-Type": "application/json"})
    assert resp.status == 400, await resp.text()
    assert (await resp.json())["error"]["code"] == "malformed_body"
    assert await chat.snapshot() == before


async def test_text_of_exactly_32_kib_is_accepted(chat: Chat) -> None:
    _, token = await chat.new_session()
    await chat.send(token, "é" * (16 * 1024))  # 32 KiB in UTF-8


async def test_text_over_32_kib_is_413_and_writes_nothing(chat: Chat) -> None:
    _, token = await chat.new_session()
    before = await chat.snapshot()
    resp = await chat.post(token, {"text": "a" * (32 * 1024 + 1)})
    assert resp.status == 413
    assert await chat.snapshot() == before


async def test_body_over_the_cap_is_413_before_parsing(chat: Chat) -> None:
    _, token = await chat.new_session()
    before = await chat.snapshot()
    oversized = b"{" * (chat.settings.queue.max_body_bytes + 1)  # not JSON either: 413 wins, nothing is parsed
    resp = await chat.post(token, oversized)
    assert resp.status == 413
    assert await chat.snapshot() == before


async def test_chunked_body_over_the_cap_is_413(chat: Chat) -> None:
    _, token = await chat.new_session()
    before = await chat.snapshot()
    limit = chat.settings.queue.max_body_bytes

    async def chunks() -> Any:
        for _ in range(limit // 65536 + 2):
            yield b"x" * 65536

    resp = await chat.client.post("/api/chat/messages", data=chunks(), headers={"Authorization": f"Bearer {token}"})
    assert "Content-Length" not in resp.request_info.headers
    assert resp.status == 413
    assert await chat.snapshot() == before


async def test_redis_not_confirming_the_ingest_is_503(
    aiohttp_client: Any, chat: Chat, app_redis: aioredis.Redis, unused_tcp_port: int
) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    dead = async_client(f"redis://127.0.0.1:{unused_tcp_port}/0")
    try:
        client = await aiohttp_client(build_app(chat.settings, app_redis, ingest_redis=dead))
        resp = await client.post(
            "/api/chat/messages", json={"text": "hi"}, headers={"Authorization": f"Bearer {token}"}
        )
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "queue_unavailable"
    finally:
        await dead.aclose()
    assert await chat.redis.exists(SessionKeys(session).inbox) == 0


async def test_redis_down_makes_sessions_and_auth_503(aiohttp_client: Any, chat: Chat, unused_tcp_port: int) -> None:
    dead = async_client(f"redis://127.0.0.1:{unused_tcp_port}/0")
    try:
        client = await aiohttp_client(build_app(chat.settings, dead))
        assert (await client.post("/api/chat/sessions")).status == 503
        resp = await client.post("/api/chat/messages", json={"text": "hi"}, headers={"Authorization": "Bearer x"})
        assert resp.status == 503
        assert (await client.get("/api/chat/stream?token=x")).status == 503
    finally:
        await dead.aclose()


async def test_use_refreshes_the_token_ttl(chat: Chat) -> None:
    _, token = await chat.new_session()
    key = GlobalKeys().web_token(access.hash_token(token))
    await chat.redis.expire(key, 60)
    await chat.send(token, "hi")
    assert await chat.redis.ttl(key) > 60


async def test_cors_preflight_allows_the_bearer_header(chat: Chat) -> None:
    resp = await chat.client.options(
        "/api/chat/messages",
        headers={"Origin": "https://example.org", "Access-Control-Request-Method": "POST"},
    )
    assert resp.status == 204
    assert "Authorization" in resp.headers["Access-Control-Allow-Headers"]


async def test_a_message_posted_to_the_served_app_takes_the_direct_route_and_is_answered_as_by_the_dispatcher(
    chat: Chat,
) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    answers: list[tuple[int, dict[str, str], bytes]] = []
    for direct in (True, False):
        app = build_app(chat.settings, chat.redis)
        if not direct:
            app.on_response_prepare.append(_noop_hook)  # a hook turns the direct route off
        runner = GuardedAppRunner(app, HttpSettings(), access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            url = f"http://127.0.0.1:{runner.addresses[0][1]}/api/chat/messages"
            async with (
                aiohttp.ClientSession() as http,
                http.post(url, json={"text": f"direct={direct}"}, headers={"Authorization": f"Bearer {token}"}) as resp,
            ):
                answers.append((resp.status, dict(resp.headers), await resp.read()))
        finally:
            await runner.cleanup()
    (status, headers, body), (plain_status, plain_headers, plain_body) = answers
    assert status == plain_status == 202
    assert {k: v for k, v in headers.items() if k != "Date"} == {k: v for k, v in plain_headers.items() if k != "Date"}
    assert headers["Access-Control-Allow-Origin"] == "*" and headers["Content-Type"] == "application/json"
    ids = [json.loads(body)["message_id"], json.loads(plain_body)["message_id"]]
    inbox = [m.decode() for m in await chat.redis.lrange(SessionKeys(session).inbox, 0, -1)]
    assert inbox == ids


async def _noop_hook(request: web.Request, response: web.StreamResponse) -> None:
    return None
