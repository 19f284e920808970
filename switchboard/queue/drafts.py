"""Draft agents proposed through ``mcp serve``'s ``propose_agent``: kept in Redis per tenant, never served.

A draft is not in the YAML file's agents, so nothing routes to it, no web chat session may name it and ``mcp serve``
offers no ``ask_`` tool for it. Its owner reviews it (``switchboard agents drafts``, the console) and accepts it,
which writes it where agents are read from (:mod:`switchboard.settings.accepted`), or rejects it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import redis.asyncio as aioredis

from switchboard.core.agent.config import Agent
from switchboard.queue.keys import GlobalKeys

__all__ = ["MAX_DRAFTS", "AgentDraft", "DraftStore"]

MAX_DRAFTS: Final = 50
"""Most drafts a tenant holds at once: a client cannot fill Redis with proposals."""


@dataclass(frozen=True, slots=True)
class AgentDraft:
    """A proposed agent and where it came from."""

    agent: Agent
    tenant: str
    proposed_by: str
    """Who proposed it (``mcp:<client>``)."""
    proposed_at: float


class DraftStore:
    """Propose, list, take and drop one tenant's draft agents."""

    def __init__(self, redis: aioredis.Redis, keys: GlobalKeys | None = None) -> None:
        """Use ``redis`` (owned by the caller)."""
        self._redis = redis
        self._keys = keys or GlobalKeys()

    async def propose(self, tenant: str, agent: Agent, proposed_by: str) -> AgentDraft:
        """Keep ``agent`` as a draft of ``tenant``.

        Raises:
            ValueError: the tenant already has a draft of that name, or :data:`MAX_DRAFTS` drafts.
        """
        key = self._keys.agent_drafts(tenant)
        if await self._redis.hlen(key) >= MAX_DRAFTS:
            raise ValueError(f"tenant {tenant!r} already has {MAX_DRAFTS} drafts waiting: accept or reject some")
        draft = AgentDraft(agent=agent, tenant=tenant, proposed_by=proposed_by, proposed_at=time.time())
        record = {
            "agent": agent.model_dump(mode="json", exclude_defaults=True),
            "proposed_by": proposed_by,
            "proposed_at": draft.proposed_at,
        }
        if not await self._redis.hsetnx(key, agent.name, json.dumps(record, ensure_ascii=False)):
            raise ValueError(f"a draft agent {agent.name!r} is already waiting for its owner")
        return draft

    async def all(self, tenant: str) -> list[AgentDraft]:
        """The tenant's drafts, by name."""
        raw = await self._redis.hgetall(self._keys.agent_drafts(tenant))
        return [_draft(tenant, json.loads(value)) for _, value in sorted(raw.items())]

    async def get(self, tenant: str, name: str) -> AgentDraft | None:
        """One draft, or ``None``."""
        raw = await self._redis.hget(self._keys.agent_drafts(tenant), name)
        return None if raw is None else _draft(tenant, json.loads(raw))

    async def accept(self, tenant: str, name: str, write: Callable[[Agent], Path]) -> Path:
        """Hand the draft to ``write`` (which puts it where agents are read from), then forget it; returns the path.

        Raises:
            LookupError: the tenant has no such draft.
            ValueError: ``write`` refused it (the draft is kept).
        """
        draft = await self.get(tenant, name)
        if draft is None:
            raise LookupError(f"tenant {tenant!r} has no draft agent {name!r}")
        path = write(draft.agent)
        await self.drop(tenant, name)
        return path

    async def drop(self, tenant: str, name: str) -> bool:
        """Remove a draft (accepted or rejected); ``False`` when there was none."""
        return bool(await self._redis.hdel(self._keys.agent_drafts(tenant), name))


def _draft(tenant: str, record: dict[str, Any]) -> AgentDraft:
    return AgentDraft(
        agent=Agent.model_validate(record["agent"]),
        tenant=tenant,
        proposed_by=str(record["proposed_by"]),
        proposed_at=float(record["proposed_at"]),
    )
