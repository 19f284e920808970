"""Images reach vision models as image input, voice notes are transcribed: through the real SDKs, at the fakes."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest

from switchboard.channels.base import FileData
from switchboard.core.agent.attachments import AttachmentSupport
from switchboard.core.agent.runtime import Runtime
from switchboard.core.messages import Attachment, ConversationRef, Posted
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.providers.transcription import OpenAITranscriber
from switchboard.core.tools.builtin import default_registry
from switchboard.core.turn import TurnRequest
from switchboard.errors import AttachmentError
from tests.core.turns import MemorySink, MemoryStore, agent, message
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.openai_api import FakeOpenAI

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
VOICE = b"OggS" + b"\x01" * 200


class Platform:
    """Our own AttachmentSource seam (the channel side is the channels' own tests)."""

    def __init__(self, files: dict[str, FileData]) -> None:
        self.files = files

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FileData:
        return self.files[attachment.ref]


def build(config: ProviderConfig, tmp_path: Path, support: AttachmentSupport) -> Runtime:
    return Runtime(
        models=ModelFactory(config),
        tools=default_registry(),
        workspace_root=tmp_path / "ws",
        model_backoff_s=0.0,
        attachments=support,
    )


def posted(text: str, attachment: Attachment, model: str) -> TurnRequest:
    msg = message(text, event=Posted(attachments=(attachment,)))
    return TurnRequest(
        session_key=msg.session_key,
        agent=agent(tools=()).model_copy(update={"model": model}),
        messages=[msg],
        run_id="run-1",
        deadline=time.time() + 60,
    )


PHOTO = Attachment(kind="image", ref="p", name="cat.png", mime_type="image/png")


@pytest.mark.parametrize("wire", ["responses", "chat"])
async def test_an_image_reaches_openai_as_image_input(
    wire: str, fake_openai: FakeOpenAI, openai_url: str, tmp_path: Path
) -> None:
    fake_openai.reply("A cat.")
    config = ProviderConfig(openai_api_key="sk-test", openai_base_url=openai_url, openai_wire_api=wire)  # type: ignore[arg-type]
    rt = build(config, tmp_path, AttachmentSupport(source=Platform({"p": FileData("cat.png", PNG, "image/png")})))
    sink = MemorySink()
    result = await rt.run_turn(posted("what is this?", PHOTO, "openai:gpt-4.1-mini"), sink, MemoryStore())
    assert result.text == "A cat."
    assert fake_openai.images() == ["data:image/png;base64," + base64.b64encode(PNG).decode()]
    body = fake_openai.received[0].body
    texts = str(body.get("input") or body.get("messages"))
    assert "what is this?" in texts and "inbox/m1-0-cat.png" in texts


async def test_an_image_reaches_anthropic_as_an_image_block(
    fake_anthropic: FakeAnthropic, anthropic_url: str, tmp_path: Path
) -> None:
    fake_anthropic.reply("A cat.")
    config = ProviderConfig(anthropic_api_key="sk-ant-test", anthropic_base_url=anthropic_url)
    rt = build(config, tmp_path, AttachmentSupport(source=Platform({"p": FileData("cat.png", PNG, "image/png")})))
    result = await rt.run_turn(
        posted("what is this?", PHOTO, "anthropic:claude-sonnet-4-5"), MemorySink(), MemoryStore()
    )
    assert result.text == "A cat."
    assert fake_anthropic.images() == [
        {"type": "base64", "media_type": "image/png", "data": base64.b64encode(PNG).decode()}
    ]


async def test_an_image_arrives_in_an_untrusted_data_message(
    fake_openai: FakeOpenAI, openai_url: str, tmp_path: Path
) -> None:
    fake_openai.reply("ok")
    config = ProviderConfig(openai_api_key="sk-test", openai_base_url=openai_url)
    rt = build(config, tmp_path, AttachmentSupport(source=Platform({"p": FileData("cat.png", PNG, "image/png")})))
    result = await rt.run_turn(posted("hi", PHOTO, "openai:gpt-4o"), MemorySink(), MemoryStore())
    sent = fake_openai.received[0].body["input"]
    image_items = [item for item in sent if isinstance(item.get("content"), list)]
    assert len(image_items) == 1 and 'trust="untrusted"' in image_items[0]["content"][0]["text"]
    assert result.text == "ok"


async def test_a_voice_note_is_transcribed_and_the_transcript_is_what_the_model_reads(
    fake_openai: FakeOpenAI, openai_url: str, tmp_path: Path
) -> None:
    fake_openai.transcripts.append("remind me to call Bob at five")
    transcriber = OpenAITranscriber(model="gpt-4o-mini-transcribe", api_key="sk-test", base_url=openai_url)
    support = AttachmentSupport(source=Platform({"v": FileData("", VOICE, "audio/ogg")}), transcriber=transcriber)
    rt = build(ProviderConfig(), tmp_path, support)  # the offline model echoes what it reads
    voice = Attachment(kind="voice", ref="v", mime_type="audio/ogg", size=len(VOICE))
    result = await rt.run_turn(posted("", voice, "offline"), MemorySink(), MemoryStore())
    assert result.text.startswith('You said: "[voice note, transcribed] remind me to call Bob at five"')
    (audio,) = [r for r in fake_openai.received if r.path == "/v1/audio/transcriptions"]
    assert audio.body == {"model": "gpt-4o-mini-transcribe", "file_name": "voice.oga", "content_type": "audio/ogg",
                          "bytes": len(VOICE)}  # fmt: skip
    assert audio.headers["authorization"] == "Bearer sk-test"
    assert [e.text for e in result.history] == ["[voice note, transcribed] remind me to call Bob at five"]
    await transcriber.aclose()


async def test_a_retried_turn_reads_its_cached_transcript_instead_of_transcribing_again(
    fake_openai: FakeOpenAI, openai_url: str, tmp_path: Path
) -> None:
    fake_openai.transcripts.append("book the table for four")
    transcriber = OpenAITranscriber(model="whisper-1", api_key="sk-test", base_url=openai_url)
    support = AttachmentSupport(source=Platform({"v": FileData("", VOICE, "audio/ogg")}), transcriber=transcriber)
    rt = build(ProviderConfig(), tmp_path, support)
    voice = Attachment(kind="voice", ref="v", mime_type="audio/ogg", size=len(VOICE))
    request = posted("", voice, "offline")
    first = await rt.run_turn(request, MemorySink(), MemoryStore())
    again = await rt.run_turn(request, MemorySink(), MemoryStore())  # the same turn retried (worker lost, re-run)
    assert first.text == again.text
    assert again.text.startswith('You said: "[voice note, transcribed] book the table for four"')
    assert len([r for r in fake_openai.received if r.path == "/v1/audio/transcriptions"]) == 1
    await transcriber.aclose()


async def test_a_failed_transcription_is_a_note_not_a_failed_turn(
    fake_openai: FakeOpenAI, openai_url: str, tmp_path: Path
) -> None:
    fake_openai.audio_status = 400
    transcriber = OpenAITranscriber(model="whisper-1", api_key="sk-test", base_url=openai_url)
    support = AttachmentSupport(
        source=Platform({"v": FileData("memo.m4a", VOICE, "audio/mp4")}), transcriber=transcriber
    )
    rt = build(ProviderConfig(), tmp_path, support)
    voice = Attachment(kind="audio", ref="v", name="memo.m4a")
    result = await rt.run_turn(posted("listen", voice, "offline"), MemorySink(), MemoryStore())
    assert "could not be transcribed: the transcription provider answered HTTP 400" in result.text
    with pytest.raises(AttachmentError, match="too large"):
        await transcriber.transcribe("big.ogg", b"x" * (25 * 2**20 + 1), "audio/ogg")
    await transcriber.aclose()
