"""The knowledge index: each source one document in the memory store, re-indexed when its content changes.

An agent's sources live in the read-only project ``knowledge.<agent>`` of its knowledge tenant, in the same store as
remembered facts (so erasure, retention, sealing and the search modes cover them too). Each document's text is a
short header — the source, its summary, its keywords and the hash of its content — then a blank line and the source's
text. Keeping the index in the document itself (rather than a table beside the store) means there is nothing a store
could lose, erase or leave behind separately; the header is searchable, so a summary's or a keyword's words find the
source. A run re-reads every source and hashes it: an unchanged hash skips extraction and the model, a changed one
replaces the document, a source no longer configured (or gone from its folder) is dropped. Keywords are TF-IDF over
all the agent's sources, so they are recomputed each run and rewritten where they moved. A deep agent's sources that
share a keyword are linked, so the graph search expands from one to the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from switchboard.core.knowledge.config import KnowledgeConfig, knowledge_project
from switchboard.core.knowledge.extraction import Located, UrlFetcher, extract, load, locate
from switchboard.core.knowledge.keywords import keywords
from switchboard.core.knowledge.summaries import summarise
from switchboard.core.memory.chunks import passages
from switchboard.core.memory.embeddings import CachedEmbedder, Embedder, EmbeddingError, LocalEmbedder
from switchboard.core.memory.facts import Fact, FactChange, Source
from switchboard.core.memory.store import MemoryStore
from switchboard.core.model import ModelAdapter
from switchboard.core.tools.builtin.documents import DocumentLimits
from switchboard.errors import SourceUnreadableError

__all__ = [
    "INDEXER",
    "IndexReport",
    "KnowledgeDocument",
    "KnowledgeIndexer",
    "Models",
    "SourceReport",
    "SourceState",
    "document_id",
    "parse_document",
]

logger = logging.getLogger(__name__)

INDEXER = "knowledge-indexer"
"""The actor and run id recorded with every change the indexer makes."""
_QUOTE_CHARS = 200
_PARALLEL = 4

SourceState = Literal["added", "changed", "unchanged", "removed", "failed"]


class Models(Protocol):
    """Where the indexer gets the agent's model (the worker's :class:`~switchboard.core.providers.ModelFactory`)."""

    def get(self, spec: str) -> ModelAdapter:
        """The adapter for ``provider:name``."""
        ...


def document_id(tenant: str, agent: str, ref: str) -> str:
    """The stable id of the document of source ``ref`` (the same source keeps its id across re-indexing)."""
    return "f_" + hashlib.sha256(f"knowledge\n{tenant}\n{agent}\n{ref}".encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class KnowledgeDocument:
    """A stored source: the header's fields and the text after it (``offset``: where that text starts)."""

    fact: Fact
    ref: str
    summary: str
    keywords: tuple[str, ...]
    digest: str
    body: str
    offset: int


_FIELDS = ("Source", "Summary", "Keywords", "Digest")


def _render(ref: str, summary: str, words: Sequence[str], digest: str, body: str) -> str:
    values = (ref, summary, ", ".join(words), digest)
    header = "\n".join(f"{name}: {' '.join(value.split())}" for name, value in zip(_FIELDS, values, strict=True))
    return f"{header}\n\n{body}"


def parse_document(fact: Fact) -> KnowledgeDocument | None:
    """The header and text of a knowledge document (``None`` for a text that is not one)."""
    header, sep, body = fact.text.partition("\n\n")
    found: dict[str, str] = {}
    for line in header.splitlines():
        name, colon, value = line.partition(": ")
        if colon and name in _FIELDS:
            found[name] = value
    if not sep or set(found) != set(_FIELDS):
        return None
    return KnowledgeDocument(
        fact=fact,
        ref=found["Source"],
        summary=found["Summary"],
        keywords=tuple(word for word in found["Keywords"].split(", ") if word),
        digest=found["Digest"],
        body=body,
        offset=len(header) + len(sep),
    )


@dataclass(frozen=True, slots=True)
class SourceReport:
    """What one run did with one source (``error``: why it failed, for operators; the last index, if any, kept)."""

    ref: str
    state: SourceState
    id: str = ""
    error: str = ""


@dataclass(slots=True)
class IndexReport:
    """One agent's indexing run."""

    agent: str
    tenant: str
    project: str
    sources: list[SourceReport] = field(default_factory=list)

    def failed(self) -> list[SourceReport]:
        """The sources that could not be read."""
        return [s for s in self.sources if s.state == "failed"]

    def counts(self) -> dict[str, int]:
        """Sources by state."""
        out: dict[str, int] = {}
        for source in self.sources:
            out[source.state] = out.get(source.state, 0) + 1
        return out


@dataclass(slots=True)
class _Entry:
    located: Located
    digest: str
    body: str
    summary: str
    old: KnowledgeDocument | None


class KnowledgeIndexer:
    """Indexes agents' knowledge sources into ``store`` (files under ``root``, URLs through ``fetch``)."""

    def __init__(
        self,
        store: MemoryStore,
        models: Models,
        root: Path,
        *,
        fetch: UrlFetcher | None = None,
        limits: DocumentLimits | None = None,
        embedder: Embedder | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Index into ``store``, summarising with ``models``; ``root``: the folder source paths are relative to.

        ``fetch``: the way to URLs (``None``: URL sources fail, saying so); ``embedder``: passages also get vectors
        (hybrid search); ``limits``: how large a source may be and how it is parsed.
        """
        self.store = store
        self.models = models
        self.root = root
        self.fetch = fetch
        self.limits = limits or DocumentLimits()
        self.embedder = embedder
        self.clock = clock

    async def documents(self, tenant: str, agent: str) -> list[KnowledgeDocument]:
        """The agent's indexed sources, in the order they were indexed."""
        facts = await self.store.facts(tenant, [knowledge_project(agent)])
        return [doc for fact in facts if (doc := parse_document(fact)) is not None]

    async def index(self, agent: str, config: KnowledgeConfig, model: str) -> IndexReport:
        """Bring ``agent``'s index in step with its sources; ``model`` (``provider:name``) writes new summaries.

        A source that cannot be read is reported and keeps its last index (if it had one); the others go on.
        """
        tenant, project = config.tenant, knowledge_project(agent)
        report = IndexReport(agent=agent, tenant=tenant, project=project)
        old = {doc.ref: doc for doc in await self.documents(tenant, agent)}
        located, problems = locate(config, self.root)
        report.sources.extend(SourceReport(ref=p.ref, state="failed", error=str(p)) for p in problems)
        gate = asyncio.Semaphore(_PARALLEL)

        async def read(item: Located) -> _Entry | SourceReport:
            async with gate:
                try:
                    return await self._read(tenant, agent, item, old.get(item.ref), model)
                except SourceUnreadableError as err:
                    return SourceReport(
                        ref=item.ref, state="failed", id=document_id(tenant, agent, item.ref), error=str(err)
                    )

        results = await asyncio.gather(*(read(item) for item in located))
        entries = [r for r in results if isinstance(r, _Entry)]
        failures = [r for r in results if isinstance(r, SourceReport)]
        report.sources.extend(failures)
        kept = {entry.located.ref for entry in entries} | {f.ref for f in failures if f.ref in old}
        words = keywords(
            {e.located.ref: e.body for e in entries} | {f.ref: old[f.ref].body for f in failures if f.ref in old}
        )
        for entry in entries:
            try:
                written = await self._write(tenant, agent, entry, tuple(words[entry.located.ref]))
            except EmbeddingError as err:  # the embeddings provider failed: this source waits for the next run
                written = SourceReport(
                    ref=entry.located.ref,
                    state="failed",
                    id=document_id(tenant, agent, entry.located.ref),
                    error=f"{entry.located.ref}: its embeddings could not be computed ({err})",
                )
            report.sources.append(written)
        for ref, doc in old.items():
            if ref not in kept:
                await self._forget(tenant, agent, doc.fact.id, f"source removed: {ref}")
                report.sources.append(SourceReport(ref=ref, state="removed", id=doc.fact.id))
        if config.deep:
            await self._link(tenant, agent)
        counts = report.counts()
        logger.info(
            "knowledge of agent %s indexed: %s", agent, ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        )
        return report

    async def _read(self, tenant: str, agent: str, item: Located, old: KnowledgeDocument | None, model: str) -> _Entry:
        raw = await load(item, tenant, agent, self.fetch, self.limits)
        if old is not None and old.digest == raw.digest:
            return _Entry(item, raw.digest, old.body, old.summary, old)
        text = await extract(raw, self.limits)
        from switchboard.core.providers import model_name  # the providers package loads its SDK adapters lazily

        summary = await summarise(self.models.get(model), model_name(model), item.ref, text)
        return _Entry(item, raw.digest, text, summary, old)

    def _change(
        self,
        fact_id: str,
        project: str,
        op: Literal["remembered", "corrected", "forgotten", "linked"],
        agent: str,
        reason: str,
    ) -> FactChange:
        return FactChange(
            fact_id=fact_id,
            project=project,
            op=op,
            actor=INDEXER,
            agent=agent,
            run_id=INDEXER,
            reason=reason[:500],
            at=self.clock(),
        )

    async def _write(self, tenant: str, agent: str, entry: _Entry, words: tuple[str, ...]) -> SourceReport:
        ref, old, project = entry.located.ref, entry.old, knowledge_project(agent)
        fact_id = document_id(tenant, agent, ref)
        if old is not None and old.digest == entry.digest and old.keywords == words:
            return SourceReport(ref=ref, state="unchanged", id=fact_id)
        text = _render(ref, entry.summary, words, entry.digest, entry.body)
        source = Source(kind=entry.located.kind, ref=ref[:2000], quote=_quote(entry.body))
        vectors = await self._embeddings(tenant, text)
        if old is not None and old.digest == entry.digest:  # only the keywords moved: same document, new header
            change = self._change(fact_id, project, "corrected", agent, f"keywords of {ref} recomputed")
            try:
                if vectors is None:
                    await self.store.correct(tenant, fact_id, text, source, 1.0, change)
                else:
                    await self.store.correct(tenant, fact_id, text, source, 1.0, change, embeddings=vectors)
                return SourceReport(ref=ref, state="unchanged", id=fact_id)
            except KeyError:  # another worker replaced or dropped it meanwhile: store it afresh below
                pass
        if old is not None:  # new content: a new document under the same id (its old links go with the old one)
            await self._forget(tenant, agent, fact_id, f"{ref} changed")
        fact = Fact(
            id=fact_id,
            project=project,
            tenant=tenant,
            text=text,
            kind="document",
            source=source,
            run_id=INDEXER,
            created_at=self.clock(),
            actor=INDEXER,
        )
        change = self._change(fact_id, project, "remembered", agent, f"indexed {ref}")
        if vectors is None:
            await self.store.add(fact, change)
        else:
            await self.store.add(fact, change, embeddings=vectors)
        return SourceReport(ref=ref, state="added" if old is None else "changed", id=fact_id)

    async def _forget(self, tenant: str, agent: str, fact_id: str, reason: str) -> None:
        """Drop a document; one already gone (another worker's run got there first) is no error."""
        change = self._change(fact_id, knowledge_project(agent), "forgotten", agent, reason)
        with contextlib.suppress(KeyError):
            await self.store.forget(tenant, fact_id, change)

    async def _embeddings(self, tenant: str, text: str) -> list[list[float]] | None:
        if self.embedder is None:
            return None
        embedder = self.embedder
        if not isinstance(embedder, LocalEmbedder):  # a provider's vectors are cached by content hash
            embedder = CachedEmbedder(embedder, self.store, tenant)
        return await embedder.embed([p.text for p in passages(text)])

    async def _link(self, tenant: str, agent: str) -> None:
        """Link every two sources that share a keyword (links already there are kept)."""
        docs = await self.documents(tenant, agent)
        project = knowledge_project(agent)
        for i, doc in enumerate(docs):
            for other in docs[i + 1 :]:
                if other.fact.id in doc.fact.links or not set(doc.keywords) & set(other.keywords):
                    continue
                shared = sorted(set(doc.keywords) & set(other.keywords))
                change = self._change(
                    doc.fact.id, project, "linked", agent, f"to {other.fact.id}: shared keywords {', '.join(shared)}"
                )
                await self.store.link(tenant, doc.fact.id, other.fact.id, change)


def _quote(body: str) -> str:
    words = " ".join(body.split())
    quote = words[:_QUOTE_CHARS].rsplit(" ", 1)[0] if len(words) > _QUOTE_CHARS else words
    return quote if len(quote) >= 3 else words[:_QUOTE_CHARS]
