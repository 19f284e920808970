"""Attachments end to end through a real channel adapter: Telegram's fake Bot API in, OpenAI's fake audio API."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from switchboard.channels.registry import ChannelSet
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.channels.telegram.settings import TelegramSettings
from switchboard.core.agent.attachments import AttachmentLimits, AttachmentSupport
from switchboard.core.agent.replay import ReplayModel
from switchboard.core.agent.runtime import Runtime
from switchboard.core.messages import Attachment, ConversationRef, InboundMessage, Posted, Sender
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.providers.transcription import OpenAITranscriber
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.gateway import workspace_for
from switchboard.core.turn import TurnRequest
from switchboard.settings import load_settings
from switchboard.worker.files import ChannelAttachments, attachment_support, transcription_model
from tests.core.turns import MemorySink, MemoryStore, agent, answer_step
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.telegram_api import FakeTelegram

TOKEN = "123456:TEST-token-abcdefghijklmnopqrstuv"


@pytest.fixture
async def telegram() -> AsyncIterator[TelegramChannel]:
    async with FakeTelegram(token=TOKEN, username="bot") as fake:
        settings = TelegramSettings.model_validate(
            {"bot_token": TOKEN, "secret_token": "s3cret", "api_base_url": fake.base_url}
        )
        adapter = TelegramChannel(settings, account="default")
        adapter.fake = fake  # type: ignore[attr-defined]
        yield adapter
        await adapter.aclose()


def turn(*attachments: Attachment, text: str = "", account: str = "default") -> TurnRequest:
    msg = InboundMessage(
        id="m1",
        dedup_key="u1",
        conversation=ConversationRef(agent="a", channel="telegram", account=account, conversation="42"),
        sender=Sender(id="7"),
        text=text,
        event=Posted(attachments=attachments),
    )
    return TurnRequest(
        session_key=msg.session_key, agent=agent(), messages=[msg], run_id="run-1", deadline=time.time() + 60
    )


def build(tmp_path: Path, support: AttachmentSupport, model: ReplayModel | None = None) -> Runtime:
    models = ModelFactory(ProviderConfig())
    if model is not None:
        models.override("offline", model)
    return Runtime(models=models, tools=default_registry(), workspace_root=tmp_path / "ws", attachments=support)


async def test_a_telegram_voice_note_is_fetched_stored_and_transcribed(
    telegram: TelegramChannel, fake_openai: FakeOpenAI, openai_url: str, tmp_path: Path
) -> None:
    voice = b"OggS" + b"\x02" * 500
    stored = telegram.fake.store_file(voice, name="voice.oga")  # type: ignore[attr-defined]
    fake_openai.transcripts.append("book a table for two")
    transcriber = OpenAITranscriber(model="whisper-1", api_key="sk-test", base_url=openai_url)
    support = AttachmentSupport(source=ChannelAttachments(ChannelSet({("telegram", "default"): telegram})),
                                transcriber=transcriber)  # fmt: skip
    req = turn(Attachment(kind="voice", ref=stored.file_id, mime_type="audio/ogg", size=len(voice)))
    result = await build(tmp_path, support).run_turn(req, MemorySink(), MemoryStore())
    assert result.text.startswith('You said: "[voice note, transcribed] book a table for two"')
    workspace = workspace_for(tmp_path / "ws", req.messages[0].session_key)
    (saved,) = (workspace / "inbox").iterdir()  # named after the file Telegram reports
    assert saved.name.startswith("m1-0-") and saved.name.endswith("voice.oga") and saved.read_bytes() == voice
    (audio,) = [r for r in fake_openai.received if r.path == "/v1/audio/transcriptions"]
    assert (audio.body["model"], audio.body["bytes"]) == ("whisper-1", len(voice))
    await transcriber.aclose()


async def test_a_telegram_document_over_the_cap_is_a_note_and_an_unknown_account_too(
    telegram: TelegramChannel, tmp_path: Path
) -> None:
    big = telegram.fake.store_file(b"x" * 5000, name="dump.sql", reported_size=None)  # type: ignore[attr-defined]
    channels = ChannelSet({("telegram", "default"): telegram})
    support = AttachmentSupport(source=ChannelAttachments(channels), limits=AttachmentLimits(max_bytes=4096))
    model = ReplayModel([answer_step("ok"), answer_step("ok")], strict=False)
    rt = build(tmp_path, support, model)
    doc = Attachment(kind="document", ref=big.file_id, name="dump.sql")  # no size: refused while downloading
    await rt.run_turn(turn(doc, text="load this"), MemorySink(), MemoryStore())
    assert "which could not be read: too large (limit 4 KiB)" in model.requests[0].messages[-1].content
    assert not (workspace_for(tmp_path / "ws", turn().messages[0].session_key) / "inbox").exists()
    await rt.run_turn(turn(doc, account="other"), MemorySink(), MemoryStore())
    assert "its channel is not enabled in this worker" in model.requests[1].messages[-1].content


def test_transcription_is_on_with_an_openai_key_unless_turned_off(base_env: dict[str, str]) -> None:
    assert transcription_model(load_settings(base_env)) is None
    with_key = {**base_env, "OPENAI_API_KEY": "sk-test"}
    assert transcription_model(load_settings(with_key)) == "gpt-4o-mini-transcribe"
    assert transcription_model(load_settings({**with_key, "SWITCHBOARD_TRANSCRIPTION__MODEL": "off"})) is None
    assert (
        transcription_model(load_settings({**base_env, "SWITCHBOARD_TRANSCRIPTION__MODEL": "whisper-1"})) == "whisper-1"
    )
    settings = load_settings({**base_env, "SWITCHBOARD_ATTACHMENTS__MAX_BYTES": "4096"})
    support = attachment_support(settings, None)
    assert (support.limits.max_bytes, support.limits.max_count, support.transcriber) == (4096, 10, None)
