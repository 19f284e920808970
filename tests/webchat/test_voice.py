"""The web chat's voice replies: the answer, then its audio as a ``voice`` file event (OpenAI's speech API faked)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestServer

from switchboard.channels.registry import ChannelSet
from switchboard.channels.web.adapter import WebChannel
from switchboard.core.agent.config import Agent, AgentVoice
from switchboard.core.messages import InboundMessage
from switchboard.core.providers.oggopus import opus_duration
from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.types import SessionKey
from switchboard.worker.drain import Drainer
from switchboard.worker.voice import VoiceReplies
from tests.fakes.openai_api import FakeOpenAI

from .conftest import Chat, read_sse

OPENAI_KEY = "sk-test-voice-web"


@pytest.fixture
async def openai() -> AsyncIterator[tuple[FakeOpenAI, str]]:
    fake = FakeOpenAI(api_key=OPENAI_KEY)
    server = TestServer(fake.app())
    await server.start_server()
    yield fake, str(server.make_url("/v1"))
    await server.close()


async def test_the_web_chat_gets_the_reply_then_its_audio(chat: Chat, openai: tuple[FakeOpenAI, str]) -> None:
    _, url = openai

    async def echo(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        return TurnResult(text=f"You said: {request.messages[-1].text}", steps=1)

    agent = Agent(name="assistant", voice=AgentVoice(mode="always"))

    def agent_for(message: InboundMessage) -> Agent:
        return agent

    voice = VoiceReplies(api_key=OPENAI_KEY, base_url=url)
    settings = chat.settings.queue.model_copy(update={"max_attempts": 1, "retry_backoff_s": 0})
    channels = ChannelSet({("web", "default"): WebChannel(chat.publisher.publish)})
    drainer = Drainer(
        chat.redis, settings, runner=echo, deliverer=channels, agent_for=agent_for, worker_id="w1", voice=voice
    )
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    message_id = await chat.send(token, "hello web", client_id="c1")
    await drainer.drain(SessionKey(session))
    await voice.aclose()
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:
        events = await read_sse(resp, 6)
    messages = [e.data for e in events if e.event == "message"]
    assert [m.get("text") for m in messages] == ["You said: hello web", ""]
    audio = messages[1]
    assert audio["voice"] is True and audio["reply_to"] == message_id
    assert audio["file"]["mime_type"] == "audio/ogg"
    assert opus_duration(base64.b64decode(audio["file"]["data"])) > 0
