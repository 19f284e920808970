"""A real conversation for the console's tests: ingested, then run by the real drain, agent runtime and offline model.

The user asks the offline model for a tool call (``/tool lookup {...}``); ``lookup`` returns outside text (untrusted,
with markup in it), so the transcript must show it as data. Operators' actions are ingested like any message and
applied by the same drain.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import redis.asyncio as aioredis
from pydantic import BaseModel

from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.agent.runtime import Runtime
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.queue.ingest import Ingestor
from switchboard.settings import QueueSettings
from switchboard.types import SessionKey
from switchboard.worker.drain import Drainer
from switchboard.worker.sampling import Sampler
from tests.queue.conftest import RecordingDeliverer

TOOL_OUTPUT: Final = '<img src=x onerror="alert(1)"> 12:00 in Paris'
"""Untrusted tool output with markup: shown as data, never as HTML."""
ARGUMENTS: Final = {"city": "Paris"}
QUESTION: Final = "/tool lookup " + json.dumps(ARGUMENTS)
QUEUE: Final = QueueSettings(name="sbtest", lease_ms=30_000, max_attempts=1, retry_backoff_s=0.0)
"""A lease long enough that a loaded CI machine never takes a turn over mid-test: no test here is about leases."""


class LookupInput(BaseModel):
    city: str


async def _lookup(args: LookupInput, ctx: ToolContext) -> dict[str, Any]:
    return {"page": TOOL_OUTPUT}


def conversation_ref(
    tenant: str = "default", channel: str = "telegram", conversation: str = "c1", agent: str = "assistant"
) -> ConversationRef:
    """Where a test conversation lives."""
    return ConversationRef.model_validate(
        {"tenant": tenant, "agent": agent, "channel": channel, "conversation": conversation}
    )


async def user_says(redis: aioredis.Redis, ref: ConversationRef, text: str, dedup: str) -> SessionKey:
    """Ingest one user message (as a webhook would)."""
    message = InboundMessage(dedup_key=dedup, conversation=ref, sender=Sender(id="42", name="User"), text=text)
    await Ingestor(redis, QUEUE).ingest(message)
    return SessionKey(ref.session_key)


async def drain(
    redis: aioredis.Redis, session: SessionKey, workspace: Path, sampler: Sampler | None = None
) -> RecordingDeliverer:
    """Run the session's waiting turns as a worker does: the real drain, runtime and offline model (and sampling)."""
    registry = default_registry()
    registry.register(
        Tool(name="lookup", description="Look a city up.", input=LookupInput, fn=_lookup, output_trust="data"),
        replace=True,
    )
    runtime = Runtime(models=ModelFactory(ProviderConfig()), tools=registry, workspace_root=workspace)
    agent = Agent(name="assistant", profile=AgentProfile(name="A"), instructions="Answer.", tools=["lookup"])
    deliverer = RecordingDeliverer()
    drainer = Drainer(
        redis,
        QUEUE,
        runner=runtime.run_turn,
        deliverer=deliverer,
        agent_for=lambda m: agent,
        worker_id="w1",
        sampler=sampler,
    )
    await drainer.drain(session)
    return deliverer
