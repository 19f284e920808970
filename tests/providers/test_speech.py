"""Text to speech against OpenAI's speech API faked at HTTP, OGG/Opus checks, and which turns are spoken."""

from __future__ import annotations

import base64
import logging
import struct
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer
from pydantic import ValidationError

from switchboard.channels.base import Capabilities
from switchboard.channels.web.adapter import MAX_FILE_BYTES, WebChannel
from switchboard.core.actions import SendVoice
from switchboard.core.agent.budget import PriceTable
from switchboard.core.agent.config import AgentVoice
from switchboard.core.messages import Attachment, CommandIssued, ConversationRef, InboundMessage, Posted, Sender
from switchboard.core.providers.oggopus import opus_duration, silent_opus
from switchboard.core.providers.speech import OpenAISpeech
from switchboard.errors import DeliveryError, SpeechError
from switchboard.settings import load_settings
from switchboard.worker.voice import VoiceReplies, slots_toggle, toggle_text
from tests.fakes.openai_api import FakeOpenAI

KEY = "sk-test-speech-9f8e7d6c5b4a"


async def test_the_fake_speech_route_answers_real_ogg_opus_through_the_sdk(
    fake_openai: FakeOpenAI, openai_url: str
) -> None:
    speech = OpenAISpeech(model="gpt-4o-mini-tts", voice="coral", api_key=KEY, base_url=openai_url)
    audio = await speech.speak("Hello there, this is a spoken reply.")
    await speech.aclose()
    assert audio[:4] == b"OggS" and audio[28:36] == b"OpusHead"
    assert opus_duration(audio) == pytest.approx(36 / 15, abs=0.02)
    [request] = fake_openai.speech()
    assert request.body == {
        "model": "gpt-4o-mini-tts",
        "voice": "coral",
        "input": "Hello there, this is a spoken reply.",
        "response_format": "opus",
    }


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("wrong_key", "refused the key"),
        ("status_500", "answered HTTP 500"),
        ("slow", "did not answer in time"),
        ("unreachable", "could not be reached"),
    ],
)
async def test_speech_failures_are_short_reasons_without_the_key(
    caplog: pytest.LogCaptureFixture, setup: str, reason: str
) -> None:
    fake = FakeOpenAI(api_key="sk-another" if setup == "wrong_key" else KEY)  # wrong_key: the fake expects another
    fake.speech_status = 500 if setup == "status_500" else 200
    fake.speech_delay_s = 2.0 if setup == "slow" else 0.0
    server = TestServer(fake.app())
    await server.start_server()
    url = str(server.make_url("/v1"))
    if setup == "unreachable":
        await server.close()
    caplog.set_level(logging.DEBUG)
    speech = OpenAISpeech(model="tts-1", voice="alloy", api_key=KEY, base_url=url, timeout_s=0.5)
    with pytest.raises(SpeechError) as raised:
        await speech.speak("hello")
    await speech.aclose()
    await server.close()
    assert reason in str(raised.value)
    assert KEY not in str(raised.value) and KEY not in caplog.text
    if setup == "wrong_key":
        assert fake.speech()[0].headers["authorization"] == f"Bearer {KEY}"  # the key went, and was refused


def test_opus_duration_reads_the_length_and_refuses_what_is_not_intact_ogg_opus() -> None:
    audio = silent_opus(2.5)
    assert opus_duration(audio) == 2.5
    flipped = bytearray(audio)
    flipped[60] ^= 0x01
    not_opus = bytearray(audio)
    not_opus[28:36] = b"OpusHeaX"
    struct.pack_into("<I", not_opus, 22, 0)  # a checksum that no longer matches either
    for bad in (b"", b"ID3\x03mp3 bytes", audio[:-2], bytes(flipped), bytes(not_opus)):
        with pytest.raises(SpeechError):
            opus_duration(bad)


@pytest.mark.parametrize("body", [b"ID3\x04\x00mp3 frames", silent_opus(1.0)[:-5], b""])
async def test_an_answer_that_is_not_ogg_opus_is_refused(fake_openai: FakeOpenAI, openai_url: str, body: bytes) -> None:
    fake_openai.speech_body = body
    speech = OpenAISpeech(model="gpt-4o-mini-tts", voice="coral", api_key=KEY, base_url=openai_url)
    with pytest.raises(SpeechError):
        await speech.speak("hello")
    await speech.aclose()


def _message(*, voice_note: bool = False, command: str | None = None) -> InboundMessage:
    attachments = (Attachment(kind="voice", ref="f1", mime_type="audio/ogg"),) if voice_note else ()
    event = CommandIssued(name=command) if command else Posted(attachments=attachments)
    return InboundMessage(
        id="m1",
        dedup_key="d1",
        conversation=ConversationRef(channel="telegram", conversation="42"),
        sender=Sender(id="7"),
        text="hi",
        event=event,
    )


VOICE = Capabilities(max_text=4096, voice=True)
NO_VOICE = Capabilities(max_text=4096)


@pytest.mark.parametrize(
    ("mode", "voice_note", "toggle", "caps", "spoken"),
    [
        ("off", True, True, VOICE, False),  # off: nothing, whatever the conversation said
        ("on_request", False, None, VOICE, False),
        ("on_request", False, True, VOICE, True),
        ("when_spoken_to", False, None, VOICE, False),
        ("when_spoken_to", True, None, VOICE, True),
        ("when_spoken_to", True, False, VOICE, False),  # /voice off wins
        ("when_spoken_to", False, True, VOICE, True),  # /voice on: every reply
        ("always", False, None, VOICE, True),
        ("always", False, False, VOICE, False),
        ("always", True, None, NO_VOICE, False),  # a channel without voice notes: text only, no speech made
    ],
)
def test_which_turns_are_spoken(
    mode: str, voice_note: bool, toggle: bool | None, caps: Capabilities, spoken: bool
) -> None:
    replies = VoiceReplies(api_key=None, base_url=None)
    voice = AgentVoice.model_validate({"mode": mode})
    assert replies.wanted(voice, [_message(voice_note=voice_note)], caps, toggle) is spoken


def test_the_toggle_is_read_from_the_session_state_and_answered() -> None:
    assert slots_toggle({"voice": b'"on"', "plan": b"{}"}) is True
    assert slots_toggle({"voice": b'"off"'}) is False
    assert slots_toggle({"voice": b"not json"}) is None
    assert slots_toggle({}) is None
    assert toggle_text("always", " ON ") == ("Voice replies on: I will also send my answers as voice notes.", "on")
    assert toggle_text("always", "off")[1] == "off"
    assert toggle_text("always", "maybe")[1] is None
    assert toggle_text("off", "on") == ("Voice replies are not available for this agent.", None)
    here = toggle_text("always", "on", voice_notes=False)  # Slack, Teams: nothing to turn on, nothing stored
    assert here == ("Voice replies are not available here: this chat shows no voice notes.", None)


def test_speech_is_priced_per_thousand_characters() -> None:
    prices = PriceTable({"openai:gpt-4o-mini-tts": {"characters": 15.0}, "openai:gpt-4.1": {"input": 2, "output": 8}})
    assert prices.speech_credits("openai:gpt-4o-mini-tts", 200) == pytest.approx(3.0)
    assert prices.speech_credits("openai:gpt-4o-mini-tts-2025-12-15", 1000) == pytest.approx(15.0)  # by prefix
    assert prices.speech_credits("openai:tts-1", 1000) == 0.0  # no entry: free
    assert prices.rates("openai:gpt-4o-mini-tts") == (0.0, 0.0)


def test_the_voice_block_validates_and_yaml_off_means_off(base_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "voice.yaml"
    config.write_text(
        "agents:\n  assistant:\n    profile: {name: A}\n    instructions: x\n    voice: {mode: off}\n"
    )  # YAML reads a bare off as false
    settings = load_settings(base_env | {"SWITCHBOARD_CONFIG": str(config)})
    assert settings.file.agent("assistant").voice.mode == "off"
    assert VoiceReplies.build(settings) is None  # nobody speaks: nothing is built
    for bad in ({"mode": "sometimes"}, {"max_chars": 5000}, {"max_chars": 0}, {"timeout_s": 0}, {"speed": 2}):
        with pytest.raises(ValidationError):
            AgentVoice.model_validate(bad)


async def test_a_reply_over_max_chars_is_not_sent_to_the_provider(fake_openai: FakeOpenAI, openai_url: str) -> None:
    replies = VoiceReplies(api_key=KEY, base_url=openai_url)
    voice = AgentVoice(mode="always", max_chars=20)
    action, facts = await replies.speak(voice, "This **reply** is longer than twenty characters.", "m1")
    assert action is None and [f.kind for f in facts] == ["voice_replied"] and facts[0].outcome == "too_long"
    action, facts = await replies.speak(voice, "Short **one**.", "m1")
    await replies.aclose()
    assert action is not None and action.text == "Short one." and action.reply_to == "m1"
    assert [f.kind for f in facts] == ["usage_metered"]
    assert [r.body["input"] for r in fake_openai.speech()] == ["Short one."]


def test_the_web_chat_refuses_a_voice_reply_over_its_file_cap() -> None:
    small = SendVoice(audio=base64.b64encode(silent_opus(1.0)).decode(), reply_to="m1")
    event = WebChannel.event_for(small)
    assert event is not None and event[0] == "message" and event[1]["voice"] is True
    big = SendVoice(audio=base64.b64encode(b"\0" * (MAX_FILE_BYTES + 1)).decode())
    with pytest.raises(DeliveryError):
        WebChannel.event_for(big)


async def test_without_a_key_or_a_base_url_no_speech_request_is_made() -> None:
    replies = VoiceReplies(api_key=None, base_url=None)
    action, facts = await replies.speak(AgentVoice(mode="always"), "hello", "m1")
    assert action is None and replies._speakers == {}  # no client was made, nothing went out
    [fact] = facts
    assert fact.kind == "voice_replied" and fact.outcome == "failed" and "OPENAI_API_KEY" in fact.reason
