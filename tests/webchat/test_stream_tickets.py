"""Stream tickets are metered per session: unused tickets cannot pile up in Redis.

Before, one token minted 500 tickets in a second (501 Redis keys, each living ``TICKET_TTL_S``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from redis.cluster import key_slot

from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.shards import SHARDS, shard_of
from switchboard.web.webchat import access
from switchboard.web.webchat import stream as chatstream

from .conftest import Chat


async def _tickets(chat: Chat) -> int:
    return len(await chat.redis.keys(GlobalKeys().every_web_ticket))


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


async def test_a_ticket_names_its_sessions_shard_and_is_kept_beside_its_meter(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    resp = await chat.client.post("/api/chat/stream-ticket", headers={"Authorization": f"Bearer {token}"})
    ticket = (await resp.json())["ticket"]
    shard, _, secret = ticket.partition(".")
    assert int(shard) == shard_of(session)
    assert len(secret) >= 43  # 256 random bits: the shard is no secret, this part is
    keys = SessionKeys(session)
    stored = keys.shard.web_ticket(access.hash_token(ticket))
    assert await chat.redis.get(stored) == access.hash_token(token).encode()
    assert key_slot(stored.encode()) == key_slot(keys.ticket_rate.encode())


@pytest.mark.parametrize(
    "tamper",
    [
        lambda shard, secret: f"{(shard + 1) % SHARDS}.{secret}",  # another shard: not there
        lambda shard, secret: f"{shard + SHARDS}.{secret}",  # no such shard
        lambda shard, secret: f"x{shard}.{secret}",
        lambda shard, secret: f"{shard}{secret}",  # the separator cut
        lambda shard, secret: f"-1.{secret}",
        lambda shard, secret: f"٣.{secret}",  # a digit Python reads, not ASCII
        lambda shard, secret: f"99999999999999999999.{secret}",
        lambda shard, secret: secret,
    ],
)
async def test_a_ticket_whose_shard_was_changed_is_refused_cleanly(
    chat: Chat, tamper: Callable[[int, str], str]
) -> None:
    _, token = await chat.new_session()
    resp = await chat.client.post("/api/chat/stream-ticket", headers={"Authorization": f"Bearer {token}"})
    ticket = (await resp.json())["ticket"]
    shard, _, secret = ticket.partition(".")
    forged = tamper(int(shard), secret)
    resp = await chat.client.get("/api/chat/stream", params={"ticket": forged})
    assert resp.status == 401, await resp.text()
    async with chat.client.get("/api/chat/stream", params={"ticket": ticket}) as stream:  # the real one still works
        assert stream.status == 200
