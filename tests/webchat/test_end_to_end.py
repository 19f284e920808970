"""API → real ingest → real Drainer (trivial runner) → WebChannel → fenced web stream → SSE."""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.channels.registry import ChannelSet
from switchboard.channels.web.adapter import WebChannel
from switchboard.core.agent.config import Agent
from switchboard.core.messages import InboundMessage
from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.errors import FencedWriteError
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import CURRENT_LEASE
from switchboard.types import SessionKey
from switchboard.worker.drain import Drainer

from .conftest import Chat, read_sse


async def _echo(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
    text = " ".join(m.text for m in request.messages)
    if "fail" in text:
        raise RuntimeError("the model failed")
    for word in ("You", " said", ": "):
        await sink.delta(word)
    return TurnResult(text=f"You said: {text}", steps=1)


def _drainer(chat: Chat, *, delta_every_s: float = 0.0) -> Drainer:
    update = {"max_attempts": 1, "retry_backoff_s": 0, "delta_every_s": delta_every_s}
    settings = chat.settings.queue.model_copy(update=update)
    channels = ChannelSet({("web", "default"): WebChannel(chat.publisher.publish)})

    def agent_for(message: InboundMessage) -> Agent:
        return chat.settings.file.agent(message.conversation.agent)

    return Drainer(chat.redis, settings, runner=_echo, deliverer=channels, agent_for=agent_for, worker_id="w1")


def _summary(events: list[Any]) -> list[tuple[str | None, str | None]]:
    out: list[tuple[str | None, str | None]] = []
    for e in events:
        data = e.data or {}
        out.append((e.event, data.get("status") or data.get("text") or data.get("code")))
    return out


async def test_a_reply_streams_live_then_replays_as_one_message(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:
        message_id = await chat.send(token, "hello", client_id="c1")
        await _drainer(chat).drain(SessionKey(session))
        live = await read_sse(resp, 8)
    assert _summary(live) == [
        ("user", "hello"),
        ("status", "queued"),
        ("status", "running"),
        ("delta", "You"),
        ("delta", " said"),
        ("delta", ": "),
        ("message", "You said: hello"),
        ("status", "idle"),
    ]
    assert all(e.data["reply_to"] == message_id for e in live[2:])
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:  # a reload
        replayed = await read_sse(resp, 5)
    assert _summary(replayed) == [
        ("user", "hello"),
        ("status", "queued"),
        ("status", "running"),
        ("message", "You said: hello"),
        ("status", "idle"),
    ]
    assert replayed[0].data is not None and replayed[0].data["message_id"] == message_id


async def test_pieces_written_faster_than_delta_every_go_out_together(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:
        await chat.send(token, "hello", client_id="c1")
        await _drainer(chat, delta_every_s=60.0).drain(SessionKey(session))
        live = await read_sse(resp, 6)
    # the first piece at once; the rest, written within the minute, arrive with the reply that replaces them
    assert _summary(live) == [
        ("user", "hello"),
        ("status", "queued"),
        ("status", "running"),
        ("delta", "You"),
        ("message", "You said: hello"),
        ("status", "idle"),
    ]


async def test_messages_sent_during_a_run_are_answered_in_order(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    ids = [await chat.send(token, text, client_id=text) for text in ("one", "two", "three")]
    await _drainer(chat).drain(SessionKey(session))
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:
        events = await read_sse(resp, 3 * 2 + 3 * 2 + 1)
    finals = [(e.data or {}).get("reply_to") for e in events if e.event == "message"]
    assert finals == ids
    running = [(e.data or {}).get("reply_to") for e in events if e.event == "status" and e.data["status"] == "running"]
    assert running == ids
    assert events[-1].event == "status" and events[-1].data == {"status": "idle", "reply_to": ids[-1]}


async def test_a_failed_reply_shows_an_error_for_its_message(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    message_id = await chat.send(token, "please fail", client_id="f1")
    await _drainer(chat).drain(SessionKey(session))
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:
        events = await read_sse(resp, 5)
    errors = [e for e in events if e.event == "reply_error"]
    assert not [e for e in events if e.event == "error"], "a browser's EventSource takes an `error` event for a failure"
    assert len(errors) == 1 and errors[0].data is not None
    assert errors[0].data["reply_to"] == message_id and errors[0].data["code"] == "dead_lettered"
    assert not [e for e in events if e.event == "message"]


async def test_a_zombie_drain_cannot_write_to_the_stream(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = SessionKey(await chat.session_key(token))
    keys = SessionKeys(session)
    await chat.send(token, "hello", client_id="z1")
    stale = await chat.lease(session)  # a worker took the session, then froze past its lease
    await chat.redis.delete(keys.lease)
    await _drainer(chat).drain(session)  # another worker answered meanwhile
    before = await chat.redis.xrange(keys.web)
    reset = CURRENT_LEASE.set(stale)
    try:
        with pytest.raises(FencedWriteError):
            await chat.publisher.publish(session, "message", {"text": "stale reply", "reply_to": "x"})
    finally:
        CURRENT_LEASE.reset(reset)
    assert await chat.redis.xrange(keys.web) == before


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("/help", "/whoami — Who I think you are, and your role"),
        ("/whoami", "(role: user)"),
        ("/status", "Messages waiting: 0"),
        ("/model", "/model is not available to you here"),
    ],
)
async def test_the_web_chat_has_no_menu_but_typed_commands_are_answered(chat: Chat, typed: str, expected: str) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:
        await chat.send(token, typed, client_id="c1")
        await _drainer(chat).drain(SessionKey(session))
        live = await read_sse(resp, 5)
    [message] = [text for kind, text in _summary(live) if kind == "message"]
    assert message is not None and expected in message and "You said" not in message  # not the runner's answer
