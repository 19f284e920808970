"""Model routing: the small model runs the first step, the strong one the synthesis after a tool result."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from aiohttp.test_utils import TestServer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from switchboard import tracing
from switchboard.core.agent.config import Agent
from switchboard.core.agent.runtime import Runtime
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import default_registry
from switchboard.queue.keys import SessionKeys
from switchboard.worker.authority import turn_request
from switchboard.worker.commands import model_override
from switchboard.worker.worker import traced_runner
from tests.core.turns import MemorySink, MemoryStore, message
from tests.fakes.model_script import Call
from tests.fakes.openai_api import FakeOpenAI

ROUTED = {"small": "openai:gpt-small", "strong": "openai:gpt-strong"}


async def run(tmp_path: Path, aiohttp_server: Any, fake: FakeOpenAI, **config: Any) -> MemorySink:
    server: TestServer = await aiohttp_server(fake.app())
    models = ModelFactory(ProviderConfig(openai_api_key="sk-test", openai_base_url=str(server.make_url("/v1"))))
    rt = Runtime(models=models, tools=default_registry(), workspace_root=tmp_path / "ws", model_backoff_s=0.0)
    agent = Agent.model_validate(
        {"name": "a", "profile": {"name": "a"}, "instructions": "Be brief.", "tools": ["current_time"], **config}
    )
    inbound = message("what time is it?")
    sink = MemorySink()
    try:
        await rt.run_turn(turn_request(None, inbound.session_key, agent, [inbound], "run-1"), sink, MemoryStore())
    finally:
        await models.aclose()
        fake.release()
    return sink


async def test_the_small_model_routes_and_the_strong_one_synthesises(tmp_path: Path, aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    fake.reply(calls=[Call("current_time", {})])
    fake.reply("It is noon.")

    sink = await run(tmp_path, aiohttp_server, fake, models=ROUTED)

    assert [r.body["model"] for r in fake.received] == ["gpt-small", "gpt-strong"]
    steps = sink.of("step")
    assert [(s.decision, s.detail["model"]) for s in steps] == [
        ("tool_calls", "openai:gpt-small"),
        ("answer", "openai:gpt-strong"),
    ]


async def test_a_direct_answer_stays_on_the_small_model(tmp_path: Path, aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    fake.reply("Hello.")

    await run(tmp_path, aiohttp_server, fake, models=ROUTED)

    assert Counter(r.body["model"] for r in fake.received) == {"gpt-small": 1}


async def test_a_task_class_can_pin_every_step_to_the_strong_model(tmp_path: Path, aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    fake.reply(calls=[Call("current_time", {})])
    fake.reply("It is noon.")
    classes = {"research": {"match": {"keywords": ["time"]}, "model": "strong"}}

    sink = await run(tmp_path, aiohttp_server, fake, models=ROUTED, task_classes=classes)

    assert Counter(r.body["model"] for r in fake.received) == {"gpt-strong": 2}
    assert sink.of("usage_metered")[0].task_class == "research"


async def test_without_routing_the_agent_model_runs_every_step(tmp_path: Path, aiohttp_server: Any) -> None:
    fake = FakeOpenAI()
    fake.reply(calls=[Call("current_time", {})])
    fake.reply("It is noon.")

    sink = await run(tmp_path, aiohttp_server, fake, model="openai:gpt-one")

    assert Counter(r.body["model"] for r in fake.received) == {"gpt-one": 2}
    assert sink.of("turn_classified") == []


async def test_the_trace_shows_the_class_and_each_step_model(tmp_path: Path, aiohttp_server: Any) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    fake = FakeOpenAI()
    fake.reply(calls=[Call("current_time", {})])
    fake.reply("It is noon.")
    server: TestServer = await aiohttp_server(fake.app())
    models = ModelFactory(ProviderConfig(openai_api_key="sk-test", openai_base_url=str(server.make_url("/v1"))))
    rt = Runtime(models=models, tools=default_registry(), workspace_root=tmp_path / "ws", model_backoff_s=0.0)
    agent = Agent.model_validate(
        {
            "name": "a",
            "profile": {"name": "a"},
            "instructions": "Be brief.",
            "tools": ["current_time"],
            "models": ROUTED,
            "task_classes": {"lookup": {"match": {"keywords": ["time"]}, "max_steps": 3}},
        }
    )
    inbound = message("what time is it?")
    try:
        request = turn_request(None, inbound.session_key, agent, [inbound], "run-1")
        await traced_runner(rt.run_turn)(request, MemorySink(), MemoryStore())
    finally:
        tracing.install(None)
        provider.shutdown()
        await models.aclose()
        fake.release()

    finished = exporter.get_finished_spans()
    [run_span] = [s for s in finished if s.name == "run"]
    assert run_span.attributes is not None and run_span.attributes["switchboard.task_class"] == "lookup"
    calls = sorted((s for s in finished if s.name == "model.call"), key=lambda s: s.start_time or 0)
    assert [(s.attributes or {}).get("gen_ai.request.model") for s in calls] == ["gpt-small", "gpt-strong"]


async def test_a_model_chosen_with_slash_model_runs_every_step(async_redis: aioredis.Redis) -> None:
    agent = Agent.model_validate(
        {"name": "a", "instructions": "x", "models": ROUTED, "models_allowed": ["openai:gpt-careful"]}
    )
    session = message("hi").session_key
    await async_redis.set(SessionKeys(session).model, "openai:gpt-careful")

    chosen = await model_override(async_redis, session, agent)

    assert (chosen.model, chosen.models) == ("openai:gpt-careful", None)
