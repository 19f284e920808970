"""The Slack adapter outbound, against the fake Web API: text, resumable parts, 429s, streams, choices, files."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from switchboard.channels.slack.adapter import SlackChannel
from switchboard.channels.slack.fake.methods import Planned
from switchboard.channels.slack.fake.platform import FakeSlack, check_mrkdwn
from switchboard.channels.slack.outbound import STREAM_CAP
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
from switchboard.core.messages import Attachment
from switchboard.errors import AttachmentError, DeliveryError, RateLimitedError
from tests.channels.slack_support import BOT_TOKEN, AttemptProgress, Progress, dm, in_channel, make_channel


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(bot_token=BOT_TOKEN) as server:
        yield server


@pytest.fixture
async def channel(fake: FakeSlack) -> AsyncIterator[SlackChannel]:
    adapter = make_channel(fake.api_url)
    await adapter.start()
    yield adapter
    await adapter.aclose()


def long_reply(chars: int) -> str:
    paragraphs, size, n = [], 0, 0
    while size < chars:
        n += 1
        block = (
            f"```python\nprint({n} < {n + 1} & True)\n```"
            if n % 7 == 0
            else f"**Part {n}**: a <b>tag</b> & an [link](https://example.com/{n}?a=1&b=2) " + "words " * 40
        )
        paragraphs.append(block)
        size += len(block) + 2
    return "\n\n".join(paragraphs)[:chars]


async def test_start_learns_the_bot_identity(channel: SlackChannel) -> None:
    assert channel.identity.bot_user_id == "U0BOTUSER" and channel.identity.bot_id == "B0BOTID"


async def test_a_reply_goes_to_the_thread_as_mrkdwn(channel: SlackChannel, fake: FakeSlack) -> None:
    send = Progress()
    receipt = await channel.perform(SendText(text="**Done** & <ok>"), in_channel(), send)
    (call,) = fake.sent()
    assert call.params["text"] == "*Done* &amp; &lt;ok&gt;"
    assert call.params["thread_ts"] == "1700000001.000100" and call.params["channel"] == "C0GENERAL"
    assert receipt.platform_ids == tuple(send.parts) and send.paced == 1


async def test_a_20000_character_reply_arrives_complete_and_well_formed(channel: SlackChannel, fake: FakeSlack) -> None:
    text = long_reply(20_000)
    send = Progress()
    receipt = await channel.perform(SendText(text=text), dm(), send)
    calls = fake.sent()
    assert len(calls) == receipt.parts >= 5
    for call in calls:
        assert len(call.params["text"]) <= 4000
        check_mrkdwn(call.params["text"])
        assert not call.pings
    shown = "".join(c.params["text"] for c in calls)
    for n in range(1, 40):
        if f"**Part {n}**" in text:
            assert f"*Part {n}*" in shown
    assert shown.count("https://example.com/1?a=1&amp;b=2") == 1


async def test_model_output_never_pings_anyone(channel: SlackChannel, fake: FakeSlack) -> None:
    hostile = "<!channel> <!here> <!everyone> <@U0BOSS> <!subteam^S123|team> [x](https://a.b|<!here>) @here @channel"
    await channel.perform(SendText(text=hostile), in_channel(), Progress())
    await channel.perform(SendError(code="model_error", message=hostile), in_channel(), Progress())
    await channel.perform(
        OfferChoice(question=hostile, options=[Choice(id="a", label="<!here>")]), in_channel(), Progress()
    )
    assert len(fake.sent()) == 3
    assert [(call.method, call.pings) for call in fake.calls if call.pings] == []
    assert "@\u2060here" in fake.sent()[0].params["text"]


async def test_a_429_is_raised_with_retry_after_and_a_retry_resumes_after_the_sent_parts(
    channel: SlackChannel, fake: FakeSlack
) -> None:
    text = long_reply(9_000)
    send = Progress()
    fake.fail_next(1, retry_after=7, method="chat.postMessage")
    with pytest.raises(RateLimitedError) as caught:
        await channel.perform(SendText(text=text), dm(), send)
    assert caught.value.retry_after == 7
    assert send.parts == []
    receipt = await channel.perform(SendText(text=text), dm(), send)
    assert receipt.parts == len(fake.sent()) == 3 and receipt.platform_ids == tuple(send.parts)


async def test_5xx_is_retryable_and_refusals_are_not(channel: SlackChannel, fake: FakeSlack) -> None:
    fake.refuse_next(1, error="fatal_error", status=500)
    with pytest.raises(DeliveryError) as caught:
        await channel.perform(SendText(text="hi"), dm(), Progress())
    assert caught.value.retryable
    fake.refuse_next(1, error="channel_not_found")
    with pytest.raises(DeliveryError) as refused:
        await channel.perform(SendText(text="hi"), dm(), Progress())
    assert not refused.value.retryable and "channel_not_found" in str(refused.value)


async def test_parts_are_resumed_across_a_failure_in_the_middle(channel: SlackChannel, fake: FakeSlack) -> None:
    text = long_reply(9_000)
    send = Progress()
    fake.state.plan.append(Planned("chat.postMessage", 0, ""))  # the first goes through (answered normally)
    fake.state.plan.append(Planned("chat.postMessage", 503, "service_unavailable"))
    with pytest.raises(DeliveryError):
        await channel.perform(SendText(text=text), dm(), send)
    assert len(send.parts) == 1
    receipt = await channel.perform(SendText(text=text), dm(), send)
    texts = [c.params["text"] for c in fake.sent()]
    assert len(texts) == receipt.parts == 3 and len(set(texts)) == 3
    assert receipt.platform_ids == tuple(send.parts)


async def test_edit_updates_the_message(channel: SlackChannel, fake: FakeSlack) -> None:
    receipt = await channel.perform(SendText(text="draft"), dm(), Progress())
    await channel.perform(EditText(message_id=receipt.platform_ids[0], text="**final**"), dm(), Progress())
    (update,) = fake.sent("chat.update")
    assert update.params["text"] == "*final*" and update.params["ts"] == receipt.platform_ids[0]


async def test_native_stream_into_a_thread(channel: SlackChannel, fake: FakeSlack) -> None:
    conv = in_channel()
    text = "Hello <!here> and @channel, " + "streaming words " * 20
    opened = await channel.perform(StreamText(text=text[:30]), conv, Progress())
    assert opened.handle is not None
    send = Progress()
    await channel.perform(StreamText(handle=opened.handle, text=text[:120], sent=30), conv, Progress())
    await channel.perform(StreamText(handle=opened.handle, text=text, sent=120, final=True), conv, send)
    (start,) = fake.sent("chat.startStream")
    assert start.params["recipient_user_id"] == "U0HUMAN" and start.params["recipient_team_id"] == "T0SWITCH"
    (stream,) = fake.state.streams.values()
    assert not stream["open"]
    assert stream["text"].replace("\u200b", "").replace("\u2060", "") == text
    assert all(not call.pings for call in fake.calls)
    assert send.parts == [opened.platform_ids[0]]


async def test_a_long_stream_is_completed_by_messages_in_the_thread(channel: SlackChannel, fake: FakeSlack) -> None:
    conv = in_channel()
    text = long_reply(20_000)
    opened = await channel.perform(StreamText(text=text[:1000]), conv, Progress())
    assert opened.handle
    sent = 1000
    for end in range(3000, 20_001, 2000):
        await channel.perform(StreamText(handle=opened.handle, text=text[:end], sent=sent), conv, Progress())
        sent = end
    send = Progress()
    final = await channel.perform(StreamText(handle=opened.handle, text=text, sent=sent, final=True), conv, send)
    (stream,) = fake.state.streams.values()
    assert not stream["open"] and len(stream["text"].replace("\u200b", "")) <= STREAM_CAP
    posts = fake.sent()
    assert final.parts == 1 + len(posts) and len(posts) >= 4
    for post in posts:
        check_mrkdwn(post.params["text"])
        assert post.params["thread_ts"] == "1700000001.000100"
    # a retry of the final action sends nothing again
    again = await channel.perform(StreamText(handle=opened.handle, text=text, sent=sent, final=True), conv, send)
    assert len(fake.sent()) == len(posts) and again.platform_ids == final.platform_ids


async def test_no_native_streaming_is_reported_and_remembered(channel: SlackChannel, fake: FakeSlack) -> None:
    fake.state.streaming = False
    receipt = await channel.perform(StreamText(text="hi"), in_channel(), Progress())
    assert receipt.handle is None and receipt.detail["streaming"] == "unavailable" and receipt.parts == 0
    assert channel.capabilities.streaming == "edits"
    assert fake.sent() == []


async def test_a_top_level_dm_does_not_stream_natively(channel: SlackChannel, fake: FakeSlack) -> None:
    receipt = await channel.perform(StreamText(text="hi"), dm(), Progress())
    assert receipt.handle is None and receipt.detail["streaming"] == "unavailable"
    assert channel.capabilities.streaming == "native" and fake.calls[-1].method == "auth.test"


async def test_typing_is_the_assistant_thread_status(channel: SlackChannel, fake: FakeSlack) -> None:
    await channel.perform(SendTyping(), dm(thread="1700000000.000200"), Progress())
    (status,) = fake.sent("assistant.threads.setStatus")
    assert status.params["thread_ts"] == "1700000000.000200" and status.params["channel_id"] == "D0DIRECT"
    receipt = await channel.perform(SendTyping(), in_channel(), Progress())
    assert receipt.detail["typing"] == "unsupported" and len(fake.sent("assistant.threads.setStatus")) == 1


async def test_choices_are_block_kit_buttons(channel: SlackChannel, fake: FakeSlack) -> None:
    options = [Choice(id="approve", label="Approve"), Choice(id="reject", label="Reject " + "x" * 100)]
    receipt = await channel.perform(OfferChoice(question="Deploy **now**?", options=options), in_channel(), Progress())
    (call,) = fake.sent()
    section, actions = call.params["blocks"]
    assert section["text"]["text"] == "Deploy *now*?"
    assert [b["value"] for b in actions["elements"]] == ["approve", "reject"]
    assert [b["action_id"] for b in actions["elements"]] == ["approve", "reject"]
    assert len(actions["elements"][1]["text"]["text"]) == 75
    assert receipt.parts == 1 and (call.params["channel"], receipt.platform_ids[0]) in fake.state.messages
    ack = await channel.perform(AckChoice(ack_ref="unused"), in_channel(), Progress())
    assert ack.parts == 0 and len(fake.calls) == 2


async def test_files_go_up_in_three_steps(channel: SlackChannel, fake: FakeSlack, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "report.csv").write_bytes(b"a,b\n1,2\n")
    send = Progress(workspace=tmp_path)
    receipt = await channel.perform(SendFile(path="out/report.csv", caption="The **report**"), in_channel(), send)
    (upload,) = fake.state.uploads.values()
    assert upload["content"] == b"a,b\n1,2\n" and upload["initial_comment"] == "The *report*"
    assert upload["thread_ts"] == "1700000001.000100" and receipt.platform_ids == tuple(send.parts)
    again = await channel.perform(SendFile(path="out/report.csv", caption="The **report**"), in_channel(), send)
    assert len(fake.state.uploads) == 1 and again.platform_ids == receipt.platform_ids


async def test_fetch_downloads_with_the_bot_token_and_caps_size(channel: SlackChannel, fake: FakeSlack) -> None:
    url = fake.host_file("notes.txt", b"x" * 5000, "text/plain")
    found = await channel.fetch(Attachment(kind="document", ref=url, name="notes.txt"), dm(), 10_000)
    assert found.data == b"x" * 5000 and found.name == "notes.txt"
    with pytest.raises(AttachmentError) as big:
        await channel.fetch(Attachment(kind="document", ref=url), dm(), 4999)
    assert big.value.too_large
    with pytest.raises(AttachmentError) as declared:
        await channel.fetch(Attachment(kind="document", ref=url, size=20_000), dm(), 10_000)
    assert declared.value.too_large
    with pytest.raises(AttachmentError, match="not on a Slack host"):
        await channel.fetch(Attachment(kind="document", ref="https://evil.example/steal"), dm(), 10_000)
    with pytest.raises(AttachmentError):
        await channel.fetch(Attachment(kind="document", ref=url.replace("notes", "gone")), dm(), 10_000)


@pytest.mark.parametrize("kind", ["text", "choice", "file", "stream"])
async def test_receipts_list_every_part_whatever_sent_reports_during_an_attempt(
    kind: str, channel: SlackChannel, fake: FakeSlack, tmp_path: Path
) -> None:
    long = long_reply(9_000)
    (tmp_path / "a.txt").write_bytes(b"data")
    send = AttemptProgress(workspace=tmp_path)
    conv = in_channel()
    action: Any
    if kind == "text":
        action = SendText(text=long)
    elif kind == "choice":
        action = OfferChoice(question=long, options=[Choice(id="y", label="Yes")])
    elif kind == "file":
        action = SendFile(path="a.txt", caption=long)
    else:
        opened = await channel.perform(StreamText(text=long[:100]), conv, Progress())
        action = StreamText(handle=opened.handle, text=long, sent=100, final=True)
    receipt = await channel.perform(action, conv, send)
    assert receipt.platform_ids == tuple(send.parts) and receipt.parts == len(send.parts) >= 3
    send.next_attempt()
    again = await channel.perform(action, conv, send)  # a retry after everything went out sends nothing
    assert again.platform_ids == receipt.platform_ids and len(send.parts) == receipt.parts


async def test_a_stream_that_ended_on_its_own_is_completed_by_messages(channel: SlackChannel, fake: FakeSlack) -> None:
    conv = in_channel()
    opened = await channel.perform(StreamText(text="First part. "), conv, Progress())
    assert opened.handle
    (stream,) = fake.state.streams.values()
    stream["open"] = False  # Slack closed the idle stream
    send = Progress()
    text = "First part. And **the rest** of it."
    final = await channel.perform(StreamText(handle=opened.handle, text=text, sent=12, final=True), conv, send)
    (post,) = fake.sent()
    assert post.params["text"] == "And *the rest* of it."
    assert final.platform_ids == tuple(send.parts) and send.parts[0] == opened.platform_ids[0] and len(send.parts) == 2
