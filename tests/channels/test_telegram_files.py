"""The Telegram adapter's files: out from the session workspace (photo or document, captions), in by ``getFile``
with a size cap."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.channels.telegram.files import MAX_DOCUMENT_BYTES, MAX_FETCH_BYTES, MAX_PHOTO_BYTES
from switchboard.core.actions import Action, SendFile
from switchboard.core.agent.replay import ReplayModel
from switchboard.core.messages import Attachment
from switchboard.core.tools.gateway import workspace_for
from switchboard.errors import AttachmentError, DeliveryError, RateLimitedError
from tests.channels.test_telegram import BOT, TOKEN, settings
from tests.channels.test_telegram_sending import conversation
from tests.core.turns import MemorySink, MemoryStore, answer_step, calls_step
from tests.core.turns import agent as make_agent
from tests.core.turns import request as turn_request
from tests.core.turns import runtime as make_runtime
from tests.fakes.telegram_api import FakeTelegram, RecordingSend


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        yield server


@pytest.fixture
async def channel(fake: FakeTelegram) -> AsyncIterator[TelegramChannel]:
    adapter = TelegramChannel(settings(fake.base_url))
    await adapter.start()
    yield adapter
    await adapter.aclose()


# ── files out (from the workspace) ──────────────────────────────────────────────────────────────

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


async def test_an_image_goes_up_as_a_photo_with_its_caption(
    channel: TelegramChannel, fake: FakeTelegram, tmp_path: Path
) -> None:
    (tmp_path / "charts").mkdir()
    (tmp_path / "charts" / "q3.png").write_bytes(PNG)
    send = RecordingSend(workspace=tmp_path)
    action = SendFile(path="charts/q3.png", caption="Sales **Q3**", mime_type="image/png")
    receipt = await channel.perform(action, conversation(reply_to=11), send)
    [upload] = fake.files
    assert (upload.method, upload.filename, upload.content_type, upload.content) == (
        "sendPhoto",
        "q3.png",
        "image/png",
        PNG,
    )
    assert upload.chat_id == 501 and upload.caption == "Sales <b>Q3</b>"
    [call] = fake.sent(501, method="sendPhoto")
    assert call.params["parse_mode"] == "HTML" and call.params["reply_parameters"]["message_id"] == 11
    assert receipt.platform_ids == (str(upload.message_id),) == tuple(send.recorded)
    assert receipt.detail["method"] == "sendPhoto"
    assert fake.sent(501) == []  # no stray text message


async def test_other_files_go_up_as_documents(channel: TelegramChannel, fake: FakeTelegram, tmp_path: Path) -> None:
    body = b"%PDF-1.7\n" + b"x" * 5000
    (tmp_path / "report.pdf").write_bytes(body)
    await channel.perform(SendFile(path="report.pdf"), conversation(), RecordingSend(workspace=tmp_path))
    [upload] = fake.files
    assert (upload.method, upload.filename, upload.content_type, upload.content) == (
        "sendDocument",
        "report.pdf",
        "application/pdf",
        body,
    )


async def test_a_photo_telegram_cannot_process_goes_again_as_a_document(
    channel: TelegramChannel, fake: FakeTelegram, tmp_path: Path
) -> None:
    (tmp_path / "tall.png").write_bytes(PNG)
    fake.refuse_next(1, status=400, description="Bad Request: PHOTO_INVALID_DIMENSIONS", method="sendPhoto")
    await channel.perform(SendFile(path="tall.png"), conversation(), RecordingSend(workspace=tmp_path))
    [upload] = fake.files
    assert upload.method == "sendDocument" and upload.content == PNG


async def test_an_image_over_the_photo_cap_goes_as_a_document(
    channel: TelegramChannel, fake: FakeTelegram, tmp_path: Path
) -> None:
    with (tmp_path / "poster.jpg").open("wb") as out:
        out.truncate(MAX_PHOTO_BYTES + 1)
    await channel.perform(SendFile(path="poster.jpg"), conversation(), RecordingSend(workspace=tmp_path))
    [upload] = fake.files
    assert upload.method == "sendDocument" and upload.size == MAX_PHOTO_BYTES + 1


async def test_files_over_50_mb_or_missing_are_refused_for_good(
    channel: TelegramChannel, fake: FakeTelegram, tmp_path: Path
) -> None:
    with (tmp_path / "huge.zip").open("wb") as out:
        out.truncate(MAX_DOCUMENT_BYTES + 1)
    with pytest.raises(DeliveryError, match="50000000 bytes") as caught:
        await channel.perform(SendFile(path="huge.zip"), conversation(), RecordingSend(workspace=tmp_path))
    assert not caught.value.retryable
    with pytest.raises(DeliveryError) as missing:
        await channel.perform(SendFile(path="gone.pdf"), conversation(), RecordingSend(workspace=tmp_path))
    assert not missing.value.retryable
    assert fake.files == [] and fake.calls[-1].method == "getMe"


async def test_a_long_caption_keeps_its_rest_as_a_message_and_a_retry_resumes(
    channel: TelegramChannel, fake: FakeTelegram, tmp_path: Path
) -> None:
    (tmp_path / "a.txt").write_text("hello")
    caption = " ".join(f"word{n}" for n in range(200))  # ~1,400 characters, over Telegram's 1,024
    fake.fail_next(1, retry_after=1, method="sendMessage")
    send = RecordingSend(workspace=tmp_path)
    with pytest.raises(RateLimitedError):
        await channel.perform(SendFile(path="a.txt", caption=caption), conversation(), send)
    assert len(send.recorded) == 1  # the file went; its caption's rest did not
    receipt = await channel.perform(SendFile(path="a.txt", caption=caption), conversation(), send)
    [upload] = fake.files  # not uploaded twice
    [rest] = fake.sent(501)
    assert upload.caption is not None and len(upload.caption) <= 1024
    assert (upload.caption + " " + rest.params["text"]).split() == caption.split()
    assert receipt.parts == 2 and len(receipt.platform_ids) == 2


# ── files in (fetched lazily, size-capped) ──────────────────────────────────────────────────────


async def test_fetch_downloads_a_file_the_user_sent(channel: TelegramChannel, fake: FakeTelegram) -> None:
    stored = fake.store_file(b"%PDF-1.7 report", name="report.pdf")
    attachment = Attachment(kind="document", ref=stored.file_id, name="report.pdf", mime_type="application/pdf")
    data = await channel.fetch(attachment, conversation(), limit=1000)
    assert (data.name, data.data, data.mime_type) == ("report.pdf", b"%PDF-1.7 report", "application/pdf")
    [call] = fake.sent(method="getFile")
    assert call.params == {"file_id": stored.file_id}


async def test_fetch_refuses_before_downloading_when_the_size_is_known(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    stored = fake.store_file(b"x" * 5000, name="big.bin")
    with pytest.raises(AttachmentError) as said:  # the update said how big it is: not even getFile
        await channel.fetch(Attachment(kind="document", ref=stored.file_id, size=5000), conversation(), limit=4999)
    assert said.value.too_large and fake.sent(method="getFile") == []
    with pytest.raises(AttachmentError) as told:  # getFile says how big it is: no download
        await channel.fetch(Attachment(kind="document", ref=stored.file_id), conversation(), limit=4999)
    assert told.value.too_large and len(fake.sent(method="getFile")) == 1


async def test_fetch_stops_reading_past_the_cap_when_the_size_is_not_said(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    stored = fake.store_file(b"y" * 300_000, name="quiet.bin", reported_size=None)
    with pytest.raises(AttachmentError) as caught:
        await channel.fetch(Attachment(kind="document", ref=stored.file_id), conversation(), limit=100_000)
    assert caught.value.too_large and TOKEN not in str(caught.value)
    whole = await channel.fetch(Attachment(kind="document", ref=stored.file_id), conversation(), limit=300_000)
    assert len(whole.data) == 300_000


async def test_fetch_of_a_gone_or_too_big_file_says_why(channel: TelegramChannel, fake: FakeTelegram) -> None:
    with pytest.raises(AttachmentError, match="invalid file_id") as gone:
        await channel.fetch(Attachment(kind="image", ref="NOPE"), conversation(), limit=1000)
    assert not gone.value.too_large
    big = fake.store_file(b"", name="huge.bin", reported_size=None)
    fake.state.stored[big.file_id] = type(big)(big.file_id, big.file_path, b"z" * (MAX_FETCH_BYTES + 1), None)
    with pytest.raises(AttachmentError) as refused:
        await channel.fetch(Attachment(kind="video", ref=big.file_id), conversation(), limit=10**9)
    assert refused.value.too_large


async def test_send_file_tool_delivers_the_workspace_file_to_telegram(
    channel: TelegramChannel, fake: FakeTelegram, tmp_path: Path
) -> None:
    """The real tool, through the tool gateway and the runtime, to the fake Bot API: the bytes arrive."""
    chat = conversation(reply_to=11).model_copy(update={"agent": "assistant"})
    workspace = workspace_for(tmp_path / "ws", chat.session_key)
    workspace.mkdir(parents=True)
    (workspace / "chart.png").write_bytes(PNG)

    class ChannelSink(MemorySink):
        async def act(self, action: Action) -> None:
            await channel.perform(action, chat, RecordingSend(workspace=workspace))

    model = ReplayModel(
        [calls_step(("send_file", {"path": "chart.png", "caption": "Your chart"}), step=1), answer_step("Sent.")]
    )
    sink = ChannelSink()
    turn = turn_request("chart please", agent_=make_agent(tools=["send_file"]))
    turn = turn.model_copy(update={"session_key": chat.session_key})
    result = await make_runtime(tmp_path, model=model).run_turn(turn, sink, MemoryStore())
    assert result.text == "Sent."
    [upload] = fake.files
    assert upload.content == PNG and upload.filename == "chart.png" and upload.caption == "Your chart"
