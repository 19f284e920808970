"""Stream tickets are metered per session: unused tickets cannot pile up in Redis.

Before, one token minted 500 tickets in a second (501 Redis keys, each living ``TICKET_TTL_S``).
"""

from __future__ import annotations

from switchboard.queue.keys import GlobalKeys
from switchboard.web.webchat import stream as chatstream

from .conftest import Chat


async def _tickets(chat: Chat) -> int:
    return len(await chat.redis.keys(GlobalKeys().web_stream_ticket("*")))


async def _ask(chat: Chat, token: str) -> int:
    resp = await chat.client.post("/api/chat/stream-ticket", headers={"Authorization": f"Bearer {token}"})
    return resp.status


async def test_a_session_asking_for_too_many_tickets_is_refused_429_and_nothing_is_stored(chat: Chat) -> None:
    _, token = await chat.new_session()
    cap = chatstream.TICKETS_PER_TTL
    assert [await _ask(chat, token) for _ in range(cap)] == [200] * cap
    assert await _tickets(chat) == cap

    resp = await chat.client.post("/api/chat/stream-ticket", headers={"Authorization": f"Bearer {token}"})

    assert resp.status == 429
    body = await resp.json()
    assert body["ok"] is False and body["error"]["code"] == "rate_limited", body
    assert 1 <= int(resp.headers["Retry-After"]) <= chatstream.TICKET_TTL_S
    assert await _tickets(chat) == cap  # the refusal stored nothing
    assert [await _ask(chat, token) for _ in range(50)] == [429] * 50
    assert await _tickets(chat) == cap


async def test_the_ticket_meter_is_per_session(chat: Chat) -> None:
    _, first = await chat.new_session()
    _, second = await chat.new_session()
    cap = chatstream.TICKETS_PER_TTL
    assert [await _ask(chat, first) for _ in range(cap + 1)] == [200] * cap + [429]
    assert await _ask(chat, second) == 200


async def test_a_ticket_from_the_metered_path_still_opens_the_stream(chat: Chat) -> None:
    _, token = await chat.new_session()
    resp = await chat.client.post("/api/chat/stream-ticket", headers={"Authorization": f"Bearer {token}"})
    ticket = (await resp.json())["ticket"]
    async with chat.client.get(f"/api/chat/stream?ticket={ticket}") as stream:
        assert stream.status == 200
