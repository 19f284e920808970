"""Open streams share a few Redis connections, are capped per session and address, and never starve the rest."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestClient

from switchboard.queue import limits
from switchboard.queue.connection import async_client
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.muxredis import MultiplexedRedis
from switchboard.queue.streamslots import StreamSlots
from switchboard.settings import Settings, load_settings
from switchboard.web.app import create_app
from switchboard.web.webchat import access
from switchboard.web.webchat import stream as chatstream
from switchboard.web.webchat.fanout import POOL_SIZE

from .conftest import Chat, build_app, read_sse

MakeClient = Callable[[web.Application], Awaitable[TestClient[Any, Any]]]


@contextlib.asynccontextmanager
async def _open_streams(client: TestClient[Any, Any], urls: list[str]) -> AsyncIterator[list[aiohttp.ClientResponse]]:
    """Open every URL as an SSE stream (a connector without aiohttp's 100-connection default) and hold them open."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        responses = await asyncio.gather(*(http.get(client.make_url(url)) for url in urls))
        try:
            for resp in responses:  # each stream is open once its first line (the retry hint) arrived
                if resp.status == 200:
                    assert (await resp.content.readline()).startswith(b"retry:")
            yield list(responses)
        finally:
            for resp in responses:
                resp.close()


async def _clients(redis: aioredis.Redis) -> int:
    return len(await redis.client_list())


def _settings(base_env: dict[str, str], **limits: int) -> Settings:
    env = dict(base_env)
    for name, value in limits.items():
        env[f"SWITCHBOARD_LIMITS__{name.upper()}"] = str(value)
    return load_settings(env)


async def _session(client: TestClient[Any, Any]) -> str:
    resp = await client.post("/api/chat/sessions")
    assert resp.status == 201, await resp.text()
    return str((await resp.json())["token"])


async def test_150_streams_of_one_token_leave_healthz_and_posts_working(
    base_env: dict[str, str], aiohttp_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The real app (its own Redis pool of 100): 150 open streams once took every connection of it."""
    caplog.set_level(logging.WARNING, logger="switchboard")
    settings = _settings(base_env, streams_per_session=0, streams_per_address=0)
    client = await aiohttp_client(create_app(settings))
    token = await _session(client)
    async with _open_streams(client, [f"/api/chat/stream?token={token}"] * 150) as streams:
        assert [r.status for r in streams] == [200] * 150
        health = await client.get("/healthz")
        assert health.status == 200, await health.text()
        posted = await client.post(
            "/api/chat/messages", json={"text": "still there?"}, headers={"Authorization": f"Bearer {token}"}
        )
        assert posted.status == 202, await posted.text()
        assert (await _session(client)) != token
        message_id = (await posted.json())["message_id"]
        for resp in (streams[0], streams[-1]):  # every stream still gets the live events
            [user, _status] = await read_sse(resp, 2)
            assert user.event == "user" and user.data is not None and user.data["message_id"] == message_id
    # the gateway's own records (an object another test left to the collector may log here when it is freed)
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("switchboard")
    ]
    assert warnings == []


async def test_many_streams_use_a_fixed_few_redis_connections(
    base_env: dict[str, str], aiohttp_client: MakeClient, async_redis: aioredis.Redis
) -> None:
    settings = _settings(base_env, streams_per_session=0, streams_per_address=0)
    client = await aiohttp_client(create_app(settings))
    tokens = [await _session(client) for _ in range(30)]
    assert (await client.get("/healthz")).status == 200  # settle: the app's own connections are open
    before = await _clients(async_redis)
    urls = [f"/api/chat/stream?token={token}" for token in tokens for _ in range(4)]
    async with _open_streams(client, urls) as streams:
        assert [r.status for r in streams] == [200] * len(urls)
        during = await _clients(async_redis)
        posted = await client.post(
            "/api/chat/messages", json={"text": "fan me out"}, headers={"Authorization": f"Bearer {tokens[7]}"}
        )
        assert posted.status == 202
        [user, _] = await read_sse(streams[7 * 4 + 3], 2)
        assert user.data is not None and user.data["text"] == "fan me out"
    # the reader's own connection, plus at most the streams' blocking pool
    assert during - before <= POOL_SIZE + 1, f"{during - before} Redis connections for {len(urls)} streams"


async def test_streams_over_the_session_cap_get_429(chat: Chat) -> None:
    cap = chat.settings.limits.streams_per_session
    assert cap > 0
    _, token = await chat.new_session()
    before = await chat.snapshot()
    async with _open_streams(chat.client, [f"/api/chat/stream?token={token}"] * (cap + 3)) as streams:
        statuses = sorted(r.status for r in streams)
        assert statuses == [200] * cap + [429] * 3
        refused = next(r for r in streams if r.status == 429)
        assert refused.headers["Retry-After"] == str(chatstream.RETRY_AFTER_S)
        assert (await refused.json())["error"]["code"] == "too_many_streams"
        # one of the open ones closes: its slot comes back (the sweep notices within a second or so)
        next(r for r in streams if r.status == 200).close()
        async with asyncio.timeout(10):  # a guard, not a timing assertion
            while (resp := await chat.client.get(f"/api/chat/stream?token={token}")).status == 429:
                resp.close()
                await asyncio.sleep(0.2)
        assert resp.status == 200
        resp.close()
    assert set(await chat.snapshot()) - set(before) <= {
        GlobalKeys().web_streams_by_session(await chat.session_key(token)),
        GlobalKeys().web_streams_by_address("127.0.0.1"),
    }


async def test_the_address_cap_counts_streams_of_every_session(chat: Chat) -> None:
    per_address = chat.settings.limits.streams_per_address
    per_session = chat.settings.limits.streams_per_session
    tokens = [(await chat.new_session())[1] for _ in range(per_address // per_session + 1)]
    urls = [f"/api/chat/stream?token={t}" for t in tokens for _ in range(per_session)][: per_address + 2]
    async with _open_streams(chat.client, urls) as streams:
        assert sorted(r.status for r in streams) == [200] * per_address + [429, 429]


async def test_caps_hold_across_web_processes(
    chat: Chat, app_redis: aioredis.Redis, aiohttp_client: MakeClient
) -> None:
    """Two apps (two web processes) on one Redis: the session's cap counts the streams of both."""
    other = await aiohttp_client(build_app(chat.settings, app_redis))
    cap = chat.settings.limits.streams_per_session
    _, token = await chat.new_session()
    url = f"/api/chat/stream?token={token}"
    async with _open_streams(chat.client, [url] * (cap - 1)) as here, _open_streams(other, [url] * 2) as there:
        assert [r.status for r in here] == [200] * (cap - 1)
        assert sorted(r.status for r in there) == [200, 429]


async def test_a_crashed_process_does_not_keep_its_slots(async_redis: aioredis.Redis) -> None:
    """Slots nobody refreshes expire: a process that died frees its streams' places by itself."""
    crashed = StreamSlots(async_redis, ttl_ms=300)  # never started: nobody refreshes its slots
    for _ in range(2):
        assert not isinstance(await crashed.acquire("s", "a", per_session=2, per_address=0), str)
    assert await crashed.acquire("s", "a", per_session=2, per_address=0) == "session"
    key = GlobalKeys().web_streams_by_session("s")
    assert 0 < await async_redis.pttl(key) <= 300
    await asyncio.sleep(0.4)
    survivor = StreamSlots(async_redis)
    assert not isinstance(await survivor.acquire("s", "a", per_session=2, per_address=0), str)


async def test_refresh_keeps_held_slots_and_release_frees_them(async_redis: aioredis.Redis) -> None:
    slots = StreamSlots(async_redis, ttl_ms=300)
    held = await slots.acquire("s", "a", per_session=1, per_address=0)
    assert not isinstance(held, str)
    for _ in range(3):
        await asyncio.sleep(0.15)
        await slots.refresh()
    assert await slots.acquire("s", "a", per_session=1, per_address=0) == "session"
    await slots.release(held)
    assert await async_redis.zcard(held.session_key) == 0
    await slots.refresh()  # a released slot is never brought back
    assert await async_redis.zcard(held.session_key) == 0


async def test_a_session_refusal_takes_the_address_entry_back(async_redis: aioredis.Redis) -> None:
    """The address's set is taken first; when the session's cap refuses, the address keeps no entry for it."""
    slots = StreamSlots(async_redis)
    held = await slots.acquire("s", "a", per_session=1, per_address=5)
    assert not isinstance(held, str)
    assert await slots.acquire("s", "a", per_session=1, per_address=5) == "session"
    assert await async_redis.zrange(held.address_key, 0, -1) == [held.id.encode()]
    assert await slots.acquire("s", "b", per_session=0, per_address=1) != "session"  # a cap of 0 is not counted
    assert await async_redis.zcard(GlobalKeys().web_streams_by_session("s")) == 1


async def test_concurrent_opens_never_exceed_either_cap(async_redis: aioredis.Redis) -> None:
    """60 streams opened at once over 6 sessions of one address: each cap holds exactly, nothing is left behind."""
    slots = StreamSlots(async_redis)
    per_session, per_address = 3, 10
    sessions = [f"s{n % 6}" for n in range(60)]
    got = await asyncio.gather(
        *(slots.acquire(s, "198.51.100.4", per_session=per_session, per_address=per_address) for s in sessions)
    )
    held = [slot for slot in got if not isinstance(slot, str)]
    by_session = collections.Counter(slot.session for slot in held)
    assert max(by_session.values()) <= per_session
    assert len(held) <= per_address
    # the two-step window may refuse an address's stream falsely while another's entry is taken back, never admit
    # one too many; here every session can hold 3 and the address 10, so the address's cap is what binds
    assert len(held) >= per_address - 2, got
    address_key = held[0].address_key
    assert sorted(await async_redis.zrange(address_key, 0, -1)) == sorted(slot.id.encode() for slot in held)
    for name in set(sessions):
        members = await async_redis.zrange(GlobalKeys().web_streams_by_session(name), 0, -1)
        assert sorted(members) == sorted(slot.id.encode() for slot in held if slot.session == name)
    await asyncio.gather(*(slots.release(slot) for slot in held))
    assert await async_redis.zcard(address_key) == 0


async def test_zero_means_no_limit(
    base_env: dict[str, str], app_redis: aioredis.Redis, aiohttp_client: MakeClient
) -> None:
    settings = _settings(base_env, streams_per_session=0, streams_per_address=0)
    client = await aiohttp_client(build_app(settings, app_redis))
    token = await _session(client)
    async with _open_streams(client, [f"/api/chat/stream?token={token}"] * 12) as streams:
        assert [r.status for r in streams] == [200] * 12


# ---------------------------------------------------------------- Last-Event-ID


@pytest.mark.parametrize(
    "value",
    [
        "１２３",
        "99999999999999999999",
        "18446744073709551616-0",
        "1-18446744073709551616",
        "18446744073709551615-18446744073709551615",  # valid, but Redis refuses it as an exclusive range start
    ],
)
async def test_last_event_id_redis_refuses_is_400(chat: Chat, value: str) -> None:
    """``\\d`` passed these; Redis refuses them, which ended the stream with a misleading Redis warning."""
    _, token = await chat.new_session()
    resp = await chat.client.get(
        "/api/chat/stream", headers={"Authorization": f"Bearer {token}", "Last-Event-ID": value}
    )
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == "bad_last_event_id"
    resp = await chat.client.get(f"/api/chat/stream?token={token}&last_event_id={value}")
    assert resp.status == 400


@pytest.mark.parametrize("top", ["18446744073709551615-18446744073709551614", "18446744073709551615"])
async def test_the_largest_stream_ids_are_accepted(
    chat: Chat, top: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Valid ids, however large, open the stream (nothing follows them) and log nothing."""
    caplog.set_level(logging.WARNING, logger="switchboard")
    monkeypatch.setattr(chatstream, "KEEPALIVE_S", 0.2)
    _, token = await chat.new_session()
    await chat.send(token, "hello")
    headers = {"Authorization": f"Bearer {token}", "Last-Event-ID": top}
    async with chat.client.get("/api/chat/stream", headers=headers) as resp:
        assert resp.status == 200
        [ping] = await read_sse(resp, 1, comments=True)  # the stream stays open: only a keep-alive comes
    assert ping.comment == "ping"
    # the gateway's own records (an object another test left to the collector may log here when it is freed)
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("switchboard")
    ]
    assert warnings == []


async def test_last_event_id_in_the_query_resumes(chat: Chat) -> None:
    _, token = await chat.new_session()
    await chat.send(token, "one", client_id="c1")
    await chat.send(token, "two", client_id="c2")
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:
        first = await read_sse(resp, 4)
    async with chat.client.get(f"/api/chat/stream?token={token}&last_event_id={first[1].id}") as resp:
        rest = await read_sse(resp, 2)
    assert [e.id for e in rest] == [e.id for e in first[2:]]


# ---------------------------------------------------------------- stream tickets


async def _ticket(chat: Chat, token: str) -> str:
    resp = await chat.client.post("/api/chat/stream-ticket", headers={"Authorization": f"Bearer {token}"})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["expires_in"] == chatstream.TICKET_TTL_S
    assert resp.headers["Cache-Control"] == "no-store"
    return str(body["ticket"])


async def test_a_ticket_opens_its_session_stream_once(chat: Chat) -> None:
    _, token = await chat.new_session()
    message_id = await chat.send(token, "hello")
    ticket = await _ticket(chat, token)
    assert ticket != token and token not in ticket
    async with chat.client.get(f"/api/chat/stream?ticket={ticket}") as resp:
        assert resp.status == 200
        [user, _] = await read_sse(resp, 2)
        assert user.data is not None and user.data["message_id"] == message_id
    again = await chat.client.get(f"/api/chat/stream?ticket={ticket}")
    assert again.status == 401


async def test_a_ticket_is_stored_by_hash_and_expires(chat: Chat) -> None:
    _, token = await chat.new_session()
    ticket = await _ticket(chat, token)
    key = limits.stream_ticket_key(ticket, access.hash_token(ticket))
    assert key is not None
    assert 0 < await chat.redis.ttl(key) <= chatstream.TICKET_TTL_S
    assert [k for k in await chat.redis.keys("*") if ticket.encode() in k] == []
    await chat.redis.pexpire(key, 1)
    await asyncio.sleep(0.05)
    assert (await chat.client.get(f"/api/chat/stream?ticket={ticket}")).status == 401


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic eA=="}])
async def test_a_ticket_needs_a_valid_bearer_token(chat: Chat, headers: dict[str, str]) -> None:
    before = await chat.snapshot()
    resp = await chat.client.post("/api/chat/stream-ticket", headers=headers)
    assert resp.status == 401
    assert await chat.snapshot() == before


async def test_a_ticket_of_one_session_opens_only_that_session(chat: Chat) -> None:
    _, ta = await chat.new_session()
    _, tb = await chat.new_session()
    await chat.send(ta, "secret of A")
    b_id = await chat.send(tb, "hello from B")
    async with chat.client.get(f"/api/chat/stream?ticket={await _ticket(chat, tb)}") as resp:
        events = await read_sse(resp, 2)
    assert events[0].data is not None and events[0].data["message_id"] == b_id
    assert all(e.data is None or e.data.get("text") != "secret of A" for e in events)


@pytest.mark.parametrize("ticket", ["", "x" * 600, "not-a-ticket"])
async def test_a_wrong_ticket_is_401(chat: Chat, ticket: str) -> None:
    assert (await chat.client.get(f"/api/chat/stream?ticket={ticket}")).status == 401


# ---------------------------------------------------------------- reply_error


async def test_a_failed_reply_is_a_reply_error_event_never_error(chat: Chat) -> None:
    """A browser's ``EventSource`` fires ``onerror`` for an event named ``error``: the page showed "Reconnecting"."""
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    message_id = await chat.send(token, "fail please")
    failure = {"reply_to": message_id, "code": "model_error", "message": "The model failed."}
    await chat.as_worker(session, [("reply_error", failure)])
    # what an earlier version wrote: read under its current name
    await chat.redis.xadd(SessionKeys(session).web, {"type": "error", "data": '{"reply_to":"old"}'})
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:
        events = await read_sse(resp, 4)
    assert [e.event for e in events] == ["user", "status", "reply_error", "reply_error"]
    assert events[2].data == failure and events[3].data == {"reply_to": "old"}


async def test_a_slot_whose_answer_never_came_is_taken_back(redis_url: str, async_redis: aioredis.Redis) -> None:
    """The script ran but the caller gave up waiting (its deadline passed): the slot must not count until it expires."""
    template = async_client(redis_url)
    client = MultiplexedRedis.like(template)
    try:
        slots = StreamSlots(client)
        warm = await slots.acquire("s", "a", per_session=1, per_address=0)  # connected, script loaded
        assert not isinstance(warm, str)
        await slots.release(warm)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0):  # the command is written, then its caller is cancelled at once
                await slots.acquire("s", "a", per_session=1, per_address=0)
        async with asyncio.timeout(10):  # a guard, not a timing assertion
            while await async_redis.zcard(GlobalKeys().web_streams_by_session("s")):
                await asyncio.sleep(0.01)
        assert not isinstance(await slots.acquire("s", "a", per_session=1, per_address=0), str)
    finally:
        await client.aclose()
        await template.aclose()


# ---------------------------------------------------------------- revocation


async def test_revoking_the_token_ends_its_open_streams_at_once(chat: Chat) -> None:
    _, token = await chat.new_session()
    _, other = await chat.new_session()
    session = await chat.session_key(token)
    auth = {"Authorization": f"Bearer {token}"}
    async with asyncio.timeout(20):  # a guard, not a timing assertion
        by_ticket = await chat.client.get(f"/api/chat/stream?ticket={await _ticket(chat, token)}")
        by_token = await chat.client.get("/api/chat/stream", headers=auth)
        bystander = await chat.client.get("/api/chat/stream", headers={"Authorization": f"Bearer {other}"})
        assert [r.status for r in (by_ticket, by_token, bystander)] == [200, 200, 200]
        assert (await chat.client.delete("/api/chat/sessions", headers=auth)).status == 204
        await chat.as_worker(session, [("message", {"text": "private reply after revocation", "reply_to": "m"})])
        for resp in (by_ticket, by_token):
            rest = await resp.content.read()  # the stream ends: EOF, with no event after the revocation
            assert b"private reply" not in rest
        assert not bystander.content.at_eof()
        bystander.close()


async def test_a_ticket_minted_before_revocation_opens_nothing(chat: Chat) -> None:
    _, token = await chat.new_session()
    ticket = await _ticket(chat, token)
    assert (await chat.client.delete("/api/chat/sessions", headers={"Authorization": f"Bearer {token}"})).status == 204
    assert (await chat.client.get(f"/api/chat/stream?ticket={ticket}")).status == 401


async def test_a_token_revoked_elsewhere_ends_its_streams_here(chat: Chat) -> None:
    """Another web process deleted the token: this one notices on its next check and ends the streams."""
    _, token = await chat.new_session()
    async with asyncio.timeout(chatstream.REVOCATION_CHECK_S * 3):  # a guard, not a timing assertion
        resp = await chat.client.get(f"/api/chat/stream?token={token}")
        assert resp.status == 200
        await chat.redis.delete(GlobalKeys().web_token(access.hash_token(token)))
        await resp.content.read()  # EOF
    assert (
        await chat.client.post("/api/chat/stream-ticket", headers={"Authorization": f"Bearer {token}"})
    ).status == 401
