"""A voice reply in real Chromium against a real ``switchboard run``: the answer, then a player that plays it.

OpenAI's speech route is faked at HTTP (in a thread of this process); the gateway's worker asks it for the spoken
reply and the page shows an ``<audio>`` player under the answer. Chromium decoding the OGG/Opus to a duration shows
the bytes are real audio and that the page's policy lets the player load it (a refusal is a console error, which
fails the test).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator

import pytest
from aiohttp import web
from playwright.async_api import expect

from tests.browser.conftest import CHROMIUM, GUARD_MS, SKIP_REASON, ChatPage, Gateway, run_gateway
from tests.fakes.openai_api import FakeOpenAI

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON),
    pytest.mark.asyncio(loop_scope="module"),
]

OpenChat = Callable[[], Awaitable[ChatPage]]

CONFIG = """
default_agent: assistant
agents:
  assistant:
    model: offline
    profile: {name: Assistant}
    instructions: You are a test assistant.
    tools: [current_time]
    voice: {mode: always, voice: coral}
"""


@pytest.fixture(scope="module")
def speech() -> Iterator[tuple[FakeOpenAI, str]]:
    """The fake OpenAI API on a loopback port, served from its own thread for the module."""
    fake = FakeOpenAI(api_key="sk-browser-voice")
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(fake.app())
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield fake, f"http://127.0.0.1:{port}/v1"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


@pytest.fixture(scope="module")
def gateway(speech: tuple[FakeOpenAI, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The gateway with a speaking agent, its worker pointed at the fake speech route."""
    _, url = speech
    root = tmp_path_factory.mktemp("gateway-voice")
    config = root / "switchboard.yaml"
    config.write_text(CONFIG)
    yield from run_gateway(root, config, extra_env={"OPENAI_API_KEY": "sk-browser-voice", "OPENAI_BASE_URL": url})


async def test_the_answer_is_followed_by_a_player_that_plays_it(
    open_chat: OpenChat, speech: tuple[FakeOpenAI, str]
) -> None:
    fake, _ = speech
    chat = await open_chat()
    page = chat.page
    await chat.type_and_send("read this to me")
    await chat.wait_answered(1)
    player = page.locator("[data-testid=msg-assistant] [data-testid=msg-voice]")
    await expect(player).to_have_count(1, timeout=GUARD_MS)
    await expect(player).to_have_attribute("controls", "")
    duration = await player.evaluate(
        """(audio) => new Promise((resolve, reject) => {
             if (audio.readyState >= 1) return resolve(audio.duration);
             audio.addEventListener("loadedmetadata", () => resolve(audio.duration));
             audio.addEventListener("error", () => reject(new Error("cannot play: " + audio.error?.code)));
           })"""
    )
    [request] = fake.speech()
    spoken = request.body["input"]
    assert 'You said: "read this to me"' in spoken
    assert duration == pytest.approx(len(spoken) / 15, abs=0.1)  # Chromium decoded the OGG/Opus the fake made
    (_, reply) = await chat.transcript()
    assert 'You said: "read this to me"' in reply[1]  # the text stays, above the player

    await chat.reload()  # replayed history: the player again, once
    await expect(page.locator("[data-testid=msg-voice]")).to_have_count(1, timeout=GUARD_MS)
