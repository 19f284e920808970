"""Retrieval over a tenant's projects: lexical, vector, hybrid (relative-score fusion) and graph search.

Every mode asks the store only for rows the caller may see (the store filters by tenant, project and expiry before it
ranks), so fusion and graph expansion work on authorised candidates alone: rows of other tenants or unconnected
projects change neither what is returned nor its order.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Literal, assert_never

from switchboard.core.memory.embeddings import Embedder
from switchboard.core.memory.facts import Hit
from switchboard.core.memory.store import MemoryStore

__all__ = ["GRAPH_DECAY", "GRAPH_DEPTH", "SEARCH_MODES", "VECTOR_WEIGHT", "SearchMode", "fuse", "retrieve"]

logger = logging.getLogger(__name__)

SearchMode = Literal["lexical", "vector", "hybrid", "graph"]
SEARCH_MODES: tuple[SearchMode, ...] = ("lexical", "vector", "hybrid", "graph")

VECTOR_WEIGHT = 0.5
"""The share of the vector list in a hybrid score (the lexical list has the rest): equal weights, not tuned."""

GRAPH_DEPTH = 2
"""Links followed from a seed in a graph search."""

GRAPH_DECAY = 0.5
"""A fact reached over a link scores this share of the fact it was reached from."""

_CANDIDATES = 4
"""Each list of a hybrid search brings this many times the asked number of candidates (at least 20)."""


def _scaled(hits: Sequence[Hit]) -> dict[str, float]:
    """Each hit's score scaled to 0..1 within its list (min-max; all equal: 1)."""
    if not hits:
        return {}
    high, low = max(hit.score for hit in hits), min(hit.score for hit in hits)
    return {hit.fact.id: 1.0 if high == low else (hit.score - low) / (high - low) for hit in hits}


def fuse(lexical: Sequence[Hit], nearest: Sequence[Hit], limit: int, weight: float = VECTOR_WEIGHT) -> list[Hit]:
    """Relative-score fusion of a lexical and a vector list, best first, ties by id.

    Each list's scores are scaled to 0..1 (min-max within the list), and a hit scores ``(1 - weight)`` times its
    lexical and ``weight`` times its vector share (0 from a list that did not find it). Unlike rank fusion, a weak
    lexical match (one common word) adds little, so it does not lift a fact over a close vector match. A hit keeps
    the first passage it was given.
    """
    words, meaning = _scaled(lexical), _scaled(nearest)
    first: dict[str, Hit] = {}
    for hit in (*lexical, *nearest):
        key = hit.fact.id
        if key not in first or (not first[key].passage and hit.passage):
            first[key] = hit
    scores = {key: (1 - weight) * words.get(key, 0.0) + weight * meaning.get(key, 0.0) for key in first}
    ranked = sorted(scores, key=lambda key: (-scores[key], key))[:limit]
    return [first[key].model_copy(update={"score": round(scores[key], 6)}) for key in ranked]


async def _hybrid(
    store: MemoryStore,
    embedder: Embedder,
    tenant: str,
    projects: Sequence[str],
    query: str,
    limit: int,
    now: float,
) -> list[Hit]:
    wanted = max(limit * _CANDIDATES, 20)
    (vector,) = await embedder.embed([query])
    lexical = await store.search(tenant, projects, query, wanted, now)
    nearest = await store.nearest(tenant, projects, vector, wanted, now)
    return fuse(lexical, nearest, limit)


async def _graph(
    store: MemoryStore,
    embedder: Embedder,
    tenant: str,
    projects: Sequence[str],
    query: str,
    limit: int,
    now: float,
) -> list[Hit]:
    seeds = await _hybrid(store, embedder, tenant, projects, query, max(1, math.ceil(limit / 2)), now)
    found: dict[str, Hit] = {hit.fact.id: hit for hit in seeds}
    frontier = list(seeds)
    for _ in range(GRAPH_DEPTH):
        if not frontier:
            break
        linked = await store.neighbours(tenant, projects, [hit.fact.id for hit in frontier], now)
        reached: dict[str, tuple[float, str]] = {}
        for hit in frontier:
            score = hit.score * GRAPH_DECAY
            for other in linked.get(hit.fact.id, []):
                if other in found:
                    continue
                if (
                    other not in reached
                    or score > reached[other][0]
                    or (score == reached[other][0] and hit.fact.id < reached[other][1])
                ):
                    reached[other] = (score, hit.fact.id)
        frontier = []
        for other in sorted(reached):
            fact = await store.get(tenant, other, projects)
            if fact is None or not fact.live(now):
                continue
            score, via = reached[other]
            hit = Hit(fact=fact, score=round(score, 6), via=via)
            found[other] = hit
            frontier.append(hit)
    return sorted(found.values(), key=lambda hit: (-hit.score, hit.fact.id))[:limit]


async def retrieve(
    store: MemoryStore,
    embedder: Embedder | None,
    tenant: str,
    projects: Sequence[str],
    query: str,
    *,
    mode: SearchMode,
    limit: int,
    now: float,
) -> list[Hit]:
    """The live facts of ``projects`` best matching ``query`` by ``mode``, best first.

    ``lexical``: BM25 over words; ``vector``: cosine similarity of embeddings; ``hybrid``: both lists fused by score;
    ``graph``: hybrid seeds, then facts linked to them (up to :data:`GRAPH_DEPTH` links away, ``Hit.via`` naming the
    fact each was reached from). Every mode but ``lexical`` needs ``embedder`` (:class:`ValueError` without one).
    """
    if limit < 1 or not projects:
        return []
    if mode == "lexical":
        return await store.search(tenant, projects, query, limit, now)
    if embedder is None:
        raise ValueError(f"{mode} search needs embeddings, and none are configured (memory.embeddings)")
    if mode == "vector":
        (vector,) = await embedder.embed([query])
        return await store.nearest(tenant, projects, vector, limit, now)
    if mode == "hybrid":
        return await _hybrid(store, embedder, tenant, projects, query, limit, now)
    if mode == "graph":
        return await _graph(store, embedder, tenant, projects, query, limit, now)
    assert_never(mode)
