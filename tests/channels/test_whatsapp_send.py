"""WhatsApp sends against the fake Graph API: formatting, splitting, choices, media, typing, the 24-hour window,
Graph error classification and media fetches."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from switchboard.channels.meta import webhook as _meta
from switchboard.channels.meta.graph import GraphError, GraphRateLimited
from switchboard.channels.meta.whatsapp.adapter import WhatsAppChannel
from switchboard.channels.meta.whatsapp.fake.payloads import PHONE_NUMBER_ID
from switchboard.channels.meta.whatsapp.fake.platform import FakeWhatsApp
from switchboard.channels.registry import BuildContext
from switchboard.channels.render.whatsapp import render_whatsapp, split_text
from switchboard.core.actions import Choice, EditText, OfferChoice, SendFile, SendText, SendTyping
from switchboard.core.messages import Attachment, ConversationRef
from switchboard.errors import AttachmentError, DeliveryError
from tests.channels.slack_support import Progress
from tests.channels.test_whatsapp import settings

TOKEN = "EAAtest"
USER = "15551234567"


@pytest.fixture
async def fake() -> AsyncIterator[FakeWhatsApp]:
    async with FakeWhatsApp(token=TOKEN) as server:
        yield server


@pytest.fixture
async def channel(fake: FakeWhatsApp) -> AsyncIterator[WhatsAppChannel]:
    adapter = WhatsAppChannel(settings(graph_base_url=fake.graph_url), BuildContext(account="default"))
    yield adapter
    await adapter.aclose()


def conversation(wamid: str = "wamid.IN0001") -> ConversationRef:
    extra = {"phone_number_id": PHONE_NUMBER_ID, "wa_id": USER, "wamid": wamid}
    return ConversationRef(channel="whatsapp", conversation=USER, extra=extra)


# --------------------------------------------------------------------------- text


def test_markdown_becomes_whatsapp_formatting() -> None:
    text = "# Plan\n**bold**, *it*, ~~old~~, `x = 1`, [docs](https://d.example)\n* one\n```py\n**raw**\n```"
    assert render_whatsapp(text) == (
        "*Plan*\n*bold*, _it_, ~old~, ```x = 1```, docs (https://d.example)\n- one\n```\n**raw**\n```"
    )


async def test_a_long_reply_is_split_within_4096(channel: WhatsAppChannel, fake: FakeWhatsApp) -> None:
    text = "\n\n".join(f"Paragraph {i}: " + "lorem ipsum " * 60 for i in range(20))
    expected = split_text(text)
    assert len(expected) == 4 and all(len(p) <= 4096 for p in expected)
    receipt = await channel.perform(SendText(text=text), conversation(), Progress())
    assert receipt.parts == 4
    assert fake.state.texts(USER) == expected
    assert "".join(expected).replace("\n", "").replace(" ", "") == text.replace("\n", "").replace(" ", "")
    assert fake.state.sent()[0]["text"]["preview_url"] is False


async def test_a_transient_failure_mid_reply_is_retryable_and_the_retry_resumes(
    channel: WhatsAppChannel, fake: FakeWhatsApp
) -> None:
    text = "\n\n".join("word " * 700 for _ in range(3))
    parts = split_text(text)
    assert len(parts) == 3
    fake.fail_next(131000, status=500, after=1)  # the second part fails
    progress = Progress()
    with pytest.raises(GraphError) as caught:
        await channel.perform(SendText(text=text), conversation(), progress)
    assert caught.value.retryable and caught.value.kind == "transient"
    assert fake.state.texts(USER) == parts[:1]
    receipt = await channel.perform(SendText(text=text), conversation(), progress)
    assert receipt.parts == 3
    assert fake.state.texts(USER) == parts  # resumed after the part already sent, nothing twice


# --------------------------------------------------------------------------- choices


async def test_three_short_options_are_reply_buttons(channel: WhatsAppChannel, fake: FakeWhatsApp) -> None:
    options = [Choice(id="approve:42", label="Approve"), Choice(id="reject:42", label="Reject")]
    await channel.perform(OfferChoice(question="Ship **it**?", options=options), conversation(), Progress())
    [body] = fake.state.sent("interactive")
    interactive = body["interactive"]
    assert interactive["type"] == "button" and interactive["body"]["text"] == "Ship *it*?"
    assert interactive["action"]["buttons"] == [
        {"type": "reply", "reply": {"id": "approve:42", "title": "Approve"}},
        {"type": "reply", "reply": {"id": "reject:42", "title": "Reject"}},
    ]


async def test_more_options_or_long_labels_become_a_list(channel: WhatsAppChannel, fake: FakeWhatsApp) -> None:
    options = [Choice(id=f"plan-{i}", label=f"Plan number {i} with a long descriptive name") for i in range(7)]
    await channel.perform(OfferChoice(question="Which plan?", options=options), conversation(), Progress())
    [body] = fake.state.sent("interactive")
    rows = body["interactive"]["action"]["sections"][0]["rows"]
    assert [r["id"] for r in rows] == [f"plan-{i}" for i in range(7)]
    assert all(len(r["title"]) <= 24 and len(r["description"]) <= 72 for r in rows)


async def test_more_than_ten_options_become_numbered_text(channel: WhatsAppChannel, fake: FakeWhatsApp) -> None:
    options = [Choice(id=f"o{i}", label=f"Option {i}") for i in range(12)]
    await channel.perform(OfferChoice(question="Pick", options=options), conversation(), Progress())
    assert fake.state.sent("interactive") == []
    assert "12. Option 11" in fake.state.texts(USER)[0]


# --------------------------------------------------------------------------- the 24-hour window


async def test_outside_the_window_the_configured_template_is_sent_once(fake: FakeWhatsApp) -> None:
    adapter = WhatsAppChannel(
        settings(graph_base_url=fake.graph_url, window_template="we_are_back:en_US"), BuildContext()
    )
    fake.close_window(USER)
    before = _meta.EVENT_COUNTS[("whatsapp", "default", "window_template_sent")]
    progress = Progress()
    try:
        receipt = await adapter.perform(SendText(text="Your order shipped"), conversation(), progress)
        again = await adapter.perform(SendText(text="Your order shipped"), conversation(), progress)  # a retry
    finally:
        await adapter.aclose()
    assert receipt.detail == {"window": "template"} and again.detail == {"window": "template"}
    [template] = fake.state.sent("template")
    assert template["template"] == {"name": "we_are_back", "language": {"code": "en_US"}}
    assert _meta.EVENT_COUNTS[("whatsapp", "default", "window_template_sent")] == before + 1


@pytest.mark.parametrize("account_template", [None, "we_are_back:en_US"])
async def test_a_scheduled_jobs_own_template_is_sent_outside_the_window(
    fake: FakeWhatsApp, account_template: str | None
) -> None:
    adapter = WhatsAppChannel(settings(graph_base_url=fake.graph_url, window_template=account_template), BuildContext())
    fake.close_window(USER)
    job = conversation()
    job = job.model_copy(update={"extra": {**job.extra, "window_template": "renewal_notice:de"}})
    try:
        receipt = await adapter.perform(SendText(text="Your plan renews tomorrow"), job, Progress())
    finally:
        await adapter.aclose()
    assert receipt.detail == {"window": "template"}
    [template] = fake.state.sent("template")
    assert template["template"] == {
        "name": "renewal_notice",
        "language": {"code": "de"},
    }  # the job's, not the account's


async def test_outside_the_window_without_a_template_a_clear_failure_is_recorded(
    channel: WhatsAppChannel, fake: FakeWhatsApp, caplog: pytest.LogCaptureFixture
) -> None:
    fake.fail_next(131047)
    before = _meta.EVENT_COUNTS[("whatsapp", "default", "window_closed")]
    with caplog.at_level(logging.WARNING), pytest.raises(DeliveryError) as caught:
        await channel.perform(SendText(text="late answer"), conversation(), Progress())
    assert not caught.value.retryable
    assert "24-hour" in str(caught.value) and "WINDOW_TEMPLATE" in str(caught.value)
    assert _meta.EVENT_COUNTS[("whatsapp", "default", "window_closed")] == before + 1
    assert any("window_closed" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------- Graph errors


@pytest.mark.parametrize(
    ("code", "kind", "retryable"),
    [(131026, "recipient", False), (190, "auth", False), (100, "refused", False), (131000, "transient", True)],
)
async def test_graph_errors_are_classified(
    channel: WhatsAppChannel, fake: FakeWhatsApp, code: int, kind: str, retryable: bool
) -> None:
    fake.fail_next(code)
    with pytest.raises(GraphError) as caught:
        await channel.perform(SendText(text="hi"), conversation(), Progress())
    assert (caught.value.kind, caught.value.code, caught.value.retryable) == (kind, code, retryable)


async def test_throttling_is_rate_limited_with_a_jittered_back_off(
    channel: WhatsAppChannel, fake: FakeWhatsApp
) -> None:
    waits = []
    for _ in range(2):
        fake.fail_next(130429)
        with pytest.raises(GraphRateLimited) as caught:
            await channel.perform(SendText(text="hi"), conversation(), Progress())
        waits.append(caught.value.retry_after)
    assert all(1.5 <= w <= 2.5 for w in waits)
    fake.fail_next(131056)
    with pytest.raises(GraphRateLimited) as pair:
        await channel.perform(SendText(text="hi"), conversation(), Progress())
    assert 4.5 <= pair.value.retry_after <= 7.5


async def test_an_auth_error_alerts_without_the_token(fake: FakeWhatsApp, caplog: pytest.LogCaptureFixture) -> None:
    secret_token = "EAAsecret-token-value-123"
    adapter = WhatsAppChannel(settings(access_token=secret_token, graph_base_url=fake.graph_url), BuildContext())
    before = _meta.EVENT_COUNTS[("whatsapp", "default", "auth_failed")]
    try:
        with caplog.at_level(logging.DEBUG), pytest.raises(GraphError) as caught:
            await adapter.perform(SendText(text="hi"), conversation(), Progress())  # the fake expects EAAtest
    finally:
        await adapter.aclose()
    assert caught.value.kind == "auth" and not caught.value.retryable
    assert _meta.EVENT_COUNTS[("whatsapp", "default", "auth_failed")] == before + 1
    assert any(r.levelno == logging.ERROR and "auth_failed" in r.getMessage() for r in caplog.records)
    assert secret_token not in caplog.text and secret_token not in str(caught.value)


# --------------------------------------------------------------------------- media, typing, edits


async def test_a_file_is_uploaded_then_sent_by_id(channel: WhatsAppChannel, fake: FakeWhatsApp, tmp_path: Path) -> None:
    (tmp_path / "report.pdf").write_bytes(b"%PDF-1.4 fake")
    action = SendFile(path="report.pdf", caption="The **report**")
    receipt = await channel.perform(action, conversation(), Progress(workspace=tmp_path))
    [upload] = [c for c in fake.state.calls if c.path.endswith("/media")]
    assert upload.body["messaging_product"] == "whatsapp" and upload.body["_file_bytes"] == 13
    [body] = fake.state.sent("document")
    assert body["document"]["filename"] == "report.pdf" and body["document"]["caption"] == "The *report*"
    assert fake.state.media[body["document"]["id"]][0] == b"%PDF-1.4 fake"
    assert receipt.parts == 1


async def test_typing_marks_the_last_message_read(channel: WhatsAppChannel, fake: FakeWhatsApp) -> None:
    await channel.perform(SendTyping(), conversation("wamid.LAST"), Progress())
    [call] = fake.state.calls
    assert call.body == {
        "messaging_product": "whatsapp",
        "status": "read",
        "message_id": "wamid.LAST",
        "typing_indicator": {"type": "text"},
    }


async def test_edits_are_refused_not_faked(channel: WhatsAppChannel) -> None:
    assert channel.capabilities.edits is False and channel.capabilities.streaming == "none"
    with pytest.raises(DeliveryError) as caught:
        await channel.perform(EditText(message_id="wamid.X", text="new"), conversation(), Progress())
    assert not caught.value.retryable


async def test_a_users_media_is_fetched_lazily_with_the_token_and_capped(
    channel: WhatsAppChannel, fake: FakeWhatsApp
) -> None:
    media_id = fake.host_media(b"\xff\xd8jpeg-bytes", "image/jpeg")
    attachment = Attachment(kind="image", ref=media_id, mime_type="image/jpeg")
    data = await channel.fetch(attachment, conversation(), limit=1000)
    assert data.data == b"\xff\xd8jpeg-bytes" and data.mime_type == "image/jpeg"
    with pytest.raises(AttachmentError) as caught:
        await channel.fetch(attachment, conversation(), limit=5)
    assert caught.value.too_large
    with pytest.raises(AttachmentError):
        await channel.fetch(Attachment(kind="image", ref="404404"), conversation(), limit=1000)


async def test_a_media_url_redirecting_to_loopback_is_not_followed(
    channel: WhatsAppChannel, fake: FakeWhatsApp
) -> None:
    """The download URL comes from the Graph answer: a redirect off Meta's hosts must never return internal bytes."""
    port = fake.base_url.rsplit(":", 1)[1]
    internal = f"http://localhost:{port}/_fake/calls"  # loopback under another name, served without the token
    media_id = fake.redirect_media(internal)
    with pytest.raises(AttachmentError) as refused:
        await channel.fetch(Attachment(kind="image", ref=media_id), conversation(), limit=100_000)
    assert "not on Meta's CDN" in str(refused.value)


async def test_media_redirects_are_followed_at_most_three_times(channel: WhatsAppChannel, fake: FakeWhatsApp) -> None:
    target = fake.host_media(b"\xff\xd8jpeg", "image/jpeg")
    hop = target
    for _ in range(3):
        hop = fake.redirect_media(fake.media_url(hop))
    data = await channel.fetch(Attachment(kind="image", ref=hop), conversation(), limit=1000)
    assert data.data == b"\xff\xd8jpeg"  # three redirects on an allowed host: fetched, with the token each hop
    one_more = fake.redirect_media(fake.media_url(hop))
    with pytest.raises(AttachmentError) as refused:
        await channel.fetch(Attachment(kind="image", ref=one_more), conversation(), limit=1000)
    assert "more than 3" in str(refused.value)
