"""Seams for the session-queue tests: a message factory, simple runners and a recording deliverer.

These are our own interfaces (TurnRunner, Deliverer), not imitations of Redis: every test runs against
the real server from the suite's fixtures.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import redis.asyncio as aioredis

from switchboard.channels.base import Capabilities, Receipt, SendContext
from switchboard.core.actions import Action
from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.queue.connection import async_client
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.shards import shard_of
from switchboard.settings import QueueSettings
from switchboard.worker.drain import Drainer, TurnRunner

AGENT = Agent(name="assistant", profile=AgentProfile(name="A"), instructions="Answer.")
_counter = itertools.count(1)


def make_message(
    text: str, *, conversation: str = "c1", dedup: str | None = None, channel: str = "telegram"
) -> InboundMessage:
    return InboundMessage(
        dedup_key=dedup or f"evt-{next(_counter)}",
        conversation=ConversationRef(agent="assistant", channel=channel, conversation=conversation),  # type: ignore[arg-type]
        sender=Sender(id="u1", name="User"),
        text=text,
    )


def conversation_in_shard(shard: int, prefix: str) -> str:
    """The first conversation ``<prefix><n>`` whose session (as :func:`make_message` makes it) is in ``shard``."""
    return next(
        name
        for name in (f"{prefix}{n}" for n in range(1_000_000))
        if shard_of(make_message("x", conversation=name).session_key) == shard
    )


async def queued_entries(client: aioredis.Redis, session: str) -> list[str]:
    """The drain entries waiting in ``session``'s shard queue, head first."""
    return [e.decode() for e in await client.lrange(SessionKeys(session).shard.drainq, 0, -1)]  # type: ignore[arg-type]


def agent_for(message: InboundMessage) -> Agent:
    return AGENT


async def echo_runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
    """Replies with the texts of the turn's messages; 'poison' raises."""
    texts = [m.text for m in request.messages]
    if any("poison" in t for t in texts):
        raise RuntimeError("poisoned")
    await sink.delta("echo")
    return TurnResult(text="echo: " + " | ".join(texts), steps=1)


@dataclass
class Sent:
    action: Action
    conversation: ConversationRef
    key: str


@dataclass
class RecordingDeliverer:
    """Records every action performed (our own seam between the drain and the channels).

    ``streaming`` makes it a channel whose own transport streams (the web chat's ``StreamDelta``); it shows typing
    and, like the web chat, the agent's status (``statuses``).
    """

    streaming: bool = False
    sent: list[Sent] = field(default_factory=list)
    typing: bool = True
    typing_refresh_s: float = 4.0
    statuses: bool = True
    tool_activity: bool = False

    def capabilities(self, conversation: ConversationRef) -> Capabilities:
        streaming = "transport" if self.streaming else "none"
        return Capabilities(
            max_text=4096,
            streaming=streaming,
            typing=self.typing,
            typing_refresh_s=self.typing_refresh_s,
            statuses=self.statuses,
            tool_activity=self.tool_activity,
        )

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        self.sent.append(Sent(action, conversation, send.idempotency_key))
        return Receipt(platform_ids=(str(len(self.sent)),))

    def texts(self, kind: str = "text") -> list[str]:
        return [getattr(s.action, "text", getattr(s.action, "code", "")) for s in self.sent if s.action.kind == kind]


@pytest.fixture
def queue_settings() -> QueueSettings:
    return QueueSettings(
        name="sbtest",
        lease_ms=2000,
        reaper_interval_s=0.2,
        max_attempts=3,
        retry_backoff_s=0.0,
        concurrency=64,
        events_maxlen=1000,
        history_maxlen=50,
        stream_after_s=0.0,
        delta_every_s=0.0,
    )


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    redis = async_client(redis_url)
    yield redis
    await redis.aclose()


@pytest.fixture
def ingestor(client: aioredis.Redis, queue_settings: QueueSettings) -> Ingestor:
    return Ingestor(client, queue_settings)


@pytest.fixture
def deliverer() -> RecordingDeliverer:
    return RecordingDeliverer()


def make_drainer(
    client: aioredis.Redis,
    settings: QueueSettings,
    deliverer: RecordingDeliverer,
    runner: TurnRunner = echo_runner,
    worker_id: str = "w1",
) -> Drainer:
    return Drainer(client, settings, runner=runner, deliverer=deliverer, agent_for=agent_for, worker_id=worker_id)
