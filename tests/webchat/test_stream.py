"""``GET /api/chat/stream``: SSE replay, resume with Last-Event-ID, live events, isolation."""

from __future__ import annotations

import asyncio

import pytest

from switchboard.queue.keys import SessionKeys
from switchboard.web.webchat import stream as chatstream

from .conftest import Chat, read_sse


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


async def _conversation(chat: Chat) -> tuple[str, list[str], str]:
    """A session with one answered message; returns the token, every entry id and the message id."""
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    message_id = await chat.send(token, "hello", client_id="c-1")
    await chat.as_worker(
        session,
        [
            ("status", {"status": "running", "reply_to": message_id}),
            ("delta", {"text": "hel", "reply_to": message_id}),
            ("delta", {"text": "lo", "reply_to": message_id}),
        ],
    )
    ids = [e[0].decode() for e in await chat.redis.xrange(SessionKeys(session).web)]
    return token, ids, message_id


async def test_stream_headers_and_full_replay_in_order(chat: Chat) -> None:
    token, ids, message_id = await _conversation(chat)
    async with chat.client.get("/api/chat/stream", headers={"Authorization": f"Bearer {token}"}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["Cache-Control"] == "no-cache"
        assert resp.headers["X-Accel-Buffering"] == "no"
        events = await read_sse(resp, 5)
    assert [e.id for e in events] == ids
    assert sorted(ids, key=_id_key) == ids
    assert [e.event for e in events] == ["user", "status", "status", "delta", "delta"]
    assert events[0].data == {"message_id": message_id, "text": "hello", "client_id": "c-1"}
    assert events[1].data == {"status": "queued"}
    assert events[2].data == {"status": "running", "reply_to": message_id}
    assert events[3].data == {"text": "hel", "reply_to": message_id}


async def test_token_in_the_query_opens_the_stream(chat: Chat) -> None:
    token, ids, _ = await _conversation(chat)
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:
        assert resp.status == 200
        assert [e.id for e in await read_sse(resp, len(ids))] == ids


@pytest.mark.parametrize("query", ["", "?token=", "?token=wrong"])
async def test_stream_without_a_valid_token_is_401(chat: Chat, query: str) -> None:
    await _conversation(chat)
    resp = await chat.client.get(f"/api/chat/stream{query}")
    assert resp.status == 401


async def test_last_event_id_resumes_strictly_after_it(chat: Chat) -> None:
    token, ids, _ = await _conversation(chat)
    headers = {"Authorization": f"Bearer {token}", "Last-Event-ID": ids[1]}
    async with chat.client.get("/api/chat/stream", headers=headers) as resp:
        events = await read_sse(resp, len(ids) - 2)
    assert [e.id for e in events] == ids[2:]


async def test_last_event_id_zero_means_from_the_beginning(chat: Chat) -> None:
    token, ids, _ = await _conversation(chat)
    headers = {"Authorization": f"Bearer {token}", "Last-Event-ID": "0"}
    async with chat.client.get("/api/chat/stream", headers=headers) as resp:
        assert [e.id for e in await read_sse(resp, len(ids))] == ids


async def test_trimmed_last_event_id_starts_at_the_oldest_retained(chat: Chat) -> None:
    token, ids, message_id = await _conversation(chat)
    session = await chat.session_key(token)
    more = await chat.as_worker(session, [("delta", {"text": str(i), "reply_to": message_id}) for i in range(10)])
    await chat.redis.xtrim(SessionKeys(session).web, maxlen=4, approximate=False)
    retained = [e[0].decode() for e in await chat.redis.xrange(SessionKeys(session).web)]
    assert retained == more[-4:] and ids[0] not in retained
    headers = {"Authorization": f"Bearer {token}", "Last-Event-ID": ids[0]}
    async with chat.client.get("/api/chat/stream", headers=headers) as resp:
        events = await read_sse(resp, 4)
    assert [e.id for e in events] == retained


@pytest.mark.parametrize("value", ["abc", "1-2-3", "-1", "1-x"])
async def test_malformed_last_event_id_is_400(chat: Chat, value: str) -> None:
    token, _, _ = await _conversation(chat)
    resp = await chat.client.get(
        "/api/chat/stream", headers={"Authorization": f"Bearer {token}", "Last-Event-ID": value}
    )
    assert resp.status == 400


async def test_replay_then_live_events(chat: Chat) -> None:
    token, ids, message_id = await _conversation(chat)
    session = await chat.session_key(token)
    async with chat.client.get("/api/chat/stream", headers={"Authorization": f"Bearer {token}"}) as resp:
        replayed = await read_sse(resp, len(ids))
        assert [e.id for e in replayed] == ids
        second = await chat.send(token, "and another", client_id="c-2")
        live = await read_sse(resp, 2)
        assert [e.event for e in live] == ["user", "status"]
        assert live[0].data == {"message_id": second, "text": "and another", "client_id": "c-2"}
        [final_id] = await chat.as_worker(session, [("message", {"text": "hello!", "reply_to": message_id})])
        [final] = await read_sse(resp, 1)
    assert final.id == final_id and final.event == "message"
    assert final.data == {"text": "hello!", "reply_to": message_id}
    assert _id_key(live[0].id or "") > _id_key(ids[-1])


async def test_a_session_with_no_history_goes_live(chat: Chat) -> None:
    _, token = await chat.new_session()
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:
        assert resp.status == 200
        message_id = await chat.send(token, "first")
        [user, status] = await read_sse(resp, 2)
    assert user.event == "user" and user.data is not None and user.data["message_id"] == message_id
    assert status.event == "status"


async def test_a_token_sees_only_its_own_session(chat: Chat) -> None:
    _, ta = await chat.new_session()
    _, tb = await chat.new_session()
    await chat.send(ta, "secret of A", client_id="a1")
    b_id = await chat.send(tb, "hello from B", client_id="b1")
    async with chat.client.get(f"/api/chat/stream?token={tb}") as resp:
        events = await read_sse(resp, 2)
        await chat.send(ta, "more from A", client_id="a2")
        await chat.send(tb, "more from B", client_id="b2")
        live = await read_sse(resp, 2)
    texts = [e.data.get("text") for e in events + live if e.data]
    assert "secret of A" not in texts and "more from A" not in texts
    assert events[0].data == {"message_id": b_id, "text": "hello from B", "client_id": "b1"}
    assert live[0].data is not None and live[0].data["text"] == "more from B"


async def test_keep_alive_comment_when_idle(chat: Chat, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chatstream, "KEEPALIVE_S", 0.2)
    _, token = await chat.new_session()
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:
        [ping] = await read_sse(resp, 1, comments=True)
    assert ping.comment == "ping"


async def test_app_shutdown_ends_open_streams(chat: Chat) -> None:
    token, ids, _ = await _conversation(chat)
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:
        await read_sse(resp, len(ids))
        await chat.app.shutdown()  # what the runner does first when the server stops
        async with asyncio.timeout(10):
            rest = await resp.content.read()
    assert rest == b""


async def test_multiline_data_is_framed_as_several_data_lines(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    text = "line one\nline two\n\nline four"
    [entry] = await chat.as_worker(session, [("message", {"text": text, "reply_to": "m"})])
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:
        [event] = await read_sse(resp, 1)
    assert event.id == entry and event.data == {"text": text, "reply_to": "m"}
