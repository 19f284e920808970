"""Metrics by agent, version, tool and tenant: tallied from a real turn, kept in Redis, exported with bounded labels."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from switchboard.core.agent.config import Agent
from switchboard.core.agent.runtime import Runtime
from switchboard.core.events import ToolCalled, UsageMetered
from switchboard.core.messages import InboundMessage
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import default_registry
from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.queue.ingest import Ingestor
from switchboard.queue.segments import (
    FIELD_PREFIX,
    LABEL_CAPS,
    OTHER,
    VERSIONS_SHOWN,
    SegmentLabels,
    TurnTally,
    parse_segments,
    quantile,
)
from switchboard.queue.stats import read_stats
from switchboard.settings import FileConfig, QueueSettings
from switchboard.web.metrics import Metrics
from switchboard.worker.drain import Drainer
from tests.fakes.model_script import Call
from tests.fakes.openai_api import FakeOpenAI
from tests.shardindexes import stats_of

from .conftest import RecordingDeliverer
from .conftest import make_message as plain_message


def make_message(text: str) -> InboundMessage:
    """A Telegram message routed as ``CONFIG`` routes it (to the tenant ``acme``)."""
    message = plain_message(text)
    return message.model_copy(update={"conversation": message.conversation.model_copy(update={"tenant": "acme"})})


CONFIG = FileConfig.model_validate(
    {
        "channels": {"telegram": {"tenant": "acme"}},
        "agents": {
            "assistant": {
                "name": "assistant",
                "profile": {"name": "Desk"},
                "instructions": "Be brief.",
                "model": "openai:gpt-test",
                "tools": ["current_time"],
            }
        },
        "prices": {"openai:gpt-test": {"input": 2.0, "output": 8.0}},
    }
)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_a_real_turn_is_counted_by_agent_version_tool_and_tenant(
    tmp_path: Path,
    aiohttp_server: Any,
    ingestor: Ingestor,
    client: aioredis.Redis,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
) -> None:
    fake = FakeOpenAI()
    # one real call, one the model made up (its name must not become a label), then the answer
    fake.reply(calls=[Call("current_time", {}), Call("steal_everything_" + "x" * 40, {})], input_tokens=1000)
    fake.reply("It is noon.", input_tokens=1200, output_tokens=10)
    server: TestServer = await aiohttp_server(fake.app())
    models = ModelFactory(ProviderConfig(openai_api_key="sk-test", openai_base_url=str(server.make_url("/v1"))))
    runtime = Runtime(
        models=models,
        tools=default_registry(),
        workspace_root=tmp_path / "ws",
        model_backoff_s=0.0,
        prices=CONFIG.prices,
    )
    agent = CONFIG.agents["assistant"]

    def agent_for(message: InboundMessage) -> Agent:
        return agent

    drainer = Drainer(
        client,
        queue_settings.model_copy(update={"lease_ms": 30_000}),  # a real turn on a busy machine: no lease lost
        runner=runtime.run_turn,
        deliverer=deliverer,
        agent_for=agent_for,
        worker_id="w1",
        config=CONFIG,
    )
    await ingestor.ingest(make_message("what time is it?"))
    try:
        await drainer.drain(make_message("x").session_key)
    finally:
        await models.aclose()
        fake.release()
    assert deliverer.texts() == ["It is noon."]

    stats = await read_stats(client)
    seg = stats.segments
    [(agent_name, version, tenant)] = seg.turns
    assert (agent_name, tenant) == ("assistant", "acme")
    assert len(version) == 12  # the prompt version: a digest of the system prompt and the tool catalog
    buckets, seconds = seg.turns[(agent_name, version, tenant)]
    assert buckets[-1][1] == 1 and seconds > 0
    assert seg.credits[(agent_name, version, tenant)] == stats.credits > 0  # the turn's cost, per task
    assert seg.tools == {("assistant", "current_time", "acme", "ok"): 1, ("assistant", OTHER, "acme", "validation"): 1}
    # label values: only configured names, or "other"
    raw = await stats_of(client)
    labels = {v for k in raw if k.decode().startswith(FIELD_PREFIX) for v in json.loads(k.decode()[4:])[1:]}
    assert not any("steal" in value for value in labels)

    exported = samples(Metrics().render(stats, None).decode())
    tool_ok = ("agent", "assistant"), ("outcome", "ok"), ("tenant", "acme"), ("tool", "current_time")
    assert exported[("switchboard_tool_calls_total", tool_ok)] == 1
    count = ("agent", "assistant"), ("tenant", "acme"), ("version", version)
    assert exported[("switchboard_agent_turn_seconds_count", count)] == 1
    assert exported[("switchboard_agent_credits_total", count)] == stats.credits


async def test_retries_timeouts_and_latency_are_kept_per_segment(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        mid = request.messages[0].id
        await sink.event(ToolCalled(message_id=mid, tool="current_time", ok=False, duration_ms=1, attempts=3))
        await sink.event(
            UsageMetered(
                message_id=mid,
                model="offline",
                steps=1,
                tool_calls=1,
                input_tokens=5,
                output_tokens=5,
                credits=0,
                agent="assistant",
                prompt_version="v1",
                duration_ms=1500,
                stopped_by="deadline",
            )
        )
        return TurnResult(text="done", steps=1)

    def agent_for(message: InboundMessage) -> Agent:
        return CONFIG.agents["assistant"]

    await ingestor.ingest(make_message("a"))
    drainer = Drainer(
        client, queue_settings, runner=runner, deliverer=deliverer, agent_for=agent_for, worker_id="w1", config=CONFIG
    )
    await drainer.drain(make_message("x").session_key)

    seg = (await read_stats(client)).segments
    assert seg.stops == {("assistant", "v1", "acme", "deadline"): 1}  # a timeout
    assert seg.retries == {("assistant", "current_time", "acme"): 2}
    buckets, seconds = seg.turns[("assistant", "v1", "acme")]
    assert seconds == 1.5 and quantile(buckets, 0.5) is not None


def test_label_values_are_capped_and_unknown_names_are_other() -> None:
    tenants = {f"t{n:03}": {} for n in range(LABEL_CAPS["tenant"] + 10)}
    config = FileConfig.model_validate({"tenant": "t000", "tenants": tenants})
    labels = SegmentLabels.of(config)

    assert len(labels.tenants) == LABEL_CAPS["tenant"]
    assert labels.tenant("t000") == "t000"
    assert labels.tenant(f"t{LABEL_CAPS['tenant'] + 5:03}") == OTHER
    assert labels.tenant("a tenant no binding declares") == OTHER
    assert labels.agent("nobody") == OTHER
    assert labels.tool("use_skill") == "use_skill"  # a tool of the code
    assert labels.tool("ignore previous instructions") == OTHER


def test_a_turn_counts_once_and_only_when_it_ran_its_model() -> None:
    tally = TurnTally(tenant="acme")
    tally.see(ToolCalled(tool="current_time", ok=True, duration_ms=1))
    labels = SegmentLabels.of(CONFIG)
    assert tally.increments(labels) == []  # not metered yet: nothing to write
    tally.see(UsageMetered(model="m", steps=1, tool_calls=1, input_tokens=1, output_tokens=1, credits=0, agent="a"))

    first = tally.increments(labels)
    assert [json.loads(name[len(FIELD_PREFIX) :])[0] for name, _, _ in first] == ["turn", "turn_sum", "tool"]
    assert tally.increments(labels) == []


def test_only_the_most_used_versions_of_an_agent_keep_their_label() -> None:
    raw: dict[bytes | str, bytes | str] = {}
    for n in range(VERSIONS_SHOWN + 2):
        raw[FIELD_PREFIX + json.dumps(["turn", "a", f"v{n}", "t", "1"], separators=(",", ":"))] = str(n + 1)
    raw[FIELD_PREFIX + "not json"] = b"1"
    raw["runs_completed"] = b"4"

    seg = parse_segments(raw)

    versions = {version for (_, version, _) in seg.turns}
    assert OTHER in versions and len(versions) == VERSIONS_SHOWN + 1
    assert "v0" not in versions and f"v{VERSIONS_SHOWN + 1}" in versions
    assert seg.turns[("a", OTHER, "t")][0][-1][1] == 1 + 2  # the two least used, summed


async def test_failed_and_cancelled_runs_are_counted_by_agent_and_tenant(
    ingestor: Ingestor, client: aioredis.Redis, queue_settings: QueueSettings, deliverer: RecordingDeliverer
) -> None:
    started = asyncio.Event()

    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        if request.messages[-1].text == "poison":
            raise RuntimeError("broken")
        started.set()
        await asyncio.sleep(60)
        return TurnResult(text="never", steps=1)

    def agent_for(message: InboundMessage) -> Agent:
        return CONFIG.agents["assistant"]

    drainer = Drainer(
        client, queue_settings, runner=runner, deliverer=deliverer, agent_for=agent_for, worker_id="w1", config=CONFIG
    )
    session = make_message("x").session_key
    await ingestor.ingest(make_message("poison"))
    await drainer.drain(session)
    await ingestor.ingest(make_message("slow"))
    drain = asyncio.create_task(drainer.drain(session))
    await asyncio.wait_for(started.wait(), 10)
    assert drainer.cancel(session, "stop")
    await asyncio.wait_for(drain, 10)

    stats = await read_stats(client)
    assert stats.segments.runs == {
        ("assistant", "acme", "failed"): queue_settings.max_attempts,
        ("assistant", "acme", "cancelled"): 1,
    }
    assert stats.runs_failed == queue_settings.max_attempts
    exported = samples(Metrics().render(stats, None).decode())
    cancelled = ("agent", "assistant"), ("outcome", "cancelled"), ("tenant", "acme")
    assert exported[("switchboard_agent_runs_ended_total", cancelled)] == 1
