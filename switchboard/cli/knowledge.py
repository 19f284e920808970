"""Knowledge indexing wired to the process: URLs through egress, the worker's start, and ``switchboard knowledge``.

Core never opens a connection: :func:`url_fetcher` hands the indexer a fetch that goes through the egress forwarder
under the agent's own allowlist (each redirect hop checked again), recorded like any tool's request.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from switchboard.control.memory import ConfiguredStore, close_store
from switchboard.core.agent.config import Agent
from switchboard.core.knowledge.extraction import Fetched, UrlFetcher
from switchboard.core.knowledge.index import IndexReport, KnowledgeIndexer, Models
from switchboard.core.memory.config import build_embedder
from switchboard.core.memory.embeddings import Embedder
from switchboard.core.memory.store import MemoryStore
from switchboard.core.model import ModelAdapter
from switchboard.core.tools.builtin.documents import DocumentLimits
from switchboard.errors import ConfigError
from switchboard.settings import Settings

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from switchboard.core.providers import ProviderConfig
    from switchboard.egress.forward import Forwarder

__all__ = [
    "RECHECK_S",
    "WithRedis",
    "index_all",
    "keep_knowledge_indexed",
    "knowledge_agents",
    "knowledge_command",
    "knowledge_indexer",
    "knowledge_problems",
    "report_lines",
    "url_fetcher",
]

logger = logging.getLogger(__name__)

_REDIRECTS = 5

WithRedis = Callable[[Callable[["aioredis.Redis"], Awaitable[int]]], int]
"""Runs an async body with a Redis client and returns its exit code (``switchboard.cli.sessions.with_redis``)."""
RECHECK_S = 300.0
"""How often a worker re-reads the sources to find changed ones (a changed hash is re-indexed)."""


def url_fetcher(forwarder: Forwarder) -> UrlFetcher:
    """A GET through ``forwarder`` for one agent (its grant revoked when the fetch returns)."""
    from switchboard.egress.client import EgressClient

    async def fetch(tenant: str, agent: str, url: str) -> Fetched:
        policy = forwarder.policy
        grant = policy.grant(agent, f"{tenant}/knowledge/{agent}")
        try:
            got = await EgressClient(forwarder, grant, max_redirects=_REDIRECTS).request("GET", url)
        finally:
            policy.revoke(grant)
        return Fetched(
            status=got.status, content_type=got.header("content-type") or "", body=got.body, refused=got.refused
        )

    return fetch


def knowledge_agents(settings: Settings, only: str | None = None) -> dict[str, Agent]:
    """The agents with ``knowledge:`` (``only``: that one; :class:`ConfigError` when it has none or is unknown)."""
    agents = settings.file.agents
    if only is not None:
        agent = agents.get(only)
        if agent is None:
            raise ConfigError(f"no agent {only!r} (agents: {', '.join(sorted(agents)) or 'none'})", field="agents")
        if agent.knowledge is None:
            raise ConfigError(f"agent {only!r} has no knowledge: add `knowledge:` to it in the YAML file", field=only)
        return {only: agent}
    return {name: agent for name, agent in agents.items() if agent.knowledge is not None}


def knowledge_problems(settings: Settings, agent: Agent) -> list[str]:
    """What keeps an agent's knowledge sources from being indexed, for ``agents validate``: paths and URL hosts."""
    from yarl import URL

    from switchboard.core.knowledge.extraction import locate
    from switchboard.egress.policy import EgressPolicy

    if agent.knowledge is None:
        return []
    _, unreadable = locate(agent.knowledge, settings.config.resolve().parent)
    found = [f"agent {agent.name!r}: knowledge source {err}" for err in unreadable]
    rules = EgressPolicy.from_settings(settings).rules(agent.name)
    for source in agent.knowledge.sources:
        host = (URL(source.url).host or "").lower() if source.url is not None else ""
        if host and not rules.allows(host):
            found.append(
                f"agent {agent.name!r}: knowledge source {source.url} is on {host}, which is not in its egress "
                f"allowlist: add it to agents.{agent.name}.egress.allow"
            )
    return found


def knowledge_indexer(
    settings: Settings,
    store: MemoryStore,
    models: Models,
    forwarder: Forwarder | None,
    embedder: Embedder | None = None,
) -> KnowledgeIndexer:
    """The indexer of this configuration: paths relative to the YAML file's folder, documents under its limits."""
    docs = settings.documents
    return KnowledgeIndexer(
        store,
        models,
        settings.config.resolve().parent,
        fetch=url_fetcher(forwarder) if forwarder is not None else None,
        limits=DocumentLimits(docs.max_bytes, docs.memory_mb, docs.timeout_s, docs.max_output_chars),
        embedder=embedder,
    )


async def index_all(settings: Settings, indexer: KnowledgeIndexer, agents: Mapping[str, Agent]) -> list[IndexReport]:
    """Index every agent of ``agents`` (one after the other); a failing source is in its report, never raised."""
    reports: list[IndexReport] = []
    for name, agent in agents.items():
        assert agent.knowledge is not None
        reports.append(await indexer.index(name, agent.knowledge, agent.model or settings.default_model))
    return reports


async def keep_knowledge_indexed(
    settings: Settings,
    store: MemoryStore,
    models: Models,
    forwarder: Forwarder | None,
    stop: asyncio.Event,
    every_s: float = RECHECK_S,
) -> None:
    """Index every agent's knowledge when the worker starts, then re-check it every ``every_s`` until ``stop``."""
    indexer = knowledge_indexer(settings, store, models, forwarder, build_embedder(settings.file.memory.embeddings))
    while not stop.is_set():
        try:  # the agents as the file says now: one added or changed while the worker runs is indexed too
            for report in await index_all(settings, indexer, knowledge_agents(settings)):
                for failed in report.failed():
                    logger.warning("knowledge of agent %s: %s", report.agent, failed.error)
        except Exception:  # an indexing bug must not take the worker down; the next round tries again
            logger.exception("knowledge indexing failed")
        try:
            await asyncio.wait_for(stop.wait(), timeout=every_s)
        except TimeoutError:
            continue


def report_lines(report: IndexReport) -> list[str]:
    """One line per source of an indexing run, then the totals."""
    lines = [f"agent {report.agent} (tenant {report.tenant}, project {report.project}):"]
    for source in report.sources:
        detail = f": {source.error}" if source.error else ""
        lines.append(f"  {source.state:9} {source.id or '-':18} {source.ref}{detail}")
    counts = ", ".join(f"{n} {state}" for state, n in sorted(report.counts().items())) or "no sources"
    lines.append(f"  {counts}")
    return lines


def knowledge_command(
    settings: Settings,
    action: str,
    agent: str | None,
    providers: ProviderConfig,
    store: ConfiguredStore,
    with_redis: WithRedis,
) -> int:
    """``switchboard knowledge index|list [--agent A]``; returns the exit code (1: some source failed).

    ``providers``: the model providers' credentials, for the summaries of new or changed sources; ``store``: the
    memory store (``memory.store``), closed here (on the loop that used it); ``with_redis``: runs a body with a
    Redis client (egress records each URL fetch there), only when some source is a URL.
    """
    try:
        agents = knowledge_agents(settings, agent)
    except ConfigError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 2
    if not agents:
        print("no agent has knowledge: add `knowledge:` to an agent in the YAML file")
        return 0

    async def closing(body: Awaitable[int]) -> int:
        try:
            return await body
        finally:
            await close_store(store)

    if action == "list":
        return asyncio.run(closing(_list(settings, store, agents)))
    needs_egress = any(s.url is not None for a in agents.values() if a.knowledge for s in a.knowledge.sources)
    if not needs_egress:
        return asyncio.run(closing(_index(settings, providers, store, agents, None)))
    return with_redis(lambda redis: closing(_index(settings, providers, store, agents, redis)))


async def _index(
    settings: Settings,
    providers: ProviderConfig,
    store: MemoryStore,
    agents: Mapping[str, Agent],
    redis: aioredis.Redis | None,
) -> int:
    from switchboard.core.providers import ModelFactory

    forwarder = None
    if redis is not None:
        from switchboard.egress.events import RedisEgressSink
        from switchboard.egress.forward import Forwarder
        from switchboard.egress.policy import EgressPolicy

        forwarder = Forwarder(
            EgressPolicy.from_settings(settings),
            settings.egress,
            RedisEgressSink(redis, maxlen=settings.queue.events_maxlen),
        )
    models = ModelFactory(providers)
    try:
        embedder = build_embedder(settings.file.memory.embeddings)
        reports = await index_all(settings, knowledge_indexer(settings, store, models, forwarder, embedder), agents)
    finally:
        await models.aclose()
        if forwarder is not None:
            await forwarder.close()
    for report in reports:
        print("\n".join(report_lines(report)))
    return 1 if any(report.failed() for report in reports) else 0


async def _list(settings: Settings, store: MemoryStore, agents: Mapping[str, Agent]) -> int:
    indexer = knowledge_indexer(settings, store, _NoModels(), None)
    for name, agent in agents.items():
        assert agent.knowledge is not None
        docs = {doc.ref: doc for doc in await indexer.documents(agent.knowledge.tenant, name)}
        deep = ", deep" if agent.knowledge.deep else ""
        print(f"agent {name} (tenant {agent.knowledge.tenant}{deep}): {len(docs)} source(s) indexed")
        for ref, doc in docs.items():
            when = datetime.fromtimestamp(doc.fact.updated_at or doc.fact.created_at, UTC).isoformat(timespec="seconds")
            print(f"  {doc.fact.id}  {ref}  {len(doc.body)} chars  indexed {when}")
            print(f"    summary:  {doc.summary.splitlines()[0] if doc.summary else '-'}")
            print(f"    keywords: {', '.join(doc.keywords) or '-'}")
        for source in agent.knowledge.sources:
            folder = source.ref.rstrip("/") + "/"
            if not any(ref == source.ref or ref.startswith(folder) for ref in docs):
                print(f"  not indexed  {source.ref}  (run `switchboard knowledge index --agent {name}`)")
    return 0


class _NoModels:
    """Listing writes no summary."""

    def get(self, spec: str) -> ModelAdapter:
        raise ConfigError("listing knowledge needs no model", field="model")
