"""Attacks on the web chat's event stream: what a hostile client sends, and what must happen instead.

The first three succeeded when written (a 200 then a Redis warning for the largest stream id; streams and tickets
outliving a revoked token) and were fixed in the stream code; the last (a session's keys never expiring) was fixed
with an idle TTL on every key of a web chat session.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.webchat.conftest import Chat, read_sse


async def test_the_largest_stream_id_as_last_event_id_is_400_not_a_redis_failure(
    chat: Chat, caplog: pytest.LogCaptureFixture
) -> None:
    _, token = await chat.new_session()
    top = f"{2**64 - 1}-{2**64 - 1}"
    caplog.clear()
    async with asyncio.timeout(10):  # a guard, not a timing assertion
        resp = await chat.client.get(
            "/api/chat/stream", headers={"Authorization": f"Bearer {token}", "Last-Event-ID": top}
        )
        status = resp.status
        await resp.read() if status != 200 else resp.close()
    assert status == 400
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_stream_opened_before_revocation_receives_nothing_after_it(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    auth = {"Authorization": f"Bearer {token}"}
    async with asyncio.timeout(20):  # a guard, not a timing assertion
        stream = await chat.client.get("/api/chat/stream", headers=auth)
        assert stream.status == 200
        assert (await chat.client.delete("/api/chat/sessions", headers=auth)).status == 204
        await chat.as_worker(session, [("message", {"text": "private reply after revocation"})])
        events = await read_sse(stream, 1, limit_s=3.0) if not stream.content.at_eof() else []
        stream.close()
    assert [e.data for e in events if e.event == "message"] == []


async def test_a_ticket_minted_before_revocation_opens_nothing(chat: Chat) -> None:
    _, token = await chat.new_session()
    auth = {"Authorization": f"Bearer {token}"}
    ticket = (await (await chat.client.post("/api/chat/stream-ticket", headers=auth)).json())["ticket"]
    assert (await chat.client.delete("/api/chat/sessions", headers=auth)).status == 204
    async with asyncio.timeout(10):  # a guard, not a timing assertion
        resp = await chat.client.get(f"/api/chat/stream?ticket={ticket}")
        status = resp.status
        resp.close()
    assert status == 401


async def test_an_anonymous_sessions_retained_conversation_expires(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    await chat.send(token, "x" * 30_000)
    keys = [k.decode() for k in await chat.redis.keys("*") if session in k.decode()]
    assert keys  # the web stream, the inbox, the message, the meta, the events
    never = [k for k in keys if await chat.redis.ttl(k) == -1]
    assert never == []
