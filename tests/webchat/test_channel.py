"""The web channel adapter and the fenced web stream publisher."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from switchboard.channels.base import FileData, RawRequest
from switchboard.channels.web.adapter import MAX_FILE_BYTES, WebChannel, parse_post, split_session_key
from switchboard.core.actions import (
    AckChoice,
    ApprovalCard,
    Choice,
    EditText,
    OfferChoice,
    SendError,
    SendFile,
    SendText,
    SendTyping,
    SetStatus,
    SettleChoices,
    ShowToolCall,
    StreamDelta,
    StreamText,
    ToolFile,
)
from switchboard.core.messages import Attachment, ChoiceSelected, ConversationRef, Posted
from switchboard.errors import (
    AttachmentError,
    BodyTooLargeError,
    DeliveryError,
    FencedWriteError,
    MalformedBodyError,
)
from switchboard.outbound.outbox import Ephemeral
from switchboard.outbound.webstream import parse_event_id, replay
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import CURRENT_LEASE, Lease
from switchboard.queue.stats import fenced_total
from switchboard.types import SessionKey

from .conftest import Chat

PAYLOADS = Path(__file__).resolve().parent.parent / "payloads" / "web"
CONVERSATION = ConversationRef(agent="assistant", channel="web", conversation="abc123")


SEND = Ephemeral("k")


class WorkspaceFiles:
    """A send context whose workspace holds the given files (the outbox's reads them from the session workspace)."""

    def __init__(self, files: dict[str, FileData]) -> None:
        self.files = files

    @property
    def idempotency_key(self) -> str:
        return "k"

    @property
    def sent(self) -> tuple[str, ...]:
        return ()

    async def part_sent(self, platform_id: str) -> None:
        return None

    async def pace(self) -> None:
        return None

    async def read_file(self, path: str) -> FileData:
        if path not in self.files:
            raise DeliveryError(f"no such file: {path}", channel="web", retryable=False)
        return self.files[path]


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
        (
            SendText(text="Nothing was running.", reply_to="m1", notice=True),
            ("message", {"text": "Nothing was running.", "reply_to": "m1", "notice": True}),
        ),
        (
            ShowToolCall(call_id="c1", tool="shell", title="shell: ls", arguments='{"commands":["ls"]}',
                         state="ok", started_at=1.5, duration_ms=2.0, exit_status=0, output_head="a.txt",
                         files=(ToolFile(name="a.txt", path="out/a.txt"),), reply_to="m1"),
            ("tool", {"reply_to": "m1", "call_id": "c1", "tool": "shell", "title": "shell: ls",
                      "arguments": '{"commands":["ls"]}', "state": "ok", "started_at": 1.5, "duration_ms": 2.0,
                      "exit_status": 0, "output_head": "a.txt", "output_tail": "", "omitted_lines": 0,
                      "files": [{"name": "a.txt", "path": "out/a.txt"}]}),
        ),
        (
            SettleChoices(ids=("a", "d"), chosen="a", label="Approved", by="console:alice", reply_to="m2"),
            ("choices_settled", {"ids": ["a", "d"], "chosen": "a", "label": "Approved", "by": "console:alice"}),
        ),
        (
            OfferChoice(question="Run it?", options=[Choice(id="a", label="Approve"), Choice(id="d", label="Deny")],
                        approval=ApprovalCard(id="ap1", tool="shell", title="shell: rm x", reason="why",
                                              expires_at=9.0), reply_to="m1"),
            ("message", {"text": "Approval needed before this runs.", "reply_to": "m1",
                         "choices": [{"id": "a", "label": "Approve"}, {"id": "d", "label": "Deny"}],
                         "approval": {"id": "ap1", "tool": "shell", "title": "shell: rm x", "reason": "why",
                                      "expires_at": 9.0}}),
        ),
    ],
)  # fmt: skip
async def test_actions_become_web_stream_events(action: Any, expected: tuple[str, dict[str, Any]]) -> None:
    recorder = Recorder()
    receipt = await WebChannel(recorder).perform(action, CONVERSATION, SEND)
    assert recorder.calls == [(CONVERSATION.session_key, *expected)]
    assert receipt.platform_ids == ("1-0",)


async def test_typing_publishes_nothing() -> None:
    recorder = Recorder()
    receipt = await WebChannel(recorder).perform(SendTyping(reply_to="m1"), CONVERSATION, SEND)
    assert recorder.calls == [] and receipt.parts == 0


async def test_a_choice_is_a_message_with_the_question_alone_and_button_ids() -> None:
    recorder = Recorder()
    options = [Choice(id="basic", label="Basic"), Choice(id="pro", label="Pro")]
    await WebChannel(recorder).perform(
        OfferChoice(question="Which plan?", options=options, reply_to="m1"), CONVERSATION, SEND
    )
    expected = {
        "text": "Which plan?",  # the buttons are the options: no numbered list repeating them
        "reply_to": "m1",
        "choices": [{"id": "basic", "label": "Basic"}, {"id": "pro", "label": "Pro"}],
    }
    assert recorder.calls == [(CONVERSATION.session_key, "message", expected)]


async def test_a_small_file_is_read_through_the_send_context_and_published_inline() -> None:
    recorder = Recorder()
    files = WorkspaceFiles({"out/report.csv": FileData("report.csv", b"a,b\n1,2\n", "text/csv")})
    await WebChannel(recorder).perform(
        SendFile(path="out/report.csv", caption="Here", reply_to="m1"), CONVERSATION, files
    )
    [(_, kind, data)] = recorder.calls
    assert kind == "message" and data["reply_to"] == "m1"
    assert data["text"] == "Here"  # the caption alone: the page shows the file's name on its card
    assert data["file"] == {"name": "report.csv", "mime_type": "text/csv", "data": "YSxiCjEsMgo=", "size": 8}


async def test_a_missing_or_too_large_file_is_refused_so_the_agent_is_not_told_it_arrived() -> None:
    recorder = Recorder()
    big = WorkspaceFiles({"big.bin": FileData("big.bin", b"x" * (MAX_FILE_BYTES + 1), None)})
    with pytest.raises(DeliveryError, match="KiB") as caught:
        await WebChannel(recorder).perform(SendFile(path="big.bin"), CONVERSATION, big)
    assert not caught.value.retryable
    with pytest.raises(DeliveryError, match="no such file"):
        await WebChannel(recorder).perform(SendFile(path="gone.txt"), CONVERSATION, big)
    assert recorder.calls == []


async def test_a_native_stream_is_shown_as_deltas_then_the_whole_reply() -> None:
    recorder = Recorder()
    channel = WebChannel(recorder)
    opened = await channel.perform(StreamText(text="Hel", reply_to="m1"), CONVERSATION, SEND)
    await channel.perform(StreamText(handle=opened.handle, text="Hello", sent=3, reply_to="m1"), CONVERSATION, SEND)
    await channel.perform(
        StreamText(handle=opened.handle, text="Hello!", sent=5, final=True, reply_to="m1"), CONVERSATION, SEND
    )
    assert opened.handle
    assert [(kind, data["text"]) for _, kind, data in recorder.calls] == [
        ("delta", "Hel"),
        ("delta", "lo"),
        ("message", "Hello!"),
    ]


async def test_an_edit_is_refused_and_a_click_acknowledgement_publishes_nothing() -> None:
    recorder = Recorder()
    with pytest.raises(DeliveryError) as caught:
        await WebChannel(recorder).perform(EditText(message_id="1-0", text="x"), CONVERSATION, SEND)
    assert not caught.value.retryable
    receipt = await WebChannel(recorder).perform(AckChoice(ack_ref="c1"), CONVERSATION, SEND)
    assert receipt.parts == 0 and recorder.calls == []


async def test_perform_without_a_publisher_is_a_delivery_error() -> None:
    with pytest.raises(DeliveryError):
        await WebChannel(None).perform(SendText(text="x"), CONVERSATION, SEND)


async def test_channel_shape() -> None:
    channel = WebChannel(Recorder())
    assert channel.name == "web" and channel.account == "default"
    assert channel.capabilities.streaming == "transport" and not channel.capabilities.edits
    assert channel.listener() is None
    raw = RawRequest("POST", "/api/chat/messages", {}, {}, b"{}")
    await channel.verify(raw)  # nothing to check: the web tier authenticated the token
    with pytest.raises(AttachmentError):
        await channel.fetch(Attachment(kind="image", ref="x"), CONVERSATION, 1024)


# ---- parse: the sample payloads ----


def _payloads() -> list[Path]:
    found = sorted(PAYLOADS.glob("*.json"))
    assert found, "tests/payloads/web/ holds sample payloads"
    return found


@pytest.mark.parametrize("path", _payloads(), ids=lambda p: p.stem)
async def test_sample_payloads_parse_into_one_message_of_the_session(path: Path) -> None:
    body = path.read_bytes()
    raw_json = json.loads(body)
    session = CONVERSATION.session_key
    raw = RawRequest("POST", "/api/chat/messages", {}, {"session": session}, body)
    [message] = (await WebChannel(Recorder()).receive(raw)).messages
    assert message.session_key == session
    assert message.conversation == CONVERSATION
    assert message.text == raw_json.get("text", raw_json.get("choice"))
    assert message.id == ""
    assert message.event == (ChoiceSelected(option_id=raw_json["choice"]) if "choice" in raw_json else Posted())
    if "client_id" in raw_json:
        assert message.dedup_key == raw_json["client_id"]
    else:
        again = (
            await WebChannel(Recorder()).receive(RawRequest("POST", "/", {}, {"session": session}, body))
        ).messages[0]
        assert message.dedup_key and again.dedup_key != message.dedup_key


async def test_receive_needs_a_resolved_web_session() -> None:
    body = b'{"text": "hi"}'
    with pytest.raises(MalformedBodyError):
        await WebChannel(Recorder()).receive(RawRequest("POST", "/", {}, {}, body))
    with pytest.raises(MalformedBodyError):
        await WebChannel(Recorder()).receive(RawRequest("POST", "/", {}, {"session": "t/a/telegram/default/1"}, body))


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
        (b'{"choice": ""}', MalformedBodyError),
        (b'{"choice": 7}', MalformedBodyError),
        (json.dumps({"choice": "x" * 65}).encode(), MalformedBodyError),
        (b'{"choice": "a\\u0000b"}', MalformedBodyError),
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
    assert await fenced_total(chat.redis) == 1


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
