"""The Discord adapter: sample payloads normalised, Ed25519 verification, sends against the fake REST API."""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from switchboard.channels.base import FileData
from switchboard.channels.discord.adapter import DiscordChannel, problems
from switchboard.channels.discord.factory import FACTORY
from switchboard.channels.discord.fake.platform import FakeDiscord
from switchboard.channels.discord.inbound import DiscordInbound, load_interaction, parse_interaction
from switchboard.channels.discord.outbound import message_nonce
from switchboard.channels.registry import BuildContext, factory
from switchboard.channels.render.discord import utf16_len
from switchboard.channels.render.markdown import FENCE as _FENCE
from switchboard.core.actions import (
    AckChoice,
    Choice,
    EditText,
    OfferChoice,
    SendError,
    SendFile,
    SendText,
    SendTyping,
    StreamText,
)
from switchboard.core.inbound import event_text
from switchboard.core.messages import (
    Attachment,
    ChoiceSelected,
    CommandIssued,
    ConversationRef,
    MessageDeleted,
    MessageEdited,
    Posted,
)
from switchboard.errors import AttachmentError, DeliveryError, MalformedBodyError, RateLimitedError
from tests.channels._discord_fixtures import (
    APP_ID,
    BOT_ID,
    TOKEN,
    Sending,
    channel,
    fake,
    settings,
    signed,
)

__all__ = ["channel", "fake"]  # fixtures, imported for pytest

PAYLOADS = Path(__file__).resolve().parent.parent / "payloads" / "discord"
NO_MENTIONS = {"parse": []}


@dataclass(frozen=True)
class Draft:
    kind: str
    text: str
    conversation: str
    thread: str | None = None
    sender: str = "501"
    answer: bytes | None = None
    option: str | None = None
    attachments: int = 0


IGNORED = "ignored"
MALFORMED = "malformed"
PONG = b'{"type":1}'
CASES: dict[str, Draft | bytes | str] = {
    "interaction_ping": PONG,
    "interaction_ask": Draft("command", "what's the deploy status?", "300", answer=b'{"type":5}'),
    "interaction_ask_dm": Draft("command", "hello from a DM", "300", answer=b'{"type":5}'),
    "interaction_ask_in_thread": Draft("command", "and in the thread?", "300", thread="310", answer=b'{"type":5}'),
    "interaction_stop": Draft("command", "", "300"),
    "interaction_reset": Draft("command", "", "300"),
    "interaction_component": Draft("choice", "Approve", "300", answer=b'{"type":6}', option="approve:42"),
    "interaction_string_select": Draft("choice", "Bananas", "300", answer=b'{"type":6}', option="fruit.banana"),
    "interaction_user_select": b'{"type":6}',  # acknowledged; a user picker answers no offer
    "interaction_malformed": MALFORMED,
    "interaction_user_command": Draft(
        "command", "[target user: Grace H. (@grace, id 777)]", "300", answer=b'{"type":5}'
    ),
    "interaction_message_command": Draft(
        "command",
        "[target message 1250000000000000777 by Grace (id 777): The deploy failed at step 3: migrations timed out.]",
        "300",
        answer=b'{"type":5}',
        attachments=1,
    ),
    "gateway_dm_message": Draft("message", "hello there, bot", "300"),
    "gateway_dm_with_attachment": Draft("message", "", "300", attachments=1),
    "gateway_guild_mention": Draft("message", "what's the deploy status?", "301"),
    "gateway_guild_no_mention": IGNORED,
    "gateway_thread_mention": Draft("message", "and in the thread?", "301", thread="310"),
    "gateway_own_message": IGNORED,
    "gateway_other_bot": IGNORED,
    "gateway_webhook_message": IGNORED,
    "gateway_system_message": IGNORED,
    "gateway_dm_edit": Draft("edited", "hello there, bot (edited)", "300"),
    "gateway_dm_delete": Draft("deleted", "", "300"),
}


def test_payload_table_covers_every_sample() -> None:
    assert sorted(p.stem for p in PAYLOADS.glob("*.json")) == sorted(CASES)


def _check(draft: Any, expected: Draft, data: dict[str, Any]) -> None:
    assert draft.id == "" and draft.conversation.agent == "" and draft.conversation.channel == "discord"
    assert draft.event.kind == expected.kind
    assert draft.text == expected.text
    assert draft.conversation.conversation == expected.conversation
    assert draft.conversation.thread == expected.thread
    assert draft.conversation.extra["channel_id"] == (expected.thread or expected.conversation)
    assert draft.sender.id == expected.sender and not draft.sender.is_bot
    match draft.event:
        case ChoiceSelected():
            assert draft.event.option_id == expected.option
            assert draft.event.offer_message_id == data["message"]["id"] and draft.event.ack_ref is None
        case Posted():
            assert len(draft.event.attachments) == expected.attachments
        case CommandIssued():
            assert draft.event.name == data["data"]["name"].lower()
            assert len(draft.event.attachments) == expected.attachments
        case MessageEdited() | MessageDeleted():
            assert draft.event.original_id == data["id"]


@pytest.mark.parametrize("name", sorted(n for n in CASES if n.startswith("interaction_")))
async def test_sample_interaction(channel: DiscordChannel, name: str) -> None:
    body = (PAYLOADS / f"{name}.json").read_bytes()
    raw = signed(body)
    await channel.verify(raw)
    expected = CASES[name]
    if expected == MALFORMED:
        with pytest.raises(MalformedBodyError) as caught:
            await channel.receive(raw)
        assert caught.value.status == 400
        return
    inbound = await channel.receive(raw)
    if isinstance(expected, bytes):
        assert inbound.messages == () and inbound.answer.body == expected
        assert inbound.answer.status == 200 and inbound.answer.content_type == "application/json"
        return
    assert isinstance(expected, Draft)
    data = json.loads(body)
    [draft] = inbound.messages
    assert draft.dedup_key == f"i:{data['id']}"
    assert draft.conversation.extra["interaction_token"] == data["token"]
    assert int(draft.conversation.extra["interaction_expires"]) > time.time() + 14 * 60
    _check(draft, expected, data)
    if expected.answer is not None:
        assert inbound.answer.body == expected.answer
    else:  # /stop and /reset are confirmed at once, privately, rather than left "thinking"
        answer = json.loads(inbound.answer.body)
        assert answer["type"] == 4 and answer["data"]["flags"] == 64


@pytest.mark.parametrize("name", sorted(n for n in CASES if n.startswith("gateway_")))
def test_sample_gateway_dispatch(name: str) -> None:
    loaded = json.loads((PAYLOADS / f"{name}.json").read_text())
    frames = loaded if isinstance(loaded, list) else [loaded]
    inbound = DiscordInbound("default", BOT_ID)
    if name in ("gateway_dm_edit", "gateway_dm_delete"):  # the message they change was seen first
        first = json.loads((PAYLOADS / "gateway_dm_message.json").read_text())
        assert inbound.dispatch(first["t"], first["d"]) is not None
    drafts = [inbound.dispatch(f["t"], f["d"]) for f in frames]
    *before, last = drafts
    assert before == [None] * len(before)  # THREAD_CREATE only teaches the thread's parent
    expected = CASES[name]
    if expected == IGNORED:
        assert last is None
        return
    assert isinstance(expected, Draft) and last is not None
    data = frames[-1]["d"]
    key = {"message": "m:{id}", "edited": "e:{id}:{edited_timestamp}", "deleted": "d:{id}"}[expected.kind]
    assert last.dedup_key == key.format(**data)
    _check(last, expected, data)


def test_a_context_menu_command_reads_its_name_and_target() -> None:
    user = load_interaction((PAYLOADS / "interaction_user_command.json").read_bytes())
    draft = parse_interaction(user, "default")
    assert draft is not None and event_text(draft) == "/report user [target user: Grace H. (@grace, id 777)]"
    assert draft.meta["target_id"] == "777"
    data = json.loads((PAYLOADS / "interaction_message_command.json").read_bytes())
    draft = parse_interaction(load_interaction(data), "default")
    assert draft is not None and isinstance(draft.event, CommandIssued)
    [log] = draft.event.attachments  # the target message's file, fetched like any the user sent
    [wire] = data["data"]["resolved"]["messages"]["1250000000000000777"]["attachments"]
    assert (log.kind, log.name, log.ref) == ("document", "deploy.log", wire["url"])
    assert event_text(draft) == (
        "/summarise [target message 1250000000000000777 by Grace (id 777): "
        "The deploy failed at step 3: migrations timed out.]"
    )
    del data["data"]["resolved"]  # Discord always resolves the target; without it the id is all there is
    draft = parse_interaction(load_interaction(data), "default")
    assert draft is not None and draft.text == "[target message 1250000000000000777]"


def test_delete_of_a_guild_message_the_agent_never_saw_is_ignored() -> None:
    inbound = DiscordInbound("default", BOT_ID)
    assert inbound.dispatch("MESSAGE_DELETE", {"id": "1", "channel_id": "301", "guild_id": "200"}) is None


def test_guild_messages_without_a_mention_reach_the_agent_when_mentions_are_not_required() -> None:
    frame = json.loads((PAYLOADS / "gateway_guild_no_mention.json").read_text())
    draft = DiscordInbound("default", BOT_ID, require_mention=False).dispatch(frame["t"], frame["d"])
    assert draft is not None and draft.text == "just chatting among humans"


def test_attachment_reference_is_the_cdn_url() -> None:
    frame = json.loads((PAYLOADS / "gateway_dm_with_attachment.json").read_text())
    draft = DiscordInbound("default", BOT_ID).dispatch(frame["t"], frame["d"])
    assert draft is not None and isinstance(draft.event, Posted)
    [attachment] = draft.event.attachments
    assert attachment.ref == frame["d"]["attachments"][0]["url"]
    assert (attachment.kind, attachment.name, attachment.size) == ("document", "report.pdf", 48213)


def test_problems_name_what_is_missing_and_the_factory_is_registered() -> None:
    assert problems(settings()) == []
    found = problems(settings(public_key="zz", bot_token="not-a-token", application_id="app"))
    assert len(found) == 3 and any("PUBLIC_KEY" in p for p in found) and any("BOT_TOKEN" in p for p in found)
    assert problems(settings(public_key=None)) == []  # the gateway alone: slash commands are refused, messages arrive
    assert "SWITCHBOARD_DISCORD__PUBLIC_KEY is not set" in problems(settings(public_key=None, gateway=False))[0]
    assert factory("discord") is FACTORY
    built = FACTORY.build(settings(), BuildContext(account="support"))
    assert isinstance(built, DiscordChannel) and built.account == "support" and built.bot_id == BOT_ID


# sends ----------------------------------------------------------------------------------------------------------


def _dm(channel_id: str = "300", **extra: str) -> ConversationRef:
    return ConversationRef(channel="discord", conversation=channel_id, extra={"channel_id": channel_id, **extra})


def _interaction_ref(token: str, channel_id: str = "300", expires_in: float = 900) -> ConversationRef:
    extra = {
        "interaction_token": token,
        "application_id": APP_ID,
        "interaction_expires": str(int(time.time() + expires_in)),
    }
    return _dm(channel_id, **extra)


def _balanced(part: str) -> bool:
    fence: str | None = None
    for line in part.split("\n"):
        match = _FENCE.match(line)
        if match and fence is None:
            fence = match.group(1)
        elif (
            match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence) and not match.group(2).strip()
        ):  # type: ignore[index]
            fence = None
    return fence is None


async def test_reply_carries_nonce_enforce_nonce_and_no_mentions(channel: DiscordChannel, fake: FakeDiscord) -> None:
    send = Sending()
    receipt = await channel.perform(SendText(text="hi @everyone <@123>"), _dm(reply_to="42"), send)
    [call] = [c for c in fake.calls if c.route == "POST /channels/{channel_id}/messages"]
    body = call.body
    assert body["content"] == "hi @everyone <@123>" and body["allowed_mentions"] == NO_MENTIONS
    assert body["nonce"] == message_nonce(send.idempotency_key, 0) and len(body["nonce"]) <= 25
    assert body["enforce_nonce"] is True
    assert body["message_reference"] == {"message_id": "42", "fail_if_not_exists": False}
    assert receipt.platform_ids == send.sent and send.paced == 1


async def test_a_resent_reply_is_deduplicated_by_discord(channel: DiscordChannel, fake: FakeDiscord) -> None:
    first = await channel.perform(SendText(text="once"), _dm(), Sending())
    again = await channel.perform(SendText(text="once"), _dm(), Sending())  # a retry that lost its progress
    assert again.platform_ids == first.platform_ids
    assert [c.deduplicated for c in fake.calls if c.route.startswith("POST /channels")] == [False, True]
    assert len(fake.state.sent("300")) == 1


async def test_twenty_thousand_characters_arrive_complete_and_well_formed(
    channel: DiscordChannel, fake: FakeDiscord
) -> None:
    code = "\n".join(f"line_{i} = {i} * 2  # 🙂" for i in range(400))
    prose = " ".join(f"word{i}" for i in range(1400))
    text = f"# Report\n\n{prose}\n\n```python\n{code}\n```\n\nThe end. " + "x" * 200
    assert len(text) > 20_000
    receipt = await channel.perform(SendText(text=text), _dm(), Sending())
    contents = [m["content"] for m in fake.state.sent("300")]
    assert len(contents) == receipt.parts > 10
    assert all(utf16_len(c) <= 2000 and c.strip() for c in contents)
    assert all(_balanced(c) for c in contents)
    words = re.findall(r"word\d+|line_\d+", "\n".join(contents))
    assert words == re.findall(r"word\d+|line_\d+", text)  # nothing lost, nothing repeated, in order
    assert contents[-1].endswith("x" * 200)


async def test_429_is_raised_with_retry_after_and_the_retry_keeps_order(
    channel: DiscordChannel, fake: FakeDiscord
) -> None:
    parts_text = "\n\n".join(f"part {i} " + "y" * 1900 for i in range(4))
    fake.state.fail_next(1, retry_after=0.25, route="/channels/{channel_id}/messages", after=2)
    send = Sending()
    with pytest.raises(RateLimitedError) as caught:
        await channel.perform(SendText(text=parts_text), _dm(), send)
    assert caught.value.retry_after == pytest.approx(0.25)
    assert len(send.sent) == 2
    await asyncio.sleep(caught.value.retry_after)
    receipt = await channel.perform(SendText(text=parts_text), _dm(), send)  # the outbox's retry
    contents = [m["content"] for m in fake.state.sent("300")]
    assert [c.split(" ", 2)[1] for c in contents] == ["0", "1", "2", "3"]
    assert receipt.platform_ids == send.sent and len(set(send.sent)) == 4


async def test_bucket_headers_are_honoured_before_sending(channel: DiscordChannel, fake: FakeDiscord) -> None:
    fake.state.bucket_limit, fake.state.bucket_window = 2, 0.3
    text = "\n\n".join(f"chunk {i} " + "z" * 1950 for i in range(6))
    await channel.perform(SendText(text=text), _dm(), Sending())
    calls = [c for c in fake.calls if c.route.startswith("POST /channels")]
    assert [c.status for c in calls] == [200] * 6  # waited for each refill rather than running into 429s


async def test_a_long_empty_bucket_raises_rather_than_blocking(channel: DiscordChannel, fake: FakeDiscord) -> None:
    fake.state.bucket_limit, fake.state.bucket_window = 1, 30.0
    await channel.perform(SendText(text="one"), _dm(), Sending("k1"))
    with pytest.raises(RateLimitedError) as caught:
        await channel.perform(SendText(text="two"), _dm(), Sending("k2"))
    assert 1 < caught.value.retry_after <= 30
    assert len([c for c in fake.calls if c.route.startswith("POST /channels")]) == 1


async def test_global_429_holds_every_route(channel: DiscordChannel, fake: FakeDiscord) -> None:
    fake.state.fail_next(1, retry_after=5, is_global=True)
    with pytest.raises(RateLimitedError):
        await channel.perform(SendText(text="a"), _dm("1"), Sending("k1"))
    with pytest.raises(RateLimitedError) as caught:
        await channel.perform(SendText(text="b"), _dm("2"), Sending("k2"))  # another channel: not even sent
    assert caught.value.retry_after > 4 and len(fake.calls) == 2  # users/@me + the one 429


async def test_5xx_is_retryable_and_4xx_is_not(channel: DiscordChannel, fake: FakeDiscord) -> None:
    fake.state.refuse_next(1, status=502)
    with pytest.raises(DeliveryError) as caught:
        await channel.perform(SendText(text="a"), _dm(), Sending())
    assert caught.value.retryable
    fake.state.refuse_next(1, status=403)
    with pytest.raises(DeliveryError) as refused:
        await channel.perform(SendText(text="a"), _dm(), Sending("k2"))
    assert not refused.value.retryable and TOKEN not in str(refused.value)


async def test_slow_answers_still_arrive(channel: DiscordChannel, fake: FakeDiscord) -> None:
    fake.state.slow_next(1, delay=0.3, route="/channels/{channel_id}/messages")
    receipt = await channel.perform(SendText(text="patience"), _dm(), Sending())
    assert fake.state.messages[receipt.platform_ids[0]]["content"] == "patience"


async def test_interaction_reply_edits_original_then_follows_up(channel: DiscordChannel, fake: FakeDiscord) -> None:
    token = "tok-1"
    fake.state.interaction(token, "300")
    text = "\n\n".join(f"p{i} " + "w" * 1900 for i in range(3))
    receipt = await channel.perform(SendText(text=text), _interaction_ref(token), Sending())
    routes = [(c.method, c.route) for c in fake.calls[1:]]
    assert routes == [
        ("GET", "GET /webhooks/{application_id}/{token}/messages/{message_id}"),
        ("PATCH", "PATCH /webhooks/{application_id}/{token}/messages/{message_id}"),
        ("POST", "POST /webhooks/{application_id}/{token}"),
        ("POST", "POST /webhooks/{application_id}/{token}"),
    ]
    assert all(c.body["allowed_mentions"] == NO_MENTIONS for c in fake.calls if c.method != "GET")
    original = fake.state.interactions[token]["original"]
    assert receipt.platform_ids[0] == original and fake.state.messages[original]["content"].startswith("p0 ")
    # a second reply to the same command does not overwrite the first
    await channel.perform(SendText(text="and another thing"), _interaction_ref(token), Sending("k2"))
    assert fake.state.messages[original]["content"].startswith("p0 ")
    assert fake.calls[-1].route == "POST /webhooks/{application_id}/{token}"


async def test_after_15_minutes_replies_go_to_the_channel(channel: DiscordChannel, fake: FakeDiscord) -> None:
    await channel.perform(SendText(text="late"), _interaction_ref("tok-old", expires_in=30), Sending())
    [call] = fake.calls[1:]
    assert call.route == "POST /channels/{channel_id}/messages" and call.body["enforce_nonce"] is True


async def test_edit_and_stream_by_edits(channel: DiscordChannel, fake: FakeDiscord) -> None:
    send = Sending()
    opened = await channel.perform(StreamText(text="Thinking"), _dm(), send)
    assert opened.handle == opened.platform_ids[0]
    await channel.perform(EditText(message_id=opened.handle, text="Thinking harder"), _dm(), Sending("e"))
    assert fake.state.messages[opened.handle]["content"] == "Thinking harder"
    final_text = "Done. " + "\n\n".join("q" * 1500 for _ in range(2))
    final = StreamText(handle=opened.handle, text=final_text, final=True)
    closed = await channel.perform(final, _dm(), Sending("final"))
    assert closed.platform_ids[0] == opened.handle and closed.parts == 2
    assert [m["content"][:6] for m in fake.state.sent("300")] == ["Done. ", "q" * 6]
    assert all(c.body["allowed_mentions"] == NO_MENTIONS for c in fake.calls if c.method == "PATCH")


async def test_offer_choice_buttons(channel: DiscordChannel, fake: FakeDiscord) -> None:
    options = [Choice(id=f"opt-{i}", label=f"Option {i} " + "l" * (90 if i == 0 else 0)) for i in range(7)]
    options.append(Choice(id="opt-1", label="duplicate id"))
    receipt = await channel.perform(OfferChoice(question="Which **one**?", options=options), _dm(), Sending())
    [message] = fake.state.sent("300")
    assert message["content"] == "Which **one**?" and receipt.platform_ids == (message["id"],)
    rows = message["components"]
    assert [len(r["components"]) for r in rows] == [5, 2]
    buttons = [b for r in rows for b in r["components"]]
    assert [b["custom_id"] for b in buttons] == [f"opt-{i}" for i in range(7)]
    assert len(buttons[0]["label"]) == 80 and buttons[0]["label"].endswith("…")


async def test_typing_error_file_and_ack(channel: DiscordChannel, fake: FakeDiscord) -> None:
    await channel.perform(SendTyping(), _dm("301"), Sending())
    assert fake.calls[-1].route == "POST /channels/{channel_id}/typing" and fake.calls[-1].channel_id == "301"
    await channel.perform(SendError(code="x", message="**oops** <@1>"), _dm(), Sending("err"))
    assert fake.calls[-1].body["content"] == "\\*\\*oops\\*\\* <@1>"
    send = Sending("file", files={"out/report.csv": FileData("report.csv", b"a,b\n1,2\n", "text/csv")})
    receipt = await channel.perform(SendFile(path="out/report.csv", caption="Here it is"), _dm(), send)
    call = fake.calls[-1]
    assert call.files == [("report.csv", 8)] and call.body["content"] == "Here it is"
    assert call.body["attachments"] == [{"id": 0, "filename": "report.csv"}] and call.body["enforce_nonce"] is True
    assert receipt.platform_ids == send.sent
    before = len(fake.calls)
    assert (await channel.perform(AckChoice(ack_ref="x"), _dm(), Sending("ack"))).parts == 0
    assert len(fake.calls) == before


async def test_fetch_downloads_attachments_with_a_size_cap(channel: DiscordChannel, fake: FakeDiscord) -> None:
    url = fake.file_url("photo.png", b"\x89PNG" + b"0" * 5000, "image/png")
    attachment = Attachment(kind="image", ref=url, name="photo.png", mime_type="image/png")
    data = await channel.fetch(attachment, _dm(), limit=10_000)
    assert data.data.startswith(b"\x89PNG") and len(data.data) == 5004 and data.mime_type == "image/png"
    with pytest.raises(AttachmentError) as too_big:
        await channel.fetch(attachment, _dm(), limit=1000)
    assert too_big.value.too_large
    with pytest.raises(AttachmentError):
        await channel.fetch(Attachment(kind="image", ref="https://evil.example/x.png"), _dm(), limit=10_000)
    with pytest.raises(AttachmentError):
        await channel.fetch(Attachment(kind="image", ref=fake.base_url + "/_fake/cdn/gone"), _dm(), limit=10_000)


async def test_register_commands(channel: DiscordChannel, fake: FakeDiscord) -> None:
    assert await channel.register_commands() == ["ask", "reset", "stop"]
    ask = fake.state.commands[0]
    assert ask["options"][0] == {"type": 3, "name": "text", "description": "Your message", "required": True}


async def test_secrets_stay_out_of_logs_and_errors(
    channel: DiscordChannel, fake: FakeDiscord, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    token = "interaction-token-secret"
    fake.state.interaction(token, "300")
    fake.state.fail_next(1, retry_after=0.01)
    with pytest.raises(RateLimitedError) as limited:
        await channel.perform(SendText(text="a"), _interaction_ref(token), Sending())
    fake.state.refuse_next(1, status=500)
    with pytest.raises(DeliveryError) as failed:
        await channel.perform(SendText(text="b"), _dm(), Sending("k2"))
    broken = DiscordChannel(settings("http://127.0.0.1:9/api/v10"))
    with pytest.raises(DeliveryError) as unreachable:
        await broken.perform(SendText(text="c"), _interaction_ref(token), Sending("k3"))
    await broken.aclose()
    said = caplog.text + str(limited.value) + str(failed.value) + str(unreachable.value)
    assert "discord" in said and TOKEN not in said and token not in said
