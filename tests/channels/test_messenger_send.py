"""Messenger and Instagram sends against the fake Send API: splitting, plain text, quick replies, typing, files,
the messaging window, Graph errors, and attachment fetches."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from switchboard.channels.meta.instagram.adapter import InstagramChannel
from switchboard.channels.meta.instagram.settings import InstagramSettings
from switchboard.channels.meta.messaging.fake.platform import FakeMessenger
from switchboard.channels.meta.messenger.adapter import MessengerChannel
from switchboard.channels.meta.messenger.settings import MessengerSettings
from switchboard.channels.meta.webhook import EVENT_COUNTS
from switchboard.core.actions import (
    Choice,
    EditText,
    OfferChoice,
    SendError,
    SendFile,
    SendText,
    SendTyping,
    StreamText,
)
from switchboard.core.messages import Attachment, ConversationRef
from switchboard.errors import AttachmentError, DeliveryError, RateLimitedError
from tests.channels.slack_support import Progress

TOKEN = "EAAGsendtoken"
USER = "24000000000000001"


@pytest.fixture
async def fake() -> AsyncIterator[FakeMessenger]:
    async with FakeMessenger("messenger", token=TOKEN) as server:
        yield server


@pytest.fixture
async def ig_fake() -> AsyncIterator[FakeMessenger]:
    async with FakeMessenger("instagram", token=TOKEN) as server:
        yield server


def messenger(fake: FakeMessenger, **overrides: Any) -> MessengerChannel:
    values = {"page_access_token": TOKEN, "app_secret": "s", "graph_base_url": fake.graph_url, "page_id": "1"}
    return MessengerChannel(MessengerSettings.model_validate(values | overrides))


def instagram(fake: FakeMessenger, **overrides: Any) -> InstagramChannel:
    values = {"access_token": TOKEN, "app_secret": "s", "graph_base_url": fake.graph_url, "account_id": "2"}
    return InstagramChannel(InstagramSettings.model_validate(values | overrides))


def to(channel: str = "messenger") -> ConversationRef:
    return ConversationRef(channel=channel, conversation=USER, extra={"page": "1", "user": USER})  # type: ignore[arg-type]


async def test_a_long_messenger_reply_is_split_within_2000_characters(fake: FakeMessenger) -> None:
    paragraphs = [f"Paragraph {n}: " + "word " * 120 for n in range(12)]  # ~7,400 characters
    markdown = "\n\n".join(paragraphs)
    progress = Progress()
    receipt = await messenger(fake).perform(SendText(text=markdown), to(), progress)
    texts = fake.texts(USER)
    assert len(texts) == receipt.parts == 4 and all(len(t) <= 2000 for t in texts)
    assert list(receipt.platform_ids) == progress.parts and len(set(progress.parts)) == 4
    assert "".join(texts).replace("\n", "").replace(" ", "") == markdown.replace("\n", "").replace(" ", "")
    assert all(c.body["messaging_type"] == "RESPONSE" for c in fake.delivered())
    assert progress.paced == 4


@pytest.mark.parametrize("word", ["café", "naïve", "🚚💨", "Ωμέγα", "日本語"])
async def test_an_instagram_reply_is_split_within_1000_utf8_bytes(ig_fake: FakeMessenger, word: str) -> None:
    markdown = " ".join([word] * 700)
    receipt = await instagram(ig_fake).perform(SendText(text=markdown), to("instagram"), Progress())
    texts = ig_fake.texts(USER)
    assert receipt.parts == len(texts) >= 2
    assert all(len(t.encode()) <= 1000 for t in texts), [len(t.encode()) for t in texts]
    assert "".join(texts).split() == markdown.split()  # no character cut in two, nothing lost
    if len(word.encode()) > len(word):  # multi-byte text: counting characters would have overrun
        assert any(len(t) < 1000 < len(t) * len(word.encode()) // len(word) for t in texts)


async def test_markdown_becomes_plain_text_with_links_spelled_out(fake: FakeMessenger) -> None:
    markdown = (
        "# Hours\n\nWe are **open** _daily_. See [the map](https://example.com/map) or `call us`.\n\n- Mon\n- Tue"
    )
    await messenger(fake).perform(SendText(text=markdown), to(), Progress())
    (text,) = fake.texts(USER)
    assert text == "Hours\n\nWe are open daily. See the map (https://example.com/map) or call us.\n\n• Mon\n• Tue"


async def test_a_retry_resumes_after_the_parts_already_sent(fake: FakeMessenger) -> None:
    markdown = "\n\n".join("x" * 1500 for _ in range(3))
    progress = Progress()
    channel = messenger(fake)
    await channel.perform(SendText(text="warm-up"), to(), Progress())
    fake.state.plan.clear()
    fake.slow_next(1, delay_s=0)  # the first part goes through
    fake.fail_next(1, code=2, status=500)  # the second meets a Graph outage
    with pytest.raises(DeliveryError) as failed:
        await channel.perform(SendText(text=markdown), to(), progress)
    assert failed.value.retryable and len(progress.parts) == 1
    await channel.perform(SendText(text=markdown), to(), progress)
    texts = fake.texts(USER)[1:]
    assert len(texts) == 3 and len(progress.parts) == 3  # part one was not sent twice


async def test_a_choice_becomes_quick_replies_carrying_the_option_ids(fake: FakeMessenger) -> None:
    options = [Choice(id=f"opt-{n}", label=f"Option number {n} with a long label") for n in range(15)]
    receipt = await messenger(fake).perform(OfferChoice(question="Pick **one**", options=options), to(), Progress())
    (call,) = fake.delivered(USER)
    message = call.body["message"]
    replies = message["quick_replies"]
    assert len(replies) == 13 and receipt.platform_ids
    assert [r["payload"] for r in replies] == [f"opt-{n}" for n in range(13)]
    assert all(len(r["title"]) <= 20 and r["content_type"] == "text" for r in replies)
    assert replies[0]["title"] == "Option number 0 wit…"
    assert message["text"].startswith("Pick one") and "Option number 14" in message["text"]


async def test_instagram_choices_are_quick_replies_too(ig_fake: FakeMessenger) -> None:
    options = [Choice(id="yes", label="Oui ✅"), Choice(id="no", label="Non")]
    await instagram(ig_fake).perform(OfferChoice(question="", options=options), to("instagram"), Progress())
    (call,) = ig_fake.delivered(USER)
    assert [r["payload"] for r in call.body["message"]["quick_replies"]] == ["yes", "no"]
    assert call.body["message"]["text"] == "Choose one:"


async def test_typing_marks_seen_then_types(fake: FakeMessenger) -> None:
    receipt = await messenger(fake).perform(SendTyping(), to(), Progress())
    assert fake.state.actions(USER) == ["mark_seen", "typing_on"] and receipt.parts == 0


async def test_outside_the_window_without_human_agent_the_send_fails_clearly(fake: FakeMessenger) -> None:
    fake.state.close_window(USER)
    before = EVENT_COUNTS[("messenger", "default", "window_closed")]
    with pytest.raises(DeliveryError) as refused:
        await messenger(fake).perform(SendText(text="late answer"), to(), Progress())
    assert not refused.value.retryable
    assert "24-hour" in str(refused.value) and "human_agent" in str(refused.value)
    assert EVENT_COUNTS[("messenger", "default", "window_closed")] == before + 1
    assert fake.delivered(USER) == []


async def test_outside_the_window_human_agent_tags_the_reply(fake: FakeMessenger) -> None:
    fake.state.close_window(USER)
    before = EVENT_COUNTS[("messenger", "default", "window_human_agent_sent")]
    receipt = await messenger(fake, human_agent="true").perform(SendText(text="late answer"), to(), Progress())
    (call,) = fake.delivered(USER)
    assert call.body["messaging_type"] == "MESSAGE_TAG" and call.body["tag"] == "HUMAN_AGENT"
    assert receipt.platform_ids and EVENT_COUNTS[("messenger", "default", "window_human_agent_sent")] == before + 1


async def test_human_agent_refused_too_is_a_clear_failure(fake: FakeMessenger) -> None:
    fake.fail_next(2, code=10, subcode=2018278)  # past the 7 days as well
    with pytest.raises(DeliveryError) as refused:
        await messenger(fake, human_agent="true").perform(SendText(text="very late"), to(), Progress())
    assert not refused.value.retryable and "HUMAN_AGENT tag was refused" in str(refused.value)


@pytest.mark.parametrize(
    ("code", "subcode", "status", "retryable", "limited"),
    [
        (613, None, 400, True, True),  # Page message throttling
        (190, None, 400, False, False),  # expired token
        (100, 2018001, 400, False, False),  # no such user
        (2, None, 500, True, False),  # Graph outage
    ],
)
async def test_graph_errors_are_classified(
    fake: FakeMessenger, code: int, subcode: int | None, status: int, retryable: bool, limited: bool
) -> None:
    fake.fail_next(1, code=code, subcode=subcode, status=status)
    with pytest.raises(DeliveryError) as failed:
        await messenger(fake).perform(SendText(text="hello"), to(), Progress())
    assert failed.value.retryable is retryable and isinstance(failed.value, RateLimitedError) is limited


async def test_a_wrong_token_alerts(fake: FakeMessenger) -> None:
    before = EVENT_COUNTS[("messenger", "default", "auth_failed")]
    with pytest.raises(DeliveryError) as failed:
        await messenger(fake, page_access_token="EAAGwrong").perform(SendText(text="hi"), to(), Progress())
    assert not failed.value.retryable and "EAAGwrong" not in str(failed.value)
    assert EVENT_COUNTS[("messenger", "default", "auth_failed")] == before + 1


async def test_a_file_is_uploaded_with_the_message_then_its_caption(fake: FakeMessenger, tmp_path: Path) -> None:
    (tmp_path / "chart.png").write_bytes(b"\x89PNG" + b"\0" * 5000)
    progress = Progress(workspace=tmp_path)
    action = SendFile(path="chart.png", caption="The **chart**", mime_type="image/png")
    receipt = await messenger(fake).perform(action, to(), progress)
    upload, caption = fake.delivered(USER)
    attachment = upload.body["message"]["attachment"]
    assert attachment["type"] == "image" and attachment["payload"]["uploaded"]["size"] == 5004
    assert upload.body["filedata"]["filename"] == "chart.png" and upload.body["messaging_type"] == "RESPONSE"
    assert caption.body["message"]["text"] == "The chart" and receipt.parts == 2
    again = await messenger(fake).perform(action, to(), progress)  # a retry after both: nothing sent twice
    assert len(fake.delivered(USER)) == 2 and again.platform_ids == receipt.platform_ids


async def test_an_upload_outside_the_window_is_tagged_too(fake: FakeMessenger, tmp_path: Path) -> None:
    (tmp_path / "late.pdf").write_bytes(b"%PDF-late")
    fake.state.close_window(USER)
    action = SendFile(path="late.pdf")
    with pytest.raises(DeliveryError) as refused:
        await messenger(fake).perform(action, to(), Progress(workspace=tmp_path))
    assert not refused.value.retryable and fake.delivered(USER) == []
    progress = Progress(workspace=tmp_path)
    await messenger(fake, human_agent="true").perform(action, to(), progress)
    (upload,) = fake.delivered(USER)
    assert upload.body["tag"] == "HUMAN_AGENT" and upload.body["message"]["attachment"]["type"] == "file"
    assert progress.paced == 2  # the refused untagged attempt and the tagged one each took a token


async def test_instagram_names_a_file_in_text(ig_fake: FakeMessenger, tmp_path: Path) -> None:
    (tmp_path / "menu.pdf").write_bytes(b"%PDF")
    action = SendFile(path="menu.pdf", caption="Our menu")
    await instagram(ig_fake).perform(action, to("instagram"), Progress(workspace=tmp_path))
    assert ig_fake.texts(USER) == ["Our menu\n\n📎 menu.pdf"]


async def test_edits_are_refused_and_streams_unavailable(fake: FakeMessenger) -> None:
    channel = messenger(fake)
    assert not channel.capabilities.edits and channel.capabilities.streaming == "none"
    with pytest.raises(DeliveryError) as refused:
        await channel.perform(EditText(message_id="m_1", text="x"), to(), Progress())
    assert not refused.value.retryable
    receipt = await channel.perform(StreamText(text="partial"), to(), Progress())
    assert receipt.handle is None and receipt.detail["streaming"] == "unavailable" and fake.calls == []


async def test_an_error_notice_is_sent_as_written(fake: FakeMessenger) -> None:
    await messenger(fake).perform(SendError(code="x", message="Sorry **not** now"), to(), Progress())
    assert fake.texts(USER) == ["Sorry **not** now"]


# ---------------------------------------------------------------- attachments the user sent


async def test_an_attachment_is_fetched_through_the_lookaside_redirect(fake: FakeMessenger) -> None:
    url = fake.host_media("photo.jpg", b"\xff\xd8jpeg", "image/jpeg", redirect=True)
    data = await messenger(fake).fetch(Attachment(kind="image", ref=url), to(), 1000)
    assert data.data == b"\xff\xd8jpeg" and data.mime_type == "image/jpeg" and data.name == "photo.jpg"


async def test_an_attachment_over_the_cap_is_refused(fake: FakeMessenger) -> None:
    url = fake.host_media("big.mp4", b"v" * 5000, "video/mp4")
    with pytest.raises(AttachmentError) as refused:
        await messenger(fake).fetch(Attachment(kind="video", ref=url), to(), 4096)
    assert refused.value.too_large


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "https://evil.example/x.jpg",
        "https://fbcdn.net.evil.example/x.jpg",
        "http://scontent.xx.fbcdn.net/x.jpg",
        "https://scontent.xx.fbcdn.net:8443/x.jpg",
        "https://user:pw@scontent.xx.fbcdn.net/x.jpg",
        "file:///etc/passwd",
    ],
)
async def test_attachment_urls_off_metas_cdn_are_never_fetched(fake: FakeMessenger, url: str) -> None:
    with pytest.raises(AttachmentError):
        await messenger(fake).fetch(Attachment(kind="image", ref=url), to(), 10_000)


async def test_a_redirect_off_metas_cdn_is_not_followed(fake: FakeMessenger) -> None:
    fake.host_media("secret", b"internal", "text/plain")
    url = fake.redirect_media("hop", f"http://localhost:{fake.base_url.rsplit(':', 1)[1]}/_fake/cdn/secret")
    with pytest.raises(AttachmentError) as refused:
        await messenger(fake).fetch(Attachment(kind="image", ref=url), to(), 10_000)
    assert "not on Meta's CDN" in str(refused.value)
