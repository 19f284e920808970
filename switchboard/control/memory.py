"""Operators and memory: list projects and their facts, correct and delete facts, connect agents to projects.

One implementation for the console and the CLI (:class:`MemoryControl`). Every call names a tenant and is refused for
a tenant outside the operator's scope before anything is read; a fact is looked up only within the tenant's projects,
so an id of another tenant is unknown. A correction keeps the fact's source (where it came from) and is recorded in
the store's change record with the operator as actor and their reason; a correction and a deletion, and each
connection made or removed, is also an entry of the memory audit stream (:mod:`switchboard.queue.projects`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeAlias, assert_never

from switchboard.control.scope import InvalidRequestError, NotFoundError, OperatorScope, OutOfScopeError, is_text
from switchboard.core.memory.chunks import passages_for
from switchboard.core.memory.embeddings import CachedEmbedder, Embedder, EmbeddingError
from switchboard.core.memory.facts import MAX_DOCUMENT_CHARS, MAX_FACT_CHARS, NAME_PATTERN, Fact, FactChange
from switchboard.core.memory.postgres import PostgresMemoryStore
from switchboard.core.memory.store import MemoryStore, SQLiteMemoryStore
from switchboard.core.sealing import Keyring
from switchboard.errors import ConfigError
from switchboard.queue.projects import AuditEntry, ProjectConnections
from switchboard.settings import Settings

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = [
    "MAX_REASON_CHARS",
    "ChangeView",
    "ConfiguredStore",
    "FactDetail",
    "FactView",
    "MemoryControl",
    "ProjectView",
    "close_store",
    "memory_store",
    "open_store",
]

MAX_REASON_CHARS: Final = 500
"""Longest reason an operator gives for a change (kept with the change)."""
_MIN_REASON_CHARS: Final = 3
_FACT_ID: Final = re.compile(r"^f_[0-9a-f]{1,62}$")


ConfiguredStore: TypeAlias = SQLiteMemoryStore | PostgresMemoryStore
"""The stores ``memory.store`` can name."""


def memory_store(settings: Settings) -> ConfiguredStore:
    """The store ``memory.store`` names: SQLite files under the data directory, or PostgreSQL at ``memory.dsn_env``.

    The worker's, and the one operators read and change. With ``SWITCHBOARD_DATA_KEYS`` set, memory content is
    sealed at rest. Nothing is opened yet: :func:`open_store` checks the server, :func:`close_store` releases it.
    """
    config = settings.file.memory
    keyring = Keyring.from_env()
    if config.store == "sqlite":
        return SQLiteMemoryStore(settings.data_path / "memory", keyring)
    if config.store == "postgres":
        dsn = os.environ.get(config.dsn_env, "").strip()
        if not dsn:
            raise ConfigError(f"memory.dsn_env: {config.dsn_env} is unset or empty", field="memory.dsn_env")
        return PostgresMemoryStore(dsn, keyring=keyring)
    assert_never(config.store)


async def open_store(store: ConfiguredStore) -> None:
    """Connect and create the schema now, so a server without pgvector stops a worker at start-up.

    Raises:
        ConfigError: PostgreSQL lacks pgvector, or this role may not enable it.
    """
    if isinstance(store, SQLiteMemoryStore):
        return  # each tenant's file opens on first use
    elif isinstance(store, PostgresMemoryStore):
        await store.create()
    else:
        assert_never(store)


async def close_store(store: ConfiguredStore) -> None:
    """Close what ``store`` holds open: the SQLite files, or the PostgreSQL pool (on the loop that opened it)."""
    if isinstance(store, SQLiteMemoryStore):
        store.close()
    elif isinstance(store, PostgresMemoryStore):
        await store.close()
    else:
        assert_never(store)


@dataclass(frozen=True, slots=True)
class ProjectView:
    """A project of a tenant, the agents connected to it and how many facts it holds."""

    name: str
    tenant: str
    description: str
    agents: list[str]
    """Connected in the YAML file (``agents.<name>.projects``)."""
    connected: list[str]
    """Connected by operators (console or CLI)."""
    facts: int


@dataclass(frozen=True, slots=True)
class FactView:
    """A fact as operators see it: its text (unless withheld), provenance, confidence, dates and links."""

    id: str
    project: str
    tenant: str
    kind: str
    """``fact`` or ``document``."""
    text: str
    source: dict[str, str]
    run_id: str
    confidence: float
    created_at: float
    updated_at: float | None
    expires_at: float | None
    links: list[str]
    actor: str = ""
    """Who the run that remembered it acted for."""
    redacted: bool = False
    """The operator's scope does not read messages: text and quote withheld."""


@dataclass(frozen=True, slots=True)
class ChangeView:
    """One recorded change of a fact: who, how, why, when."""

    op: str
    actor: str
    agent: str
    run_id: str
    reason: str
    at: float


@dataclass(frozen=True, slots=True)
class FactDetail:
    """A fact and its change history, oldest change first."""

    fact: FactView
    changes: list[ChangeView] = field(default_factory=list)


def _view(fact: Fact, scope: OperatorScope) -> FactView:
    source = {"kind": fact.source.kind, "ref": fact.source.ref, "call_id": fact.source.call_id}
    source["quote"] = fact.source.quote if scope.reads_messages else ""
    return FactView(
        id=fact.id,
        project=fact.project,
        tenant=fact.tenant,
        kind=fact.kind,
        text=fact.text if scope.reads_messages else "",
        source=source,
        run_id=fact.run_id,
        confidence=fact.confidence,
        created_at=fact.created_at,
        updated_at=fact.updated_at,
        expires_at=fact.expires_at,
        links=list(fact.links),
        actor=fact.actor,
        redacted=not scope.reads_messages,
    )


def _change(change: FactChange) -> ChangeView:
    return ChangeView(change.op, change.actor, change.agent, change.run_id, change.reason, change.at)


def _reason(reason: Any) -> str:
    if not isinstance(reason, str) or not is_text(reason):
        raise InvalidRequestError("the reason must be text")
    why: str = reason.strip()
    if not _MIN_REASON_CHARS <= len(why) <= MAX_REASON_CHARS:
        raise InvalidRequestError(f"say why in {_MIN_REASON_CHARS} to {MAX_REASON_CHARS} characters (the reason)")
    return why


class MemoryControl:
    """Operators' reads and changes of memory, scoped per call."""

    def __init__(
        self, settings: Settings, store: MemoryStore, redis: aioredis.Redis, embedder: Embedder | None = None
    ) -> None:
        self.settings = settings
        self.store = store
        self.embedder = embedder
        """How a corrected text is embedded again (the worker's; ``None``: words only)."""
        self.connections = ProjectConnections(redis)

    # -- scope -----------------------------------------------------------------------------------------------------

    def _tenant(self, scope: OperatorScope, tenant: str) -> str:
        if not isinstance(tenant, str) or not NAME_PATTERN.fullmatch(tenant) or ".." in tenant:
            raise InvalidRequestError(f"not a tenant name: {str(tenant)[:64]!r}")
        if not scope.allows(tenant):
            raise OutOfScopeError(f"{scope.operator} may not see tenant {tenant!r}")
        return tenant

    def _projects(self, tenant: str) -> list[str]:
        return sorted(name for name, project in self.settings.file.projects.items() if project.tenant == tenant)

    def _project(self, scope: OperatorScope, name: str) -> str:
        """The tenant of project ``name``, which must be one the operator sees (else it is unknown)."""
        project = self.settings.file.projects.get(name) if isinstance(name, str) else None
        if project is None or not scope.allows(project.tenant):
            raise NotFoundError(f"no project {str(name)[:64]!r}")
        return project.tenant

    async def _fact(self, scope: OperatorScope, tenant: str, fact_id: str) -> Fact:
        tenant = self._tenant(scope, tenant)
        if not isinstance(fact_id, str) or not _FACT_ID.fullmatch(fact_id):
            raise InvalidRequestError(f"not a fact id: {str(fact_id)[:64]!r} (ids look like f_0123abcd)")
        fact = await self.store.get(tenant, fact_id, self._projects(tenant))
        if fact is None:
            raise NotFoundError(f"no fact {fact_id} in tenant {tenant}")
        return fact

    # -- reading ---------------------------------------------------------------------------------------------------

    async def projects(self, scope: OperatorScope, tenant: str | None = None) -> list[ProjectView]:
        """The projects of the operator's tenants (or of one), with their agents and fact counts."""
        if tenant is not None:
            self._tenant(scope, tenant)
        views = []
        connected: dict[str, dict[str, list[str]]] = {}
        for name, project in sorted(self.settings.file.projects.items()):
            if not scope.allows(project.tenant) or (tenant is not None and project.tenant != tenant):
                continue
            if project.tenant not in connected:
                connected[project.tenant] = await self.connections.of(project.tenant)
            views.append(
                ProjectView(
                    name=name,
                    tenant=project.tenant,
                    description=project.description,
                    agents=sorted(a for a, agent in self.settings.file.agents.items() if name in agent.projects),
                    connected=sorted(a for a, names in connected[project.tenant].items() if name in names),
                    facts=len(await self.store.facts(project.tenant, [name])),
                )
            )
        return views

    async def facts(self, scope: OperatorScope, tenant: str, project: str | None = None) -> list[FactView]:
        """The facts of ``tenant`` (of one of its projects), expired ones included, oldest first."""
        tenant = self._tenant(scope, tenant)
        projects = self._projects(tenant)
        if project is not None and project not in projects:
            raise NotFoundError(f"no project {str(project)[:64]!r} in tenant {tenant}")
        found = await self.store.facts(tenant, [project] if project is not None else projects)
        return [_view(fact, scope) for fact in found]

    async def show(self, scope: OperatorScope, tenant: str, fact_id: str) -> FactDetail:
        """One fact and every recorded change of it."""
        fact = await self._fact(scope, tenant, fact_id)
        changes = await self.store.changes(fact.tenant, fact.id)
        return FactDetail(_view(fact, scope), [_change(c) for c in changes])

    async def audit(self, scope: OperatorScope, tenant: str, limit: int = 100) -> list[AuditEntry]:
        """Operators' recent memory changes in ``tenant``, newest first."""
        return await self.connections.audited(self._tenant(scope, tenant), max(1, min(limit, 1000)))

    # -- changing --------------------------------------------------------------------------------------------------

    async def correct(
        self, scope: OperatorScope, tenant: str, fact_id: str, text: Any, reason: Any, confidence: Any = None
    ) -> FactDetail:
        """Replace a fact's text (and, given, its confidence) as the operator, with their reason.

        Raises:
            InvalidRequestError: an empty or too long text, a reason of fewer than 3 or more than 500 characters, a
                confidence outside 0..1, or a malformed id; nothing is changed.
            NotFoundError: no such fact in the tenant's projects.
            OutOfScopeError: the tenant is not the operator's.
        """
        if not isinstance(text, str) or not is_text(text) or not text.strip():
            raise InvalidRequestError("the corrected text must be non-empty text")
        text = text.strip()
        if len(text) > MAX_DOCUMENT_CHARS:
            raise InvalidRequestError(f"a document has at most {MAX_DOCUMENT_CHARS} characters (this one {len(text)})")
        why = _reason(reason)
        if confidence is not None and (
            isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0.0 <= confidence <= 1.0
        ):
            raise InvalidRequestError("confidence must be a number from 0 to 1")
        fact = await self._fact(scope, tenant, fact_id)
        if fact.kind == "fact" and len(text) > MAX_FACT_CHARS:
            raise InvalidRequestError(f"a fact has at most {MAX_FACT_CHARS} characters (this one {len(text)})")
        change = FactChange(fact_id=fact.id, project=fact.project, op="corrected", actor=scope.operator, reason=why)
        kept = fact.confidence if confidence is None else float(confidence)
        vectors = None
        if self.embedder is not None:
            embedder = CachedEmbedder(self.embedder, self.store, fact.tenant)
            try:
                vectors = await embedder.embed([piece.text for piece in passages_for(fact.kind, text)])
            except EmbeddingError as err:
                raise InvalidRequestError(f"the corrected text could not be embedded ({err}); try again") from None
        try:
            await self.store.correct(fact.tenant, fact.id, text, fact.source, kept, change, vectors)
        except KeyError:
            raise NotFoundError(f"no fact {fact.id} in tenant {fact.tenant}") from None
        await self.connections.audit(
            AuditEntry(change.at, scope.operator, "corrected", fact.tenant, fact.project, fact_id=fact.id)
        )
        return await self.show(scope, fact.tenant, fact.id)

    async def forget(self, scope: OperatorScope, tenant: str, fact_id: str, reason: Any) -> ChangeView:
        """Delete a fact (its text and links) as the operator, with their reason; the change record stays.

        Raises:
            InvalidRequestError: a missing or malformed reason or id; nothing is deleted.
            NotFoundError: no such fact in the tenant's projects.
            OutOfScopeError: the tenant is not the operator's.
        """
        why = _reason(reason)
        fact = await self._fact(scope, tenant, fact_id)
        change = FactChange(fact_id=fact.id, project=fact.project, op="forgotten", actor=scope.operator, reason=why)
        try:
            await self.store.forget(fact.tenant, fact.id, change)
        except KeyError:
            raise NotFoundError(f"no fact {fact.id} in tenant {fact.tenant}") from None
        await self.connections.audit(
            AuditEntry(change.at, scope.operator, "forgotten", fact.tenant, fact.project, fact_id=fact.id)
        )
        return _change(change)

    async def _project_view(self, scope: OperatorScope, tenant: str, *, name: str) -> ProjectView:
        return next(view for view in await self.projects(scope, tenant) if view.name == name)

    def _agent(self, agent: Any) -> str:
        if not isinstance(agent, str) or agent not in self.settings.file.agents:
            raise NotFoundError(f"no agent {str(agent)[:64]!r}")
        return agent

    async def connect(self, scope: OperatorScope, agent: Any, project: Any) -> ProjectView:
        """Connect ``agent`` to ``project`` (of a tenant of the operator); its next turns may use it.

        Raises:
            InvalidRequestError: the YAML file already connects them, or the operator already did.
            NotFoundError: no such agent, or no such project among the operator's tenants.
        """
        tenant = self._project(scope, project)
        name = self._agent(agent)
        if project in self.settings.file.agents[name].projects:
            raise InvalidRequestError(f"the YAML file already connects {name} to {project}")
        if not await self.connections.connect(tenant, name, project, scope.operator):
            raise InvalidRequestError(f"{name} is already connected to {project}")
        return await self._project_view(scope, tenant, name=project)

    async def disconnect(self, scope: OperatorScope, agent: Any, project: Any) -> ProjectView:
        """Remove an operator's connection of ``agent`` to ``project``.

        Raises:
            InvalidRequestError: the connection is the YAML file's (change it there).
            NotFoundError: no such agent or project, or no such connection.
        """
        tenant = self._project(scope, project)
        name = self._agent(agent)
        if project in self.settings.file.agents[name].projects:
            raise InvalidRequestError(f"the YAML file connects {name} to {project}: change it there")
        if not await self.connections.disconnect(tenant, name, project, scope.operator):
            raise NotFoundError(f"{name} is not connected to {project}")
        return await self._project_view(scope, tenant, name=project)
