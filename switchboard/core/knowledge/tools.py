"""``search_knowledge`` and ``read_source``: an agent's knowledge, read-only, at run time.

Agents with ``knowledge:`` get both. Each call sees only its own agent's project ``knowledge.<agent>``, and only from
turns of the knowledge's tenant: anything else is answered as no knowledge, before any ranking. Search is lexical by
default, hybrid (words and vectors) when an embedder is configured, and for deep agents it also follows links between
sources that share keywords. Results are outside text (``output_trust="data"``): source ids, titles (the path or
URL), summaries, keywords and the best passage, capped; ``read_source`` reads a source's text by range, saying its
total length and where the next range starts. Logs name ids, never content.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from switchboard.core.agent.config import Agent
from switchboard.core.knowledge.config import KNOWLEDGE_TOOLS, knowledge_project
from switchboard.core.knowledge.index import KnowledgeDocument, parse_document
from switchboard.core.memory.chunks import passages
from switchboard.core.memory.embeddings import CachedEmbedder, Embedder, EmbeddingError, LocalEmbedder
from switchboard.core.memory.facts import Hit
from switchboard.core.memory.retrieval import SearchMode, retrieve
from switchboard.core.memory.store import MemoryStore, terms
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.errors import ToolError

__all__ = [
    "KNOWLEDGE_TOOLS",
    "MAX_PASSAGE_CHARS",
    "MAX_READ_CHARS",
    "MAX_RESULTS",
    "ReadSourceInput",
    "SearchKnowledgeInput",
    "knowledge_tools",
]

logger = logging.getLogger(__name__)

MAX_RESULTS = 10
MAX_PASSAGE_CHARS = 600
"""Longest passage shown per search result."""
MAX_READ_CHARS = 8000
"""Longest range one ``read_source`` returns."""
_GRAPH_DEPTH = 2
_MAX_SEARCH_BYTES = MAX_RESULTS * (4 * (MAX_PASSAGE_CHARS + 400 + 2000) + 800) + 400
_MAX_READ_BYTES = 4 * MAX_READ_CHARS + 3000

AgentsView = Callable[[], Mapping[str, Agent]]
"""The configured agents, as they are now."""


class SearchKnowledgeInput(BaseModel):
    """Arguments of ``search_knowledge``."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=300, description="Words to look for in your knowledge sources.")
    limit: int = Field(5, ge=1, le=MAX_RESULTS, description="Most sources returned.")


class ReadSourceInput(BaseModel):
    """Arguments of ``read_source``."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=3, max_length=64, pattern=r"^f_[0-9a-f]+$", description="A source id from search.")
    offset: int = Field(0, ge=0, description="Character offset to start at (0: the beginning).")
    length: int = Field(4000, ge=1, le=MAX_READ_CHARS, description="Characters to read.")


def _best_passage(doc: KnowledgeDocument, query: str, found: str) -> str:
    """The passage the store matched, else the passage of the text holding most of the query's words."""
    text = found
    if not text:
        wanted = set(terms(query))
        best, score = "", -1
        for passage in passages(doc.body):
            hits = sum(1 for word in terms(passage.text) if word in wanted)
            if hits > score:
                best, score = passage.text, hits
        text = best
    return text if len(text) <= MAX_PASSAGE_CHARS else text[: MAX_PASSAGE_CHARS - 1] + "…"


def _date(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


def knowledge_tools(
    store: MemoryStore,
    agents: AgentsView,
    embedder: Embedder | None = None,
    clock: Callable[[], float] = time.time,
) -> list[Tool]:
    """The two knowledge tools over ``store``; each call is limited to its agent's knowledge in its tenant."""

    def scope(ctx: ToolContext) -> tuple[str, bool]:
        agent = agents().get(ctx.agent)
        if agent is None or agent.knowledge is None or agent.knowledge.tenant != ctx.tenant:
            raise ToolError("this agent has no knowledge sources", error_class="validation")
        return knowledge_project(agent.name), agent.knowledge.deep

    async def graph(ctx: ToolContext, project: str, seeds: Sequence[Hit], limit: int) -> list[Hit]:
        """Seeds, then the sources linked to them (depth 2), each reached once, under the seeds' scores."""
        out = list(seeds)
        seen = {hit.fact.id for hit in seeds}
        frontier = list(seeds)
        for _ in range(_GRAPH_DEPTH):
            following: list[Hit] = []
            for hit in frontier:
                for linked in hit.fact.links:
                    if linked in seen or len(out) + len(following) >= limit:
                        continue
                    fact = await store.get(ctx.tenant, linked, [project])
                    if fact is None or not fact.live(clock()):
                        continue
                    seen.add(linked)
                    following.append(Hit(fact=fact, score=round(hit.score / 2, 6), via=hit.fact.id))
            out.extend(following)
            frontier = following
        return out[:limit]

    async def search(args: SearchKnowledgeInput, ctx: ToolContext) -> dict[str, Any]:
        project, deep = scope(ctx)
        mode: SearchMode
        if embedder is None:  # words only: a deep agent's graph grows from the lexical seeds
            mode = "graph" if deep else "lexical"
            hits = await store.search(ctx.tenant, [project], args.query, args.limit, clock())
            if deep:
                hits = await graph(ctx, project, hits, args.limit)
        else:
            mode = "graph" if deep else "hybrid"
            vectors = embedder if isinstance(embedder, LocalEmbedder) else CachedEmbedder(embedder, store, ctx.tenant)
            try:
                hits = await retrieve(
                    store, vectors, ctx.tenant, [project], args.query, mode=mode, limit=args.limit, now=clock()
                )
            except EmbeddingError as error:
                raise ToolError(f"{error}; try again later", error_class="transient") from None
        results: list[dict[str, Any]] = []
        for hit in hits:
            doc = parse_document(hit.fact)
            if doc is None:
                continue
            shown: dict[str, Any] = {
                "id": hit.fact.id,
                "title": doc.ref,
                "kind": hit.fact.source.kind,
                "summary": doc.summary,
                "keywords": list(doc.keywords),
                "passage": _best_passage(doc, args.query, hit.passage),
                "indexed_at": _date(hit.fact.updated_at or hit.fact.created_at),
                "length": len(doc.body),
            }
            if hit.via:
                shown["linked_from"] = hit.via
            results.append(shown)
        logger.info("search_knowledge by agent %s: %s", ctx.agent, [r["id"] for r in results])
        return {"query": args.query, "mode": mode, "count": len(results), "sources": results}

    async def read(args: ReadSourceInput, ctx: ToolContext) -> dict[str, Any]:
        project, _ = scope(ctx)
        fact = await store.get(ctx.tenant, args.id, [project])
        doc = parse_document(fact) if fact is not None else None
        if doc is None:
            raise ToolError(f"no source {args.id!r} in your knowledge", error_class="validation")
        total = len(doc.body)
        if args.offset >= total and total:
            raise ToolError(
                f"offset {args.offset} is past the end: the source has {total} characters", error_class="validation"
            )
        end = min(total, args.offset + args.length)
        logger.info("read_source by agent %s: %s [%d:%d]", ctx.agent, args.id, args.offset, end)
        return {
            "id": args.id,
            "title": doc.ref,
            "total_chars": total,
            "offset": args.offset,
            "text": doc.body[args.offset : end],
            "next_offset": end if end < total else None,
        }

    return [
        Tool(
            name="search_knowledge",
            description="Search your knowledge sources (files and pages indexed for you) by words; gives each "
            "source's id, title, summary, keywords and best matching passage. Read more with read_source.",
            input=SearchKnowledgeInput,
            fn=search,
            output_trust="data",
            max_inline_bytes=_MAX_SEARCH_BYTES,
            connector="knowledge",
        ),
        Tool(
            name="read_source",
            description="Read a knowledge source by id, a range of characters at a time; says its total length "
            "and the offset to read next.",
            input=ReadSourceInput,
            fn=read,
            output_trust="data",
            max_inline_bytes=_MAX_READ_BYTES,
            connector="knowledge",
        ),
    ]
