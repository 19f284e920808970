"""Provider prompt caching at the HTTP boundary: cache fields on the wire, a stable prefix, cached tokens metered."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from pydantic import BaseModel

from switchboard.core.agent.budget import PriceTable
from switchboard.core.agent.config import Agent
from switchboard.core.agent.runtime import Runtime
from switchboard.core.events import UsageMetered
from switchboard.core.model import ModelRequest, ToolSpec, Usage
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.providers.anthropic import AnthropicModel
from switchboard.core.providers.openai import OpenAIModel
from switchboard.core.tools.builtin import ToolRegistry, default_registry
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.worker.authority import turn_request
from tests.core.turns import MemorySink, MemoryStore, message
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.model_script import Call
from tests.fakes.openai_api import FakeOpenAI
from tests.providers.conftest import collect, request

WEATHER = ToolSpec(
    name="get_weather",
    description="Weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
PRICES = {"anthropic:claude-test": {"input": 3.0, "output": 15.0, "cached_input": 0.3, "cache_write": 3.75}}


def breakpoints(body: Any) -> list[Any]:
    """Every ``cache_control`` value anywhere in a request body."""
    found: list[Any] = []
    if isinstance(body, dict):
        if "cache_control" in body:
            found.append(body["cache_control"])
        for value in body.values():
            found += breakpoints(value)
    elif isinstance(body, list):
        for value in body:
            found += breakpoints(value)
    return found


# ---------------------------------------------------------------- the adapters on the wire


async def test_anthropic_marks_the_last_tool_the_system_prompt_and_the_conversation(
    fake_anthropic: FakeAnthropic, anthropic_url: str
) -> None:
    fake_anthropic.reply("ok")
    model = AnthropicModel(api_key="sk-ant-test", base_url=anthropic_url)
    try:
        await collect(model.stream(request(tools=[WEATHER, WEATHER.model_copy(update={"name": "b"})], cache_key="k")))
    finally:
        await model.aclose()

    body = fake_anthropic.received[0].body
    ephemeral = {"type": "ephemeral"}
    assert body["system"] == [{"type": "text", "text": "You are terse.", "cache_control": ephemeral}]
    assert "cache_control" not in body["tools"][0]
    assert body["tools"][-1]["cache_control"] == ephemeral
    assert body["messages"][-1]["content"][-1]["cache_control"] == ephemeral
    assert len(breakpoints(body)) == 3  # Anthropic allows four


async def test_anthropic_without_a_cache_key_sends_no_breakpoint(
    fake_anthropic: FakeAnthropic, anthropic_url: str
) -> None:
    fake_anthropic.reply("ok")
    model = AnthropicModel(api_key="sk-ant-test", base_url=anthropic_url)
    try:
        await collect(model.stream(request(tools=[WEATHER])))
    finally:
        await model.aclose()

    body = fake_anthropic.received[0].body
    assert breakpoints(body) == []
    assert body["system"] == "You are terse."


async def test_anthropic_reports_cache_reads_and_writes_inside_the_input(
    fake_anthropic: FakeAnthropic, anthropic_url: str
) -> None:
    fake_anthropic.reply("ok", input_tokens=1000, cached_input_tokens=700, cache_write_tokens=200, output_tokens=4)
    model = AnthropicModel(api_key="sk-ant-test", base_url=anthropic_url)
    try:
        events = await collect(model.stream(request(cache_key="k")))
    finally:
        await model.aclose()

    assert [e for e in events if isinstance(e, Usage)] == [
        Usage(input_tokens=1000, output_tokens=4, cached_input_tokens=700, cache_write_tokens=200)
    ]


@pytest.mark.parametrize("wire", ["responses", "chat"])
async def test_openai_sends_the_prompt_cache_key_and_reads_cached_tokens(
    fake_openai: FakeOpenAI, openai_url: str, wire: Any
) -> None:
    fake_openai.reply("ok", input_tokens=900, cached_input_tokens=640, output_tokens=3)
    fake_openai.reply("ok")
    model = OpenAIModel(api_key="sk-test", base_url=openai_url, wire_api=wire)
    try:
        events = await collect(model.stream(request(tools=[WEATHER], cache_key="sb-abc")))
        await collect(model.stream(request(tools=[WEATHER])))
    finally:
        await model.aclose()

    cached, uncached = (r.body for r in fake_openai.received)
    assert cached["prompt_cache_key"] == "sb-abc"
    assert "prompt_cache_key" not in uncached
    assert [e for e in events if isinstance(e, Usage)] == [
        Usage(input_tokens=900, output_tokens=3, cached_input_tokens=640)
    ]


# ---------------------------------------------------------------- a turn through the runtime


async def anthropic_turns(
    tmp_path: Path,
    aiohttp_server: Any,
    fake: FakeAnthropic,
    texts: list[str],
    *,
    tenant: str = "acme",
    registry: ToolRegistry | None = None,
    **config: Any,
) -> MemorySink:
    server: TestServer = await aiohttp_server(fake.app())
    models = ModelFactory(ProviderConfig(anthropic_api_key="sk-ant-test", anthropic_base_url=str(server.make_url(""))))
    rt = Runtime(
        models=models,
        tools=registry or default_registry(),
        workspace_root=tmp_path / "ws",
        model_backoff_s=0.0,
        prices=PRICES,
    )
    values = {
        "name": "desk",
        "profile": {"name": "Desk"},
        "instructions": "Be brief.",
        "model": "anthropic:claude-test",
        "tools": ["current_time"],
    }
    agent = Agent.model_validate({**values, **config})
    sink = MemorySink()
    store = MemoryStore()
    try:
        for n, text in enumerate(texts):
            inbound = message(text)
            turn = turn_request(None, inbound.session_key, agent, [inbound], f"run-{n}")
            await rt.run_turn(turn.model_copy(update={"tenant": tenant}), sink, store)
    finally:
        await models.aclose()
        fake.release()
    return sink


def prefix(body: dict[str, Any]) -> str:
    """The cached prefix of an Anthropic request as bytes on the wire: tools, then system."""
    return json.dumps([body.get("tools"), body.get("system")], sort_keys=True)


async def test_two_steps_and_two_turns_send_a_byte_identical_prefix(tmp_path: Path, aiohttp_server: Any) -> None:
    fake = FakeAnthropic()
    fake.reply(calls=[Call("current_time", {})])
    fake.reply("It is noon.")
    fake.reply("Still noon.")

    await anthropic_turns(tmp_path, aiohttp_server, fake, ["what time is it?", "and now?"])

    bodies = [r.body for r in fake.received]
    assert len(bodies) == 3
    assert len({prefix(b) for b in bodies}) == 1
    assert bodies[0]["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert bodies[0]["system"][0]["cache_control"] == {"type": "ephemeral"}
    # the second step starts with the first step's conversation, block for block (its cached part)
    first, second = bodies[0]["messages"], bodies[1]["messages"]
    strip = [{**block, "cache_control": None} for block in first[-1]["content"]]
    assert [{**block, "cache_control": None} for block in second[len(first) - 1]["content"]] == strip


async def test_cached_input_is_metered_at_the_cached_price(tmp_path: Path, aiohttp_server: Any) -> None:
    fake = FakeAnthropic()
    fake.reply(calls=[Call("current_time", {})], input_tokens=2000, cache_write_tokens=1500, output_tokens=10)
    fake.reply("It is noon.", input_tokens=2100, cached_input_tokens=1500, output_tokens=6)

    sink = await anthropic_turns(tmp_path, aiohttp_server, fake, ["what time is it?"])

    metered: list[UsageMetered] = sink.of("usage_metered")
    assert len(metered) == 1
    usage = metered[0]
    assert (usage.input_tokens, usage.cached_input_tokens, usage.cache_write_tokens) == (4100, 1500, 1500)
    # uncached input at 3.0, cache writes at 3.75, cache reads at 0.3, output at 15.0 (credits per 1,000 tokens)
    tool = default_registry().get("current_time")
    assert tool is not None
    expected = ((2000 - 1500) * 3.0 + 1500 * 3.75 + (2100 - 1500) * 3.0 + 1500 * 0.3 + 16 * 15.0) / 1000 + tool.cost
    assert usage.credits == pytest.approx(expected)
    assert usage.credits < (4100 * 3.0 + 16 * 15.0) / 1000 + tool.cost  # cheaper than the same tokens uncached
    steps = sink.of("step")
    assert steps[1].detail["cached_input_tokens"] == 1500


async def test_an_agent_can_turn_prompt_caching_off(tmp_path: Path, aiohttp_server: Any) -> None:
    fake = FakeAnthropic()
    fake.reply("Hi.")

    await anthropic_turns(tmp_path, aiohttp_server, fake, ["hello"], prompt_cache=False)

    assert breakpoints(fake.received[0].body) == []


async def test_the_openai_cache_key_is_stable_per_agent_and_never_shared_across_tenants(
    tmp_path: Path, aiohttp_server: Any
) -> None:
    fake = FakeOpenAI()
    for _ in range(3):
        fake.reply("Hi.")
    server: TestServer = await aiohttp_server(fake.app())
    models = ModelFactory(ProviderConfig(openai_api_key="sk-test", openai_base_url=str(server.make_url("/v1"))))
    rt = Runtime(models=models, tools=default_registry(), workspace_root=tmp_path / "ws", model_backoff_s=0.0)
    agent = Agent.model_validate(
        {"name": "desk", "profile": {"name": "Desk"}, "instructions": "Be brief.", "model": "openai:gpt-test"}
    )
    try:
        for n, tenant in enumerate(["acme", "acme", "globex"]):
            inbound = message(f"hello {n}")
            turn = turn_request(None, inbound.session_key, agent, [inbound], f"run-{n}")
            await rt.run_turn(turn.model_copy(update={"tenant": tenant}), MemorySink(), MemoryStore())
    finally:
        await models.aclose()
        fake.release()

    keys = [r.body["prompt_cache_key"] for r in fake.received]
    assert keys[0] == keys[1] != keys[2]
    assert all(k.startswith("sb-") and "acme" not in k and "desk" not in k for k in keys)


# ---------------------------------------------------------------- the tool catalog, rendered once


class _Lookup(BaseModel):
    query: str


async def _lookup(args: _Lookup, ctx: ToolContext) -> str:
    return args.query


def registry_with_own_tool() -> ToolRegistry:
    """A registry whose ``lookup`` hands each agent its own variant (as REST tools and the networked shell do)."""
    own = Tool(name="lookup", description="Look something up", input=_Lookup, fn=_lookup)
    registry = default_registry()
    registry.register(dataclasses.replace(own, per_agent=lambda agent: own))
    return registry


class Recorder:
    """A model adapter that answers at once and keeps every request it got."""

    provider = "offline"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> Any:
        from switchboard.core.model import Finished, TextDelta

        self.requests.append(request)
        yield TextDelta(text="ok")
        yield Finished()

    async def aclose(self) -> None:
        return None


async def test_the_tool_catalog_is_rendered_once_per_catalog_not_per_turn(tmp_path: Path) -> None:
    recorder = Recorder()
    models = ModelFactory(ProviderConfig())
    models.override("offline", recorder)
    rt = Runtime(models=models, tools=registry_with_own_tool(), workspace_root=tmp_path / "ws")
    agent = Agent.model_validate(
        {
            "name": "desk",
            "profile": {"name": "Desk"},
            "instructions": "Be brief.",
            "model": "offline",
            "tools": ["current_time", "lookup"],
            "codeact": True,
        }
    )
    store = MemoryStore()
    for n in range(3):
        inbound = message(f"hello {n}")
        await rt.run_turn(turn_request(None, inbound.session_key, agent, [inbound], f"run-{n}"), MemorySink(), store)

    first, *later = [r.tools for r in recorder.requests]
    assert [t.name for t in first] == ["current_time", "lookup", "run_program"]
    for tools in later:
        assert all(a is b for a, b in zip(first, tools, strict=True))  # the same objects: not rendered again


def test_cache_prices_default_to_the_input_price() -> None:
    table = PriceTable(
        {"openai:gpt-x": {"input": 2.0, "output": 8.0}, "openai:gpt-y": {"input": 2.0, "cached_input": 0.5}}
    )

    assert table.model_credits("openai:gpt-x", 1000, 0, cached_tokens=800) == pytest.approx(2.0)
    assert table.model_credits("openai:gpt-y-2025", 1000, 0, cached_tokens=800) == pytest.approx(0.2 * 2.0 + 0.8 * 0.5)
