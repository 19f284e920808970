"""Hosted web search, image generation and vision at the fake OpenAI and Anthropic servers, through whole turns."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from switchboard.channels.base import FileData
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.channels.web.adapter import WebChannel
from switchboard.cli.worker import image_provider
from switchboard.core.actions import Action
from switchboard.core.agent.attachments import AttachmentSupport
from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.agent.runtime import Runtime
from switchboard.core.messages import Attachment, ConversationRef, Posted
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.providers.images import OpenAIImages
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.gateway import workspace_for
from switchboard.core.turn import TurnRequest
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from tests.channels.test_telegram import BOT, TOKEN, settings
from tests.channels.test_telegram_sending import conversation
from tests.core.turns import MemorySink, MemoryStore, message
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.model_script import Call
from tests.fakes.openai_api import IMAGES, FakeOpenAI
from tests.fakes.telegram_api import FakeTelegram, RecordingSend


def make_agent(tools: list[str], model: str = "openai:gpt-4.1-mini", **extra: Any) -> Agent:
    return Agent(
        name="assistant", profile=AgentProfile(name="A"), instructions="test", tools=tools, model=model, **extra
    )


def build(config: ProviderConfig, tmp_path: Path, agent: Agent, **kw: Any) -> Runtime:
    registry = default_registry(sandbox=None, agents={agent.name: agent}, **kw)
    return Runtime(models=ModelFactory(config), tools=registry, workspace_root=tmp_path / "ws", model_backoff_s=0.0)


def turn(text: str, agent: Agent, session_key: SessionKey | None = None, **event: Any) -> TurnRequest:
    msg = message(text, event=Posted(**event)) if event else message(text)
    return TurnRequest(
        session_key=session_key or msg.session_key,
        agent=agent,
        messages=[msg],
        run_id="run-1",
        deadline=time.time() + 60,
    )


# ── hosted web search ───────────────────────────────────────────────────────────────────────────


async def test_the_hosted_search_replaces_the_function_tool_and_taints_the_turn(
    fake_openai: FakeOpenAI, openai_url: str, tmp_path: Path
) -> None:
    """OpenAI searches within the response; what it read is outside text, so a later write waits for a person."""
    config = ProviderConfig(openai_api_key="sk-test", openai_base_url=openai_url, openai_wire_api="responses")
    agent = make_agent(["web_search", "send_file"])
    fake_openai.reply("Found it.", searches=["switchboard gateway"], calls=[Call("send_file", {"path": "a.txt"})])
    fake_openai.reply("It needs your approval.")
    sink = MemorySink()
    await build(config, tmp_path, agent).run_turn(turn("search the web", agent), sink, MemoryStore())
    sent = fake_openai.responses()[0]
    tools = sent.body["tools"]
    assert {"type": "web_search"} in tools
    assert [tool["name"] for tool in tools if tool["type"] == "function"] == ["send_file"]
    (called,) = sink.of("tool_called")
    assert (called.tool, called.ok, called.policy) == ("send_file", False, "approve:default:untrusted")


async def test_anthropics_server_side_search_replaces_the_function_tool_and_taints_the_turn(
    fake_anthropic: FakeAnthropic, anthropic_url: str, tmp_path: Path
) -> None:
    config = ProviderConfig(anthropic_api_key="sk-ant-test", anthropic_base_url=anthropic_url)
    agent = make_agent(["web_search", "send_file"], model="anthropic:claude-sonnet-4-5")
    fake_anthropic.reply("Found it.", searches=["switchboard gateway"], calls=[Call("send_file", {"path": "a.txt"})])
    fake_anthropic.reply("It needs your approval.")
    sink = MemorySink()
    await build(config, tmp_path, agent).run_turn(turn("search the web", agent), sink, MemoryStore())
    tools = fake_anthropic.received[0].body["tools"]
    assert {"type": "web_search_20250305", "name": "web_search", "max_uses": 5} in tools
    assert [tool["name"] for tool in tools if "input_schema" in tool] == ["send_file"]
    (called,) = sink.of("tool_called")
    assert (called.tool, called.ok, called.policy) == ("send_file", False, "approve:default:untrusted")


async def test_without_a_hosted_search_the_send_is_not_held(
    fake_openai: FakeOpenAI, openai_url: str, tmp_path: Path
) -> None:
    """The control: the same write in a turn that searched nothing is not gated (it fails on the missing file)."""
    config = ProviderConfig(openai_api_key="sk-test", openai_base_url=openai_url, openai_wire_api="responses")
    agent = make_agent(["web_search", "send_file"])
    fake_openai.reply("Sending.", calls=[Call("send_file", {"path": "a.txt"})])
    fake_openai.reply("Done.")
    sink = MemorySink()
    await build(config, tmp_path, agent).run_turn(turn("send it", agent), sink, MemoryStore())
    (called,) = sink.of("tool_called")
    assert (called.tool, called.error_class) == ("send_file", "validation")


async def test_on_chat_completions_the_function_tool_is_offered_and_says_how_to_configure_a_search_api(
    fake_openai: FakeOpenAI, openai_url: str, tmp_path: Path
) -> None:
    config = ProviderConfig(openai_api_key="sk-test", openai_base_url=openai_url, openai_wire_api="chat")
    agent = make_agent(["web_search"])
    fake_openai.reply(calls=[Call("web_search", {"query": "x"})])
    fake_openai.reply("Sorry.")
    sink = MemorySink()
    result = await build(config, tmp_path, agent).run_turn(turn("search", agent), sink, MemoryStore())
    first = fake_openai.received[0].body
    assert [tool["function"]["name"] for tool in first["tools"]] == ["web_search"]
    (called,) = sink.of("tool_called")
    assert not called.ok
    assert "search.provider to brave, tavily or searxng" in str(result.history)


# ── image generation, delivered through the channel ──────────────────────────────────────────────


@pytest.fixture
async def telegram() -> AsyncIterator[tuple[FakeTelegram, TelegramChannel]]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        adapter = TelegramChannel(settings(server.base_url))
        await adapter.start()
        yield server, adapter
        await adapter.aclose()


class Published:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, session: SessionKey, kind: str, data: dict[str, Any]) -> str:
        self.events.append((kind, data))
        return f"{len(self.events)}-0"


@pytest.mark.parametrize("channel", ["telegram", "web"])
async def test_a_generated_image_is_saved_and_sent_through_the_channel(
    fake_openai: FakeOpenAI,
    openai_url: str,
    tmp_path: Path,
    telegram: tuple[FakeTelegram, TelegramChannel],
    channel: str,
) -> None:
    """The model (the fake) calls generate_image; the fake Images API answers b64_json; the channel gets the photo."""
    config = ProviderConfig(openai_api_key="sk-test", openai_base_url=openai_url)
    agent = make_agent(["generate_image"])
    images = OpenAIImages(api_key="sk-test", base_url=openai_url)
    fake_openai.reply(calls=[Call("generate_image", {"prompt": "A red fox in snow", "caption": "Your fox"})])
    fake_openai.reply("Here it is.")
    bot, adapter = telegram
    web = Published()
    chat = (
        conversation(reply_to=11).model_copy(update={"agent": "assistant"})
        if channel == "telegram"
        else ConversationRef(agent="assistant", channel="web", conversation="abc123")
    )
    workspace = workspace_for(tmp_path / "ws", chat.session_key)

    class ChannelSink(MemorySink):
        async def act(self, action: Action) -> None:
            performer = adapter if channel == "telegram" else WebChannel(web)
            await performer.perform(action, chat, RecordingSend(workspace=workspace))

    try:
        result = await build(config, tmp_path, agent, images=images).run_turn(
            turn("draw a fox", agent, chat.session_key), ChannelSink(), MemoryStore()
        )
    finally:
        await images.aclose()
    assert result.text == "Here it is."
    (asked,) = fake_openai.image_requests()
    assert asked.body == {
        "model": "gpt-image-1",
        "prompt": "A red fox in snow",
        "n": 1,
        "size": "1024x1024",
        "quality": "auto",
        "output_format": "jpeg",
        "output_compression": 80,
    }
    (saved,) = (workspace / "images").iterdir()
    assert saved.name.startswith("a-red-fox-in-snow-") and saved.suffix == ".jpg"
    assert saved.read_bytes() == IMAGES["jpeg"]
    if channel == "telegram":
        (upload,) = bot.files
        assert (upload.method, upload.content, upload.content_type, upload.caption) == (
            "sendPhoto",
            IMAGES["jpeg"],
            "image/jpeg",
            "Your fox",
        )
    else:
        (event,) = [data for kind, data in web.events if "file" in data]
        assert event["text"] == "Your fox" and event["file"]["mime_type"] == "image/jpeg"
        assert base64.b64decode(event["file"]["data"]) == IMAGES["jpeg"]


async def test_a_dall_e_model_is_asked_for_b64_json_and_its_revised_prompt_is_kept(
    fake_openai: FakeOpenAI, openai_url: str, tmp_path: Path
) -> None:
    images = OpenAIImages(api_key="sk-test", base_url=openai_url)
    try:
        drawn = await images.generate(
            "a fox", model="dall-e-3", size="1024x1024", quality="auto", timeout_s=10, format="jpeg", compression=80
        )
    finally:
        await images.aclose()
    (asked,) = fake_openai.image_requests()
    assert asked.body["response_format"] == "b64_json" and "output_format" not in asked.body
    assert (drawn.mime_type, drawn.data, drawn.revised_prompt) == ("image/png", IMAGES["png"], "a fox, in detail")


@pytest.mark.parametrize(
    ("status", "image", "expected"),
    [
        (401, None, "refused the key: check OPENAI_API_KEY"),
        (500, None, "answered HTTP 500"),
        (200, b"<html>not a picture</html>", "not a PNG, JPEG or WebP picture"),
    ],
)
async def test_image_failures_are_tool_errors_that_never_quote_the_upstream(
    fake_openai: FakeOpenAI, openai_url: str, tmp_path: Path, status: int, image: bytes | None, expected: str
) -> None:
    agent = make_agent(["generate_image"], model="offline")
    images = OpenAIImages(api_key="sk-WRONG-key" if status == 401 else "sk-test", base_url=openai_url)
    fake_openai.api_key = "sk-test"
    fake_openai.image_status = 200 if status == 401 else status
    fake_openai.image = image
    sink = MemorySink()
    try:
        result = await build(ProviderConfig(), tmp_path, agent, images=images).run_turn(
            turn('/tool generate_image {"prompt": "a fox"}', agent), sink, MemoryStore()
        )
    finally:
        await images.aclose()
    (called,) = sink.of("tool_called")
    assert not called.ok and expected in str(result.history)
    assert "sk-WRONG" not in str(result.history) + result.text
    assert not (workspace_for(tmp_path / "ws", turn("x", agent).session_key) / "images").exists()


# ── vision ───────────────────────────────────────────────────────────────────────────────────────

PNG = IMAGES["png"]
PHOTO = Attachment(kind="image", ref="p", name="cat.png", mime_type="image/png")


class Platform:
    def __init__(self, files: dict[str, FileData]) -> None:
        self.files = files

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FileData:
        return self.files[attachment.ref]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_model_without_vision_gets_a_note_instead_of_an_image_part(
    fake_openai: FakeOpenAI,
    openai_url: str,
    fake_anthropic: FakeAnthropic,
    anthropic_url: str,
    tmp_path: Path,
    provider: str,
) -> None:
    fake: FakeOpenAI | FakeAnthropic = fake_openai if provider == "openai" else fake_anthropic
    fake.reply("I cannot see it.")
    config = ProviderConfig(
        openai_api_key="sk-test", openai_base_url=openai_url, anthropic_api_key="k", anthropic_base_url=anthropic_url
    )
    model = "openai:gpt-4.1-mini" if provider == "openai" else "anthropic:claude-sonnet-4-5"
    agent = make_agent([], model=model, vision=False)
    support = AttachmentSupport(source=Platform({"p": FileData("cat.png", PNG, "image/png")}))
    rt = Runtime(
        models=ModelFactory(config),
        tools=default_registry(sandbox=None),
        workspace_root=tmp_path / "ws",
        model_backoff_s=0.0,
        attachments=support,
    )
    result = await rt.run_turn(turn("what is this?", agent, attachments=(PHOTO,)), MemorySink(), MemoryStore())
    assert result.text == "I cannot see it."
    assert fake.images() == []
    sent = str(fake.received[0].body)
    assert "you cannot see images" in sent and "inbox/m1-0-cat.png" in sent


async def test_the_worker_makes_an_image_provider_only_when_an_agent_draws(tmp_path: Path) -> None:
    config = tmp_path / "switchboard.yaml"
    body = "agents:\n  a:\n    profile: {{name: A}}\n    instructions: test\n    tools: [{tools}]\ndefault_agent: a\n"
    env = {"SWITCHBOARD_CONFIG": str(config), "SWITCHBOARD_DATA_DIR": str(tmp_path / "data")}
    config.write_text(body.format(tools="current_time"))
    assert image_provider(load_settings(env)) is None
    config.write_text(body.format(tools="generate_image"))
    images = image_provider(load_settings({**env, "OPENAI_API_KEY": "sk-test"}))
    assert isinstance(images, OpenAIImages)
    await images.aclose()


@pytest.mark.parametrize("wire", ["responses", "chat", "anthropic"])
async def test_an_image_reaches_a_vision_model_in_the_providers_own_wire_format(
    fake_openai: FakeOpenAI,
    openai_url: str,
    fake_anthropic: FakeAnthropic,
    anthropic_url: str,
    tmp_path: Path,
    wire: str,
) -> None:
    fake: FakeOpenAI | FakeAnthropic = fake_anthropic if wire == "anthropic" else fake_openai
    fake.reply("A cat.")
    config = ProviderConfig(
        openai_api_key="sk-test",
        openai_base_url=openai_url,
        openai_wire_api="chat" if wire == "chat" else "responses",
        anthropic_api_key="k",
        anthropic_base_url=anthropic_url,
    )
    agent = make_agent([], model="anthropic:claude-sonnet-4-5" if wire == "anthropic" else "openai:gpt-4.1-mini")
    support = AttachmentSupport(source=Platform({"p": FileData("cat.png", PNG, "image/png")}))
    rt = Runtime(
        models=ModelFactory(config),
        tools=default_registry(sandbox=None),
        workspace_root=tmp_path / "ws",
        model_backoff_s=0.0,
        attachments=support,
    )
    result = await rt.run_turn(turn("what is this?", agent, attachments=(PHOTO,)), MemorySink(), MemoryStore())
    assert result.text == "A cat."
    body = fake.received[0].body
    encoded = base64.b64encode(PNG).decode()
    messages = body["messages"] if wire != "responses" else body["input"]
    kinds = ("input_image", "image_url", "image")
    (parts,) = [
        m["content"]
        for m in messages
        if isinstance(m.get("content"), list) and any(p.get("type") in kinds for p in m["content"])
    ]
    if wire == "responses":
        assert parts[0]["type"] == "input_text" and 'trust="untrusted"' in parts[0]["text"]
        assert parts[1] == {"type": "input_image", "image_url": f"data:image/png;base64,{encoded}", "detail": "auto"}
    elif wire == "chat":
        assert parts[0]["type"] == "text"
        assert parts[1] == {
            "type": "image_url",
            "image_url": {"url": f"data:image/png;base64,{encoded}", "detail": "auto"},
        }
    else:  # the image first, then the text about it (and the user's own text, in the same user turn)
        assert parts[0] == {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": encoded}}
        assert parts[1]["type"] == "text" and "inbox/m1-0-cat.png" in parts[1]["text"]
        assert [p["type"] for p in parts[2:]] == ["text"] and "what is this?" in parts[2]["text"]
