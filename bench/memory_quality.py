"""Retrieval quality of memory search (issue #24): recall@5 of lexical, vector and hybrid search, side by side.

The labelled set ``bench/data/memory_labelled.yaml`` holds the facts a support agent of a small shop would remember
and queries with the ids of the facts that answer them, judged by hand: queries sharing the facts' words, queries
using other forms of them (plural, tense, derivation) and paraphrases (other words for the same thing). The facts
go into the embedded SQLite store through its real API, embedded with the deterministic local embedder; each query
runs in each mode through :func:`switchboard.core.memory.retrieval.retrieve`. recall@5 is the share of a query's
relevant facts among its first five hits, averaged over the queries; MRR is the mean reciprocal rank of the first
relevant hit. Deterministic: the figures are the same on every run and machine.

    python -m bench.memory_quality
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench._harness import SUMMARY_HEADERS, Row, parser, render_table, verdicts
from switchboard.core.memory.chunks import passages_for
from switchboard.core.memory.embeddings import LocalEmbedder
from switchboard.core.memory.facts import Fact, FactChange, Source
from switchboard.core.memory.retrieval import SearchMode, retrieve
from switchboard.core.memory.store import SQLiteMemoryStore

DATA = Path(__file__).resolve().parent / "data" / "memory_labelled.yaml"
MODES: tuple[SearchMode, ...] = ("lexical", "vector", "hybrid")
KINDS = ("words", "forms", "paraphrase")
K = 5
NOW = 1_800_000_000.0


def load(path: Path = DATA) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The labelled set: facts by id, and the queries (``q``, ``kind``, ``relevant``)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    facts = {str(key): str(value) for key, value in data["facts"].items()}
    queries = list(data["queries"])
    for query in queries:
        unknown = [fact_id for fact_id in query["relevant"] if fact_id not in facts]
        if unknown or query["kind"] not in KINDS:
            raise ValueError(f"query {query['q']!r}: unknown fact ids {unknown} or kind {query['kind']!r}")
    return facts, queries


def recall_at(found: list[str], relevant: list[str], k: int = K) -> float:
    """The share of ``relevant`` among the first ``k`` of ``found``."""
    return len(set(found[:k]) & set(relevant)) / len(relevant)


def reciprocal_rank(found: list[str], relevant: list[str]) -> float:
    """``1 / rank`` of the first relevant id in ``found`` (0 when none is)."""
    return next((1.0 / rank for rank, fact_id in enumerate(found, start=1) if fact_id in relevant), 0.0)


async def measure(root: Path) -> dict[tuple[SearchMode, str], tuple[float, float]]:
    """recall@5 and MRR by (mode, query kind), ``"all"`` for every query."""
    facts, queries = load()
    embedder = LocalEmbedder()
    store = SQLiteMemoryStore(root)
    source = Source(kind="message", quote="from the labelled set")
    for fact_id, text in facts.items():
        fact = Fact(id=f"f_{fact_id}", tenant="bench", project="shop", text=text, source=source, run_id="bench")
        change = FactChange(fact_id=fact.id, project="shop", op="remembered", actor="bench")
        await store.add(fact, change, await embedder.embed([p.text for p in passages_for("fact", text)]))
    scores: dict[tuple[SearchMode, str], list[tuple[float, float]]] = {}
    for mode in MODES:
        for query in queries:
            hits = await retrieve(store, embedder, "bench", ["shop"], query["q"], mode=mode, limit=10, now=NOW)
            found = [hit.fact.id.removeprefix("f_") for hit in hits]
            pair = (recall_at(found, query["relevant"]), reciprocal_rank(found, query["relevant"]))
            scores.setdefault((mode, query["kind"]), []).append(pair)
            scores.setdefault((mode, "all"), []).append(pair)
    store.close()
    return {
        key: (sum(r for r, _ in pairs) / len(pairs), sum(m for _, m in pairs) / len(pairs))
        for key, pairs in scores.items()
    }


async def run(argv: list[str]) -> list[Row]:
    """Measure and print the table; the summary rows."""
    ns = parser(__doc__.splitlines()[0] if __doc__ else "").parse_args(argv)
    facts, queries = load()
    with tempfile.TemporaryDirectory(prefix="sb-memory-quality-") as tmp:
        figures = await measure(Path(tmp))
    counts = {kind: sum(1 for q in queries if q["kind"] == kind) for kind in KINDS}
    headers = ["queries", *[f"{mode} recall@{K}" for mode in MODES], *[f"{mode} MRR" for mode in MODES]]
    table = []
    for kind in (*KINDS, "all"):
        label = f"{kind} ({counts[kind] if kind in counts else len(queries)})"
        table.append(
            [
                label,
                *[f"{figures[(mode, kind)][0]:.2f}" for mode in MODES],
                *[f"{figures[(mode, kind)][1]:.2f}" for mode in MODES],
            ]
        )
    print(
        render_table(
            f"Memory retrieval quality: {len(facts)} facts, {len(queries)} queries, local embedder", headers, table
        )
    )
    rows = [
        Row("memory_quality", f"recall@{K}, {mode} (labelled set)", f"{figures[(mode, 'all')][0]:.2f}", "—", None)
        for mode in MODES
    ]
    rows = verdicts(rows, ns.quick)
    print()
    print(render_table("Summary", SUMMARY_HEADERS, [row.cells() for row in rows]))
    return rows


if __name__ == "__main__":
    import asyncio

    asyncio.run(run(sys.argv[1:]))
