"""Agent–project connections made by operators (console or CLI), and the audit stream of operators' memory changes.

The YAML file connects agents to projects (``agents.<name>.projects``); operators add connections at run time, kept
here per tenant, and the worker merges both before each turn (:mod:`switchboard.worker.projects`). Every operator
change to memory — a fact corrected or deleted, an agent connected or disconnected — is one entry of the capped
audit stream with who did it; the entry holds ids and names, never a fact's text (the reason is kept with the fact's
change record in the memory store).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, cast, get_args

from switchboard.queue.keys import GlobalKeys

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["AUDIT_CAP", "AuditEntry", "AuditOp", "ProjectConnections"]

AUDIT_CAP: Final = 10_000
"""Entries kept in the memory audit stream."""

AuditOp = Literal["corrected", "forgotten", "connected", "disconnected"]

_KEYS: Final = GlobalKeys()
_OPS: Final = frozenset(get_args(AuditOp))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One operator change to memory: who, what, where; never content."""

    at: float
    actor: str
    op: AuditOp
    tenant: str
    project: str
    fact_id: str = ""
    agent: str = ""


class ProjectConnections:
    """The operators' agent–project connections of every tenant, and the memory audit stream."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis

    async def of(self, tenant: str) -> dict[str, list[str]]:
        """Agent → the projects operators connected it to in ``tenant`` (sorted)."""
        found: dict[str, list[str]] = {}
        for raw in await self.redis.smembers(_KEYS.project_connections(tenant)):
            try:
                agent, project = json.loads(_text(raw))
            except (ValueError, TypeError):
                continue
            found.setdefault(str(agent), []).append(str(project))
        return {agent: sorted(projects) for agent, projects in sorted(found.items())}

    async def connect(self, tenant: str, agent: str, project: str, actor: str) -> bool:
        """Connect ``agent`` to ``project``; ``False`` when it already was (nothing recorded then)."""
        added = await self.redis.sadd(_KEYS.project_connections(tenant), _member(agent, project))
        if added:
            await self.audit(AuditEntry(time.time(), actor, "connected", tenant, project, agent=agent))
        return bool(added)

    async def disconnect(self, tenant: str, agent: str, project: str, actor: str) -> bool:
        """Remove an operator's connection; ``False`` when there was none (nothing recorded then)."""
        removed = await self.redis.srem(_KEYS.project_connections(tenant), _member(agent, project))
        if removed:
            await self.audit(AuditEntry(time.time(), actor, "disconnected", tenant, project, agent=agent))
        return bool(removed)

    async def audit(self, entry: AuditEntry) -> None:
        """Append ``entry`` to the memory audit stream."""
        fields = {
            "at": repr(entry.at),
            "actor": entry.actor,
            "op": entry.op,
            "tenant": entry.tenant,
            "project": entry.project,
            "fact_id": entry.fact_id,
            "agent": entry.agent,
        }
        await self.redis.xadd(_KEYS.memory_audit, fields, maxlen=AUDIT_CAP, approximate=True)  # type: ignore[arg-type]

    async def audited(self, tenant: str, limit: int = 100) -> list[AuditEntry]:
        """The most recent audit entries of ``tenant``, newest first."""
        found: list[AuditEntry] = []
        entries: Any = await self.redis.xrevrange(_KEYS.memory_audit, count=AUDIT_CAP)
        for _id, raw in entries or []:
            fields = {_text(k): _text(v) for k, v in raw.items()}
            op = fields.get("op", "")
            if fields.get("tenant") != tenant or op not in _OPS:
                continue
            found.append(
                AuditEntry(
                    at=float(fields.get("at", "0")),
                    actor=fields.get("actor", ""),
                    op=cast(AuditOp, op),
                    tenant=tenant,
                    project=fields.get("project", ""),
                    fact_id=fields.get("fact_id", ""),
                    agent=fields.get("agent", ""),
                )
            )
            if len(found) >= limit:
                break
        return found


def _member(agent: str, project: str) -> str:
    return json.dumps([agent, project], separators=(",", ":"))
