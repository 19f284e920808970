"""The web channel adapter and the fenced web stream publisher."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from switchboard.channels.base import RawRequest
from switchboard.channels.web import WebChannel, parse_post, split_session_key
from switchboard.core.actions import OfferChoice, SendError, SendFile, SendText, SendTyping, SetStatus, StreamDelta
from switchboard.core.messages import ConversationRef
from switchboard.errors import BodyTooLargeError, DeliveryError, FencedWriteError, MalformedBodyError
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.lease import CURRENT_LEASE, Lease
from switchboard.queue.webstream import parse_event_id, replay
from switchboard.types import SessionKey

from .conftest import Chat

PAYLOADS = Path(__file__).resolve().parent.parent / "payloads" / "web"
CONVERSATION = ConversationRef(agent="assistant", channel="web", conversation="abc123")


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[SessionKey, str, dict[str, Any]]] = []

    async def __call__(self, session: SessionKey, kind: str, data: dict[str, Any]) -> str:
        self.calls.append((session, kind, data))
        return f"{len(self.calls)}-0"


# ---- perform: actions → web stream events ----


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        (StreamDelta(text="Hel", reply_to="m1"), ("delta", {"text": "Hel", "reply_to": "m1"})),
        (SendText(text="**Hello**", reply_to="m1"), ("message", {"text": "**Hello**", "reply_to": "m1"})),
        (SetStatus(status="running", reply_to="m1"), ("status", {"status": "running", "reply_to": "m1"})),
        (SetStatus(status="idle"), ("status", {"status": "idle"})),
        (
            SendError(code="timeout", message="The model took too long.", reply_to="m1"),
            ("reply_error", {"reply_to": "m1", "code": "timeout", "message": "The model took too long."}),
        ),
    ],
)
async def test_actions_become_web_stream_events(action: Any, expected: tuple[str, dict[str, Any]]) -> None:
    recorder = Recorder()
    receipt = await WebChannel(recorder).perform(action, CONVERSATION, idempotency_key="k")
    assert recorder.calls == [(CONVERSATION.session_key, *expected)]
    assert receipt.platform_ids == ("1-0",)


async def test_typing_publishes_nothing() -> None:
    recorder = Recorder()
    receipt = await WebChannel(recorder).perform(SendTyping(reply_to="m1"), CONVERSATION, idempotency_key="k")
    assert recorder.calls == [] and receipt.parts == 0


async def test_a_choice_is_a_message_with_numbered_options() -> None:
    recorder = Recorder()
    choice = OfferChoice(question="Which plan?", options=["Basic", "Pro"], reply_to="m1")
    await WebChannel(recorder).perform(choice, CONVERSATION, idempotency_key="k")
    expected = {"text": "Which plan?\n\n1. Basic\n2. Pro", "reply_to": "m1"}
    assert recorder.calls == [(CONVERSATION.session_key, "message", expected)]


async def test_a_file_is_refused_so_the_agent_is_not_told_it_arrived() -> None:
    recorder = Recorder()
    with pytest.raises(DeliveryError, match="cannot receive files") as caught:
        await WebChannel(recorder).perform(SendFile(path="/w/report.pdf"), CONVERSATION, idempotency_key="k")
    assert not caught.value.retryable and recorder.calls == []


async def test_perform_without_a_publisher_is_a_delivery_error() -> None:
    with pytest.raises(DeliveryError):
        await WebChannel(None).perform(SendText(text="x"), CONVERSATION, idempotency_key="k")


def test_channel_shape() -> None:
    channel = WebChannel(Recorder(), agent="support", tenant="acme")
    assert channel.name == "web" and channel.streams is True
    conv = channel.conversation("c1")
    assert conv.session_key == "acme/support/web/default/c1"
    assert channel.conversation("c1", agent="other").agent == "other"
    raw = RawRequest("POST", "/api/chat/messages", {}, {}, b"{}")
    assert channel.handshake(raw) is None
    channel.verify(raw)  # nothing to check: the web tier authenticated the token


# ---- parse: the sample payloads ----


def _payloads() -> list[Path]:
    found = sorted(PAYLOADS.glob("*.json"))
    assert found, "tests/payloads/web/ holds sample payloads"
    return found


@pytest.mark.parametrize("path", _payloads(), ids=lambda p: p.stem)
def test_sample_payloads_parse_into_one_message_of_the_session(path: Path) -> None:
    body = path.read_bytes()
    raw_json = json.loads(body)
    session = CONVERSATION.session_key
    [message] = WebChannel(Recorder()).parse(RawRequest("POST", "/api/chat/messages", {}, {"session": session}, body))
    assert message.session_key == session
    assert message.conversation == CONVERSATION
    assert message.text == raw_json["text"]
    assert message.id == ""
    if "client_id" in raw_json:
        assert message.dedup_key == raw_json["client_id"]
    else:
        again = WebChannel(Recorder()).parse(RawRequest("POST", "/", {}, {"session": session}, body))[0]
        assert message.dedup_key and again.dedup_key != message.dedup_key


def test_parse_needs_a_resolved_web_session() -> None:
    body = b'{"text": "hi"}'
    with pytest.raises(MalformedBodyError):
        WebChannel(Recorder()).parse(RawRequest("POST", "/", {}, {}, body))
    with pytest.raises(MalformedBodyError):
        WebChannel(Recorder()).parse(RawRequest("POST", "/", {}, {"session": "t/a/telegram/default/1"}, body))


def test_split_session_key_inverts_session_key() -> None:
    odd = ConversationRef(tenant="t 1", agent="a/b", channel="web", conversation="x{y}")
    assert split_session_key(odd.session_key) == odd


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"{", MalformedBodyError),
        (b'{"text": ""}', MalformedBodyError),
        (b'{"text": "x", "client_id": "a\\nb"}', MalformedBodyError),
        (json.dumps({"text": "ß" * (16 * 1024 + 1)}).encode(), BodyTooLargeError),
    ],
)
def test_parse_post_refuses_bad_bodies(body: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_post(body)


def test_parse_event_id() -> None:
    assert parse_event_id("0") is None
    assert parse_event_id("1700000000000-3") == "1700000000000-3"
    assert parse_event_id(" 1700000000000 ") == "1700000000000"
    with pytest.raises(ValueError):
        parse_event_id("1700000000000-3; DROP")


# ---- the fenced publisher ----


async def test_publish_without_a_lease_is_refused_and_writes_nothing(chat: Chat) -> None:
    session = SessionKey("default/assistant/web/default/s1")
    with pytest.raises(FencedWriteError):
        await chat.publisher.publish(session, "message", {"text": "x", "reply_to": "m"})
    assert await chat.redis.exists(SessionKeys(session).web) == 0


async def test_publish_under_another_sessions_lease_is_refused(chat: Chat) -> None:
    mine = SessionKey("default/assistant/web/default/s1")
    other = SessionKey("default/assistant/web/default/s2")
    lease = await chat.lease(mine)
    reset = CURRENT_LEASE.set(lease)
    try:
        with pytest.raises(FencedWriteError):
            await chat.publisher.publish(other, "message", {"text": "x", "reply_to": "m"})
    finally:
        CURRENT_LEASE.reset(reset)
    assert await chat.redis.exists(SessionKeys(other).web) == 0


async def test_publish_after_the_lease_passed_on_is_refused_and_counted(chat: Chat) -> None:
    session = SessionKey("default/assistant/web/default/s1")
    stale = await chat.lease(session)
    await chat.redis.delete(SessionKeys(session).lease)  # the lease expired ...
    fresh = await Lease(chat.redis, worker_id="other", lease_ms=60_000).acquire(session)  # ... and passed on
    assert fresh is not None and fresh.epoch > stale.epoch
    reset = CURRENT_LEASE.set(stale)
    try:
        with pytest.raises(FencedWriteError):
            await chat.publisher.publish(session, "message", {"text": "stale", "reply_to": "m"})
    finally:
        CURRENT_LEASE.reset(reset)
    assert await chat.redis.exists(SessionKeys(session).web) == 0
    assert int(await chat.redis.get(GlobalKeys().fenced_rejections) or 0) == 1


async def test_unknown_event_type_is_refused(chat: Chat) -> None:
    session = SessionKey("default/assistant/web/default/s1")
    reset = CURRENT_LEASE.set(await chat.lease(session))
    try:
        with pytest.raises(ValueError):
            await chat.publisher.publish(session, "typing", {})
    finally:
        CURRENT_LEASE.reset(reset)


async def test_final_message_replaces_its_deltas_in_the_retained_history(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    first = await chat.send(token, "one", client_id="c1")
    second = await chat.send(token, "two", client_id="c2")
    await chat.as_worker(
        session,
        [
            ("status", {"status": "running", "reply_to": first}),
            ("delta", {"text": "o", "reply_to": first}),
            ("delta", {"text": "ne", "reply_to": first}),
            ("message", {"text": "one!", "reply_to": first}),
            ("status", {"status": "running", "reply_to": second}),
            ("delta", {"text": "tw", "reply_to": second}),
        ],
    )
    events = await replay(chat.redis, session, None)
    kinds = [(e.type, e.data.get("reply_to"), e.data.get("text")) for e in events]
    assert ("delta", first, "o") not in kinds and ("delta", first, "ne") not in kinds
    assert ("message", first, "one!") in kinds
    assert ("delta", second, "tw") in kinds  # still streaming: kept


async def test_an_error_keeps_the_partial_reply(chat: Chat) -> None:
    session = SessionKey("default/assistant/web/default/s1")
    await chat.as_worker(
        session,
        [
            ("delta", {"text": "partial", "reply_to": "m"}),
            ("reply_error", {"reply_to": "m", "code": "model_error", "message": "The model failed."}),
        ],
    )
    assert [e.type for e in await replay(chat.redis, session, None)] == ["delta", "reply_error"]


async def test_replay_adds_the_gateway_id_to_user_events(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    with_id = await chat.send(token, "a", client_id="given")
    without = await chat.send(token, "b")
    users = [e for e in await replay(chat.redis, session, None) if e.type == "user"]
    assert [u.data["message_id"] for u in users] == [with_id, without]
