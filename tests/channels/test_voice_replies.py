"""Voice replies end to end: signed webhooks in, the real worker, OpenAI's speech API faked at HTTP, the platforms'
fakes out (Telegram ``sendVoice``, WhatsApp media + ``audio`` with ``voice: true``, the web chat's stream)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestServer

from switchboard.channels.meta.whatsapp.fake.payloads import PHONE_NUMBER_ID, delivery, make_message, sign_request
from switchboard.channels.meta.whatsapp.fake.platform import FakeWhatsApp
from switchboard.cli.worker import run_worker
from switchboard.control.reading import usage_rows
from switchboard.control.scope import OperatorScope
from switchboard.core.providers.oggopus import opus_duration, silent_opus
from switchboard.queue.eventlog import read_events
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from switchboard.web.app import create_app
from tests.channels.test_telegram import BOT, SECRET, TOKEN
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.telegram_api import FakeTelegram, check_html, make_update, sign_update
from tests.waiting import wait_until

OPENAI_KEY = "sk-test-voice-0123456789abcdef"

CONFIG = """
default_agent: assistant
agents:
  assistant:
    model: offline
    profile: {{name: Assistant}}
    instructions: You are a test assistant.
    tools: [current_time]
    voice: {{mode: {mode}, voice: coral, max_chars: {max_chars}, timeout_s: 2}}
prices:
  "openai:gpt-4o-mini-tts": {{characters: 15}}
"""


@pytest.fixture
async def openai() -> AsyncIterator[tuple[FakeOpenAI, str]]:
    fake = FakeOpenAI(api_key=OPENAI_KEY)
    server = TestServer(fake.app())
    await server.start_server()
    yield fake, str(server.make_url("/v1"))
    fake.release()
    await server.close()


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        yield server


def environment(
    base_env: dict[str, str], tmp_path: Path, openai_url: str, *, mode: str, max_chars: int = 1000
) -> dict[str, str]:
    config = tmp_path / "voice.yaml"
    config.write_text(CONFIG.format(mode=mode, max_chars=max_chars))
    return base_env | {
        "SWITCHBOARD_CONFIG": str(config),
        "OPENAI_API_KEY": OPENAI_KEY,
        "OPENAI_BASE_URL": openai_url,
        "SWITCHBOARD_TRANSCRIPTION__MODEL": "gpt-4o-mini-transcribe",
    }


def voice_update(telegram: FakeTelegram, chat_id: int, update_id: int) -> dict[str, Any]:
    """A private voice note, as Telegram posts it (the audio is fetchable from the fake with ``getFile``)."""
    note = silent_opus(1.0)
    stored = telegram.store_file(note, name="voice.oga")
    update = make_update("", chat_id=chat_id, update_id=update_id, message_id=update_id)
    del update["message"]["text"]
    update["message"]["voice"] = {
        "file_id": stored.file_id,
        "file_unique_id": f"u{stored.file_id}",
        "duration": 1,
        "mime_type": "audio/ogg",
        "file_size": len(note),
    }
    return update


def command_update(text: str, chat_id: int, update_id: int) -> dict[str, Any]:
    """A message starting with a command, marked as Telegram marks it (a ``bot_command`` entity)."""
    update = make_update(text, chat_id=chat_id, update_id=update_id, message_id=update_id)
    update["message"]["entities"] = [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
    return update


async def post_telegram(client: Any, update: dict[str, Any]) -> None:
    body, headers = sign_update(update, SECRET)
    resp = await client.post("/webhooks/telegram", data=body, headers=headers)
    assert resp.status == 200


class Running:
    """The gateway's web process (through ``aiohttp_client``) and one worker process's loop, in this test."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.stop = asyncio.Event()
        self.worker: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Running:
        self.worker = asyncio.create_task(run_worker(load_settings(self.env), self.stop))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        assert self.worker is not None
        await asyncio.wait_for(asyncio.gather(self.worker, return_exceptions=True), 30)

    def check(self) -> None:
        assert self.worker is not None
        if self.worker.done():
            self.worker.result()  # the worker died: show why


async def session_events(redis_url: str, session: str) -> list[dict[str, Any]]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        return await read_events(client, SessionKey(session))
    finally:
        await client.aclose()


async def completed(redis_url: str, session: str) -> int:
    """Turns the session completed so far (a turn completes after its voice note was sent, or given up)."""
    return sum(1 for event in await session_events(redis_url, session) if event["kind"] == "run_completed")


async def test_a_voice_note_in_is_answered_in_text_and_with_a_voice_note_on_telegram(
    aiohttp_client: Any,
    base_env: dict[str, str],
    tmp_path: Path,
    telegram: FakeTelegram,
    openai: tuple[FakeOpenAI, str],
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake_openai, url = openai
    fake_openai.transcripts.append("book a table for **two**")
    env = environment(base_env, tmp_path, url, mode="when_spoken_to") | {
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": TOKEN,
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": telegram.base_url,
    }
    client = await aiohttp_client(create_app(load_settings(env)))
    caplog.set_level(logging.DEBUG)
    async with Running(env) as running:
        await post_telegram(client, voice_update(telegram, 601, 7001))

        async def spoken() -> bool:
            running.check()
            return bool(telegram.sent(601, method="sendVoice"))

        await wait_until(spoken, "a voice note on Telegram")
    [text] = telegram.sent(601)
    assert 'You said: "[voice note, transcribed] book a table for two"' in check_html(text.params["text"])
    [voice] = telegram.sent(601, method="sendVoice")
    assert voice.seq > text.seq  # the text first, for everyone; then the note
    [uploaded] = [f for f in telegram.files if f.method == "sendVoice"]
    assert uploaded.content_type == "audio/ogg" and uploaded.chat_id in (601, "601")
    seconds = opus_duration(uploaded.content)  # a real OGG/Opus stream, as the provider made it
    [request] = fake_openai.speech()
    spoken_text = request.body["input"]
    assert spoken_text.startswith('You said: "[voice note, transcribed] book a table for two"')  # plain text
    assert "**" not in spoken_text and "<b>" not in spoken_text
    assert (request.body["model"], request.body["voice"], request.body["response_format"]) == (
        "gpt-4o-mini-tts",
        "coral",
        "opus",
    )
    assert request.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert abs(seconds - len(spoken_text) / 15) < 0.05
    assert voice.params["duration"] in (str(max(round(seconds), 1)), max(round(seconds), 1))
    events = await session_events(redis_url, "default/assistant/telegram/default/601")
    [replied] = [e for e in events if e["kind"] == "voice_replied"]
    assert (replied["outcome"], replied["chars"]) == ("sent", len(spoken_text))
    metered = [e for e in events if e["kind"] == "usage_metered" and e["model"] == "openai:gpt-4o-mini-tts"]
    assert [m["credits"] for m in metered] == [pytest.approx(len(spoken_text) * 15 / 1000)]
    everything = caplog.text + repr(events)
    assert OPENAI_KEY not in everything  # the key is never logged nor recorded
    control = aioredis.Redis.from_url(redis_url)
    try:
        [row] = await usage_rows(control, OperatorScope.everything("console:test"))
    finally:
        await control.aclose()
    assert row.runs == 1  # the speech is metered with the run, not counted as another one
    assert row.credits == pytest.approx(sum(m["credits"] for m in metered))


@pytest.mark.parametrize(
    ("mode", "voiced"),
    [
        ("off", set()),
        ("when_spoken_to", {"voice"}),
        ("always", {"text", "voice"}),
    ],
)
async def test_which_replies_are_spoken_by_mode(
    aiohttp_client: Any,
    base_env: dict[str, str],
    tmp_path: Path,
    telegram: FakeTelegram,
    openai: tuple[FakeOpenAI, str],
    redis_url: str,
    mode: str,
    voiced: set[str],
) -> None:
    _, url = openai
    env = environment(base_env, tmp_path, url, mode=mode) | {
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": TOKEN,
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": telegram.base_url,
    }
    client = await aiohttp_client(create_app(load_settings(env)))
    chats = {"text": 611, "voice": 612}
    async with Running(env) as running:
        await post_telegram(client, make_update("hello in text", chat_id=chats["text"], update_id=7101))
        await post_telegram(client, voice_update(telegram, chats["voice"], 7102))

        async def answered() -> bool:
            running.check()
            sessions = [f"default/assistant/telegram/default/{chat}" for chat in chats.values()]
            return all([await completed(redis_url, session) == 1 for session in sessions])

        await wait_until(answered, "both turns completed (their voice notes sent, or not made)")
    got = {kind for kind, chat in chats.items() if telegram.sent(chat, method="sendVoice")}
    assert got == voiced
    assert all(len(telegram.sent(chat)) == 1 for chat in chats.values())  # one text reply each, in every mode


@pytest.mark.parametrize(
    ("failure", "outcome", "notes", "requests"),
    [
        ("http_500", "failed", 0, 1),  # the provider failed
        ("timeout", "failed", 0, 1),  # the provider was slower than voice.timeout_s
        ("too_long", "too_long", 0, 0),  # over max_chars: never sent to OpenAI
        ("refused", "undelivered", 0, 1),  # Telegram refused the note (the user forbids voice messages)
        ("rate_limited", "sent", 1, 1),  # a 429 on sendVoice: retried by the outbox, sent once, not spoken twice
    ],
)
async def test_whatever_befalls_the_voice_note_the_text_reply_is_sent_once(
    aiohttp_client: Any,
    base_env: dict[str, str],
    tmp_path: Path,
    telegram: FakeTelegram,
    openai: tuple[FakeOpenAI, str],
    redis_url: str,
    failure: str,
    outcome: str,
    notes: int,
    requests: int,
) -> None:
    fake_openai, url = openai
    if failure == "http_500":
        fake_openai.speech_status = 500
    elif failure == "timeout":
        fake_openai.speech_delay_s = 5.0  # the agent's voice.timeout_s is 2
    elif failure == "refused":
        telegram.refuse_next(1, status=400, description="Bad Request: VOICE_MESSAGES_FORBIDDEN", method="sendVoice")
    elif failure == "rate_limited":
        telegram.fail_next(1, retry_after=0.2, method="sendVoice")
    env = environment(base_env, tmp_path, url, mode="always", max_chars=10 if failure == "too_long" else 1000) | {
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": TOKEN,
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": telegram.base_url,
    }
    client = await aiohttp_client(create_app(load_settings(env)))
    session = "default/assistant/telegram/default/621"
    async with Running(env) as running:
        await post_telegram(client, make_update("say this out loud", chat_id=621, update_id=7201))

        async def decided() -> bool:
            running.check()
            return await completed(redis_url, session) == 1

        await wait_until(decided, "the turn completed", timeout=20)
    [text] = telegram.sent(621)
    assert "say this out loud" in check_html(text.params["text"])
    assert len(telegram.sent(621, method="sendVoice")) == notes
    tried = [call.status for call in telegram.calls if call.method == "sendVoice"]
    assert tried == {"refused": [400], "rate_limited": [429, 200]}.get(failure, [])
    events = await session_events(redis_url, session)
    [replied] = [e for e in events if e["kind"] == "voice_replied"]
    assert replied["outcome"] == outcome
    assert len(fake_openai.speech()) == requests
    assert [e for e in events if e["kind"] == "run_failed"] == []  # the turn did not fail, nor was it retried


async def test_voice_on_and_off_per_conversation(
    aiohttp_client: Any,
    base_env: dict[str, str],
    tmp_path: Path,
    telegram: FakeTelegram,
    openai: tuple[FakeOpenAI, str],
    redis_url: str,
) -> None:
    _, url = openai
    env = environment(base_env, tmp_path, url, mode="on_request") | {
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": TOKEN,
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": telegram.base_url,
    }
    client = await aiohttp_client(create_app(load_settings(env)))
    chat = 631
    async with Running(env) as running:

        async def say(text: str, update_id: int, turns: int) -> None:
            update = command_update if text.startswith("/") else make_update
            await post_telegram(client, update(text, chat_id=chat, update_id=update_id))

            async def answered() -> bool:
                running.check()
                return await completed(redis_url, f"default/assistant/telegram/default/{chat}") >= turns

            await wait_until(answered, f"the turn of {text!r} completed")

        await say("before asking", 7301, 1)
        assert telegram.sent(chat, method="sendVoice") == []  # on_request: nothing until asked
        await say("/voice on", 7302, 2)
        assert "Voice replies on" in telegram.sent(chat)[-1].params["text"]
        assert telegram.sent(chat, method="sendVoice") == []  # the confirmation is not spoken
        await say("now spoken", 7303, 3)
        assert len(telegram.sent(chat, method="sendVoice")) == 1
        await say("/voice off", 7304, 4)
        assert "Voice replies off" in telegram.sent(chat)[-1].params["text"]
        await say("text again", 7305, 5)
        assert len(telegram.sent(chat, method="sendVoice")) == 1


async def test_voice_on_where_the_agent_has_no_voice_says_so(
    aiohttp_client: Any,
    base_env: dict[str, str],
    telegram: FakeTelegram,
) -> None:
    env = base_env | {
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": TOKEN,
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": telegram.base_url,
    }
    client = await aiohttp_client(create_app(load_settings(env)))
    async with Running(env) as running:
        await post_telegram(client, command_update("/voice on", chat_id=641, update_id=7401))

        async def answered() -> bool:
            running.check()
            return bool(telegram.sent(641))

        await wait_until(answered, "the answer to /voice on")
    assert "not available" in telegram.sent(641)[0].params["text"]


@pytest.fixture
async def whatsapp() -> AsyncIterator[FakeWhatsApp]:
    async with FakeWhatsApp() as server:
        yield server


async def test_a_whatsapp_voice_note_is_answered_with_a_voice_message(
    aiohttp_client: Any,
    base_env: dict[str, str],
    tmp_path: Path,
    whatsapp: FakeWhatsApp,
    openai: tuple[FakeOpenAI, str],
) -> None:
    fake_openai, url = openai
    fake_openai.transcripts.append("hello from whatsapp")
    app_secret = "5d41402abc4b2a76b9719d911017c592"
    env = environment(base_env, tmp_path, url, mode="when_spoken_to") | {
        "SWITCHBOARD_WHATSAPP__ACCESS_TOKEN": "EAAdefault",
        "SWITCHBOARD_WHATSAPP__APP_SECRET": app_secret,
        "SWITCHBOARD_WHATSAPP__VERIFY_TOKEN": "verify-me",
        "SWITCHBOARD_WHATSAPP__PHONE_NUMBER_ID": PHONE_NUMBER_ID,
        "SWITCHBOARD_WHATSAPP__GRAPH_BASE_URL": whatsapp.graph_url,
    }
    client = await aiohttp_client(create_app(load_settings(env), listeners=False))
    user = "15557654321"
    media_id = whatsapp.host_media(silent_opus(1.0), "audio/ogg; codecs=opus")
    note = make_message("audio", sender=user, id=media_id, mime_type="audio/ogg; codecs=opus", voice=True)
    body, headers = sign_request(delivery([note]), app_secret)
    async with Running(env) as running:
        resp = await client.post("/webhooks/whatsapp", data=body, headers=headers)
        assert resp.status == 200

        async def spoken() -> bool:
            running.check()
            return bool(whatsapp.state.sent("audio", to=user))

        await wait_until(spoken, "a voice message on WhatsApp")
    [text, audio] = whatsapp.state.sent(to=user)
    assert text["type"] == "text" and "hello from whatsapp" in text["text"]["body"]
    assert audio["audio"]["voice"] is True
    stored, mime = whatsapp.state.media[audio["audio"]["id"]]  # uploaded first, sent by id
    assert mime == "audio/ogg" and opus_duration(stored) > 0
