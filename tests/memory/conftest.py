"""A memory set-up as a worker builds it: a YAML file's projects and agents, the SQLite store, the tool gateway."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.agent.evidence import ContextEvidence
from switchboard.core.approvals.policy import Policy, PolicyConfig
from switchboard.core.events import Event
from switchboard.core.memory.embeddings import Embedder, LocalEmbedder
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.core.memory.tools import memory_tools
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.core.model import ChatMessage, ToolCall
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.calls import ToolOutcome
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.effects import TurnEffects
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.turn import HistoryEntry
from switchboard.settings import FileConfig
from switchboard.types import SessionKey
from tests.memory.stores import (  # noqa: F401
    memory_store,
    pgvector_dsn,
    postgres_store,
    postgres_stores,
    store_maker,
)

CONFIG: dict[str, Any] = {
    "projects": {"shop": {"tenant": "acme"}, "hr": {"tenant": "acme"}, "rival": {"tenant": "globex"}},
    "agents": {
        "support": {"name": "support", "projects": ["shop", "rival"]},
        "people": {"name": "people", "projects": ["hr"]},
    },
}

_n = itertools.count(1)

CLEAN_FORGET = Policy.of(
    (
        "agent:support",
        PolicyConfig.model_validate({"rules": [{"tool": "forget", "decide": "allow", "untrusted": False}]}),
    )
)
"""The policy docs/memory.md shows: ``forget`` (irreversible, so approved by a person by default) allowed in a turn
no untrusted text has entered."""


def inbound(text: str, message_id: str, tenant: str = "acme") -> InboundMessage:
    """A user's message of this turn, as ingest makes it."""
    return InboundMessage(
        id=message_id,
        dedup_key=f"evt-{next(_n)}",
        conversation=ConversationRef(tenant=tenant, agent="support", channel="web", conversation="c1"),
        sender=Sender(id="ann", name="Ann"),
        text=text,
    )


@dataclass
class Turn:
    """What one turn has in view, and the events its tools recorded."""

    inbound: list[InboundMessage] = field(default_factory=list)
    history: list[HistoryEntry] = field(default_factory=list)
    work: list[ChatMessage] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def evidence(self) -> ContextEvidence:
        return ContextEvidence(lambda: self.inbound, lambda: self.history, lambda: self.work)

    def saw(self, call_id: str, tool: str, arguments: dict[str, Any], result: str) -> None:
        """This run called ``tool`` and got ``result``."""
        self.work += [
            ChatMessage(role="assistant", tool_calls=[ToolCall(id=call_id, name=tool, arguments=arguments)]),
            ChatMessage(role="tool", tool_call_id=call_id, name=tool, content=result),
        ]

    async def record(self, event: Event) -> None:
        self.events.append(event)


@dataclass
class Memory:
    """The store, the gateway over the memory tools, and a clock tests may move."""

    store: SQLiteMemoryStore
    gateway: ToolGateway
    root: Path
    now: list[float]

    async def call(
        self,
        name: str,
        args: dict[str, Any],
        turn: Turn | None,
        *,
        tenant: str = "acme",
        agent: str = "support",
        run_id: str = "run-1",
    ) -> ToolOutcome:
        ctx = ToolContext(
            session_key=SessionKey(f"{tenant}/{agent}/web/default/c1"),
            tenant=tenant,
            run_id=run_id,
            actor="web:ann",
            workspace=self.root,
            idempotency_key="",
            effects=TurnEffects(),
            agent=agent,
            record=None if turn is None else turn.record,
            evidence=None if turn is None else turn.evidence(),
            policy=CLEAN_FORGET,
        )
        return await self.gateway.call(name, args, ctx)


def build_memory(tmp_path: Path, embedder: Embedder | None = None) -> Memory:
    """The memory tools over a SQLite store under ``tmp_path``, embedding with ``embedder`` (``None``: words only)."""
    config = FileConfig.model_validate(CONFIG)
    store = SQLiteMemoryStore(tmp_path / "memory")
    now = [1_800_000_000.0]
    clock: Callable[[], float] = lambda: now[0]  # noqa: E731
    registry = ToolRegistry(memory_tools(store, config.connected_projects, clock, embedder))
    return Memory(store, ToolGateway(registry, workspace_root=tmp_path), tmp_path, now)


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    built = build_memory(tmp_path)
    yield built
    built.store.close()


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Memory]:
    """Memory whose tools embed with the local embedder (recall defaults to hybrid search)."""
    built = build_memory(tmp_path, LocalEmbedder())
    yield built
    built.store.close()
