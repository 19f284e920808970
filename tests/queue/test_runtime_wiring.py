"""The real agent runtime through the real drain: channel tools reach the channel once, history is searchable."""

from __future__ import annotations

import json
from pathlib import Path

import redis.asyncio as aioredis

from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.agent.runtime import Runtime
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import default_registry
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.settings import QueueSettings
from tests.queue.conftest import RecordingDeliverer, make_message

TOOLS_AGENT = Agent(
    name="assistant",
    profile=AgentProfile(name="A"),
    instructions="Answer.",
    tools=["current_time", "offer_choice", "search_history"],
)


def _drainer(client: aioredis.Redis, settings: QueueSettings, deliverer: RecordingDeliverer, tmp_path: Path):  # type: ignore[no-untyped-def]
    from switchboard.worker.drain import Drainer

    runtime = Runtime(models=ModelFactory(ProviderConfig()), tools=default_registry(), workspace_root=tmp_path / "ws")
    return Drainer(
        client,
        settings,
        runner=runtime.run_turn,
        deliverer=deliverer,
        agent_for=lambda m: TOOLS_AGENT,
        worker_id="w1",
    )


async def test_channel_tool_action_is_delivered_once_through_the_outbox(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    args = {"question": "Which plan?", "options": ["Basic", "Pro"]}
    message = make_message("/tool offer_choice " + json.dumps(args))
    await ingestor.ingest(message)
    await _drainer(client, queue_settings, deliverer, tmp_path).drain(message.session_key)
    choices = [s for s in deliverer.sent if s.action.kind == "choice"]
    assert len(choices) == 1
    assert [(c.id, c.label) for c in choices[0].action.options] == [("basic", "Basic"), ("pro", "Pro")]  # type: ignore[union-attr]
    assert choices[0].conversation == message.conversation


async def test_search_history_reads_earlier_turns_from_redis(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    drainer = _drainer(client, queue_settings, deliverer, tmp_path)
    first = make_message("my order number is ZX-4411")
    await ingestor.ingest(first)
    await drainer.drain(first.session_key)
    ask = make_message("/tool search_history " + json.dumps({"query": "order number"}))
    await ingestor.ingest(ask)
    await drainer.drain(ask.session_key)
    events = await client.xrange(SessionKeys(ask.session_key).events)
    tool_events = [json.loads(f[b"data"]) for _, f in events if f[b"kind"] == b"tool_called"]
    assert tool_events and tool_events[-1]["tool"] == "search_history" and tool_events[-1]["ok"] is True
    assert "ZX-4411" in deliverer.texts()[-1]
