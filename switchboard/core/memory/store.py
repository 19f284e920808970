"""Where facts live: the :class:`MemoryStore` protocol, and its embedded SQLite implementation with FTS5.

Each tenant has its own database file (``<root>/<tenant>.sqlite``) and every query also names the tenant, so no path
reads another tenant's facts. A search filters by tenant, project and expiry **before** it ranks: the candidates come
from FTS5, and BM25 is computed here over the facts the caller may see, so facts it may not see change neither what
it gets nor the scores and order of what it gets.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sqlite3
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from switchboard.core.memory.facts import Fact, FactChange, FactKind, Hit, Source, check_name

__all__ = ["MemoryStore", "SQLiteMemoryStore", "terms"]

_WORD = re.compile(r"\w+", re.UNICODE)
_K1 = 1.2
_B = 0.75
_MAX_TERMS = 16

_SCHEMA = """
CREATE TABLE IF NOT EXISTS facts (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    project TEXT NOT NULL,
    text TEXT NOT NULL,
    source TEXT NOT NULL,
    run_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL,
    confidence REAL NOT NULL,
    expires_at REAL,
    length INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS facts_scope ON facts (tenant, project);
CREATE VIRTUAL TABLE IF NOT EXISTS facts_fts USING fts5(text, content='facts', content_rowid='rowid',
    tokenize='unicode61 remove_diacritics 0');
CREATE TABLE IF NOT EXISTS links (
    tenant TEXT NOT NULL,
    src TEXT NOT NULL,
    dst TEXT NOT NULL,
    PRIMARY KEY (tenant, src, dst)
);
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    fact_id TEXT NOT NULL,
    project TEXT NOT NULL,
    op TEXT NOT NULL,
    actor TEXT NOT NULL,
    agent TEXT NOT NULL,
    run_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    at REAL NOT NULL
);
"""


def terms(text: str) -> list[str]:
    """The words of ``text`` as the index holds them (lower case, as FTS5's ``unicode61`` splits them)."""
    return [word.lower() for word in _WORD.findall(text)]


class MemoryStore(Protocol):
    """Facts and documents of every tenant.

    Every method names the tenant, and reads name the projects the caller may see; every read filters by tenant,
    project and expiry **before** it ranks.
    """

    async def add(self, fact: Fact, change: FactChange, embeddings: Sequence[Sequence[float]] | None = None) -> None:
        """Store a new fact and record its change; an id already stored is left as it is (a re-run).

        ``embeddings``: one vector per passage of the fact's text (:func:`~switchboard.core.memory.chunks.passages`),
        in order; ``None`` leaves it out of vector search.
        """
        ...

    async def get(self, tenant: str, fact_id: str, projects: Sequence[str]) -> Fact | None:
        """The fact ``fact_id`` when it is in one of ``projects`` of ``tenant`` (expired or not), else ``None``."""
        ...

    async def search(self, tenant: str, projects: Sequence[str], query: str, limit: int, now: float) -> list[Hit]:
        """Live facts of ``projects`` matching any word of ``query``, best first, BM25 among those alone."""
        ...

    async def nearest(
        self, tenant: str, projects: Sequence[str], embedding: Sequence[float], limit: int, now: float
    ) -> list[Hit]:
        """Live facts of ``projects`` whose passage is nearest ``embedding`` (exact cosine), best first.

        ``Hit.score`` is the cosine similarity of the fact's best passage.
        """
        ...

    async def neighbours(
        self, tenant: str, projects: Sequence[str], fact_ids: Sequence[str], now: float
    ) -> dict[str, list[str]]:
        """For each of ``fact_ids``: the ids it is linked to that are live and in ``projects`` (sorted)."""
        ...

    async def facts(self, tenant: str, projects: Sequence[str]) -> list[Fact]:
        """Every fact of ``projects``, expired ones included, oldest first (for operators)."""
        ...

    async def correct(
        self,
        tenant: str,
        fact_id: str,
        text: str,
        source: Source,
        confidence: float,
        change: FactChange,
        embeddings: Sequence[Sequence[float]] | None = None,
    ) -> None:
        """Replace a fact's text, source and confidence (and its passages' vectors), and record the change."""
        ...

    async def link(self, tenant: str, src: str, dst: str, change: FactChange) -> None:
        """Relate two facts (both ways) and record the change."""
        ...

    async def forget(self, tenant: str, fact_id: str, change: FactChange) -> None:
        """Delete a fact, its text, passages and links, and record the change."""
        ...

    async def changes(self, tenant: str, fact_id: str | None = None) -> list[FactChange]:
        """The recorded changes, oldest first (of one fact when ``fact_id`` is given)."""
        ...

    async def cached_embeddings(self, tenant: str, model: str, digests: Sequence[str]) -> dict[str, list[float]]:
        """The cached vectors of ``model`` among ``digests`` (content hashes), by digest."""
        ...

    async def cache_embeddings(self, tenant: str, model: str, vectors: Mapping[str, Sequence[float]]) -> None:
        """Keep ``vectors`` of ``model`` by digest."""
        ...

    async def erase(self, tenant: str, *, actor: str | None = None) -> int:
        """Remove all of ``tenant``'s memory (``actor`` ``None``), or the facts remembered for ``actor``.

        With them go their passages, links, changes and cached embeddings; the number of facts removed.
        """
        ...

    async def purge(self, tenant: str, before: float, *, kind: FactKind | None = None) -> int:
        """Remove ``tenant``'s facts (of ``kind``, or both kinds) created before ``before``; the number removed."""
        ...

    async def rotate(self, tenant: str) -> int:
        """Re-seal with the current key (and re-index) every row of ``tenant`` sealed otherwise; the facts changed."""
        ...


class SQLiteMemoryStore:
    """The embedded :class:`MemoryStore`: one SQLite file per tenant under ``root``, FTS5 for words."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._connections: dict[str, sqlite3.Connection] = {}

    def path(self, tenant: str) -> Path:
        """The tenant's database file."""
        return self.root / f"{check_name(tenant, 'tenant')}.sqlite"

    def close(self) -> None:
        """Close every open database."""
        with self._lock:
            for connection in self._connections.values():
                connection.close()
            self._connections.clear()

    def _db(self, tenant: str) -> sqlite3.Connection:
        path = self.path(tenant)
        found = self._connections.get(tenant)
        if found is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            found = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            found.execute("PRAGMA journal_mode=WAL")
            found.executescript(_SCHEMA)
            self._connections[tenant] = found
        return found

    async def _run(self, tenant: str, work: Any, *args: Any) -> Any:
        def call() -> Any:
            with self._lock:
                db = self._db(tenant)
                db.execute("BEGIN IMMEDIATE")
                try:
                    result = work(db, *args)
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
                return result

        return await asyncio.to_thread(call)

    # ------------------------------------------------------------------ writes

    async def add(self, fact: Fact, change: FactChange) -> None:
        """Store a new fact and record its change (a fact already stored under its id is kept as it is)."""

        def work(db: sqlite3.Connection) -> None:
            if db.execute("SELECT 1 FROM facts WHERE tenant = ? AND id = ?", (fact.tenant, fact.id)).fetchone():
                return
            cursor = db.execute(
                "INSERT INTO facts (id, tenant, project, text, source, run_id, created_at, updated_at, confidence,"
                " expires_at, length) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    fact.id,
                    fact.tenant,
                    fact.project,
                    fact.text,
                    fact.source.model_dump_json(),
                    fact.run_id,
                    fact.created_at,
                    fact.updated_at,
                    fact.confidence,
                    fact.expires_at,
                    len(terms(fact.text)),
                ),
            )
            db.execute("INSERT INTO facts_fts (rowid, text) VALUES (?, ?)", (cursor.lastrowid, fact.text))
            _record(db, fact.tenant, change)

        await self._run(fact.tenant, work)

    async def correct(
        self, tenant: str, fact_id: str, text: str, source: Source, confidence: float, change: FactChange
    ) -> None:
        """Replace a fact's text, source and confidence, and record the change."""

        def work(db: sqlite3.Connection) -> None:
            row = db.execute("SELECT rowid, text FROM facts WHERE tenant = ? AND id = ?", (tenant, fact_id)).fetchone()
            if row is None:
                raise KeyError(fact_id)
            db.execute("INSERT INTO facts_fts (facts_fts, rowid, text) VALUES ('delete', ?, ?)", (row[0], row[1]))
            db.execute(
                "UPDATE facts SET text = ?, source = ?, confidence = ?, updated_at = ?, length = ?"
                " WHERE tenant = ? AND id = ?",
                (text, source.model_dump_json(), confidence, change.at, len(terms(text)), tenant, fact_id),
            )
            db.execute("INSERT INTO facts_fts (rowid, text) VALUES (?, ?)", (row[0], text))
            _record(db, tenant, change)

        await self._run(tenant, work)

    async def link(self, tenant: str, src: str, dst: str, change: FactChange) -> None:
        """Relate two facts (both ways) and record the change."""

        def work(db: sqlite3.Connection) -> None:
            db.executemany(
                "INSERT OR IGNORE INTO links (tenant, src, dst) VALUES (?, ?, ?)",
                [(tenant, src, dst), (tenant, dst, src)],
            )
            _record(db, tenant, change)

        await self._run(tenant, work)

    async def forget(self, tenant: str, fact_id: str, change: FactChange) -> None:
        """Delete a fact, its text and its links, and record the change."""

        def work(db: sqlite3.Connection) -> None:
            row = db.execute("SELECT rowid, text FROM facts WHERE tenant = ? AND id = ?", (tenant, fact_id)).fetchone()
            if row is None:
                raise KeyError(fact_id)
            db.execute("INSERT INTO facts_fts (facts_fts, rowid, text) VALUES ('delete', ?, ?)", (row[0], row[1]))
            db.execute("DELETE FROM facts WHERE tenant = ? AND id = ?", (tenant, fact_id))
            db.execute("DELETE FROM links WHERE tenant = ? AND (src = ? OR dst = ?)", (tenant, fact_id, fact_id))
            _record(db, tenant, change)

        await self._run(tenant, work)

    # ------------------------------------------------------------------- reads

    async def get(self, tenant: str, fact_id: str, projects: Sequence[str]) -> Fact | None:
        """The fact ``fact_id`` when it is in one of ``projects`` of ``tenant`` (expired or not), else ``None``."""
        if not projects:
            return None

        def work(db: sqlite3.Connection) -> Fact | None:
            marks = ", ".join("?" for _ in projects)
            row = db.execute(
                f"SELECT {_COLUMNS} FROM facts WHERE tenant = ? AND id = ? AND project IN ({marks})",  # noqa: S608
                (tenant, fact_id, *projects),
            ).fetchone()
            return None if row is None else _fact(db, tenant, row, projects)

        found: Fact | None = await self._run(tenant, work)
        return found

    async def facts(self, tenant: str, projects: Sequence[str]) -> list[Fact]:
        """Every fact of ``projects``, expired ones included, oldest first (for operators)."""
        if not projects:
            return []

        def work(db: sqlite3.Connection) -> list[Fact]:
            marks = ", ".join("?" for _ in projects)
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM facts WHERE tenant = ? AND project IN ({marks})"  # noqa: S608
                " ORDER BY created_at, id",
                (tenant, *projects),
            ).fetchall()
            return [_fact(db, tenant, row, projects) for row in rows]

        found: list[Fact] = await self._run(tenant, work)
        return found

    async def search(self, tenant: str, projects: Sequence[str], query: str, limit: int, now: float) -> list[Hit]:
        """Live facts of ``projects`` matching any word of ``query``, best first, ranked among those alone."""
        words = list(dict.fromkeys(terms(query)))[:_MAX_TERMS]
        if not projects or not words or limit < 1:
            return []

        def work(db: sqlite3.Connection) -> list[Hit]:
            marks = ", ".join("?" for _ in projects)
            scope = f"f.tenant = ? AND f.project IN ({marks}) AND (f.expires_at IS NULL OR f.expires_at > ?)"
            bound = (tenant, *projects, now)
            total, average = db.execute(
                f"SELECT count(*), coalesce(avg(f.length), 0) FROM facts f WHERE {scope}",  # noqa: S608
                bound,
            ).fetchone()
            if not total:
                return []
            frequency: dict[str, int] = {}
            for word in words:
                frequency[word] = db.execute(
                    f"SELECT count(*) FROM facts_fts JOIN facts f ON f.rowid = facts_fts.rowid"  # noqa: S608
                    f" WHERE facts_fts MATCH ? AND {scope}",
                    (_phrase(word), *bound),
                ).fetchone()[0]
            rows = db.execute(
                f"SELECT {_COLUMNS_F} FROM facts_fts JOIN facts f ON f.rowid = facts_fts.rowid"  # noqa: S608
                f" WHERE facts_fts MATCH ? AND {scope}",
                (" OR ".join(_phrase(word) for word in words), *bound),
            ).fetchall()
            scored = [
                (_bm25(Counter(terms(row[3])), row[10], words, frequency, total, average or 1.0), row) for row in rows
            ]
            scored.sort(key=lambda pair: (-pair[0], -pair[1][6], pair[1][0]))
            return [Hit(fact=_fact(db, tenant, row, projects), score=round(score, 6)) for score, row in scored[:limit]]

        found: list[Hit] = await self._run(tenant, work)
        return found

    async def changes(self, tenant: str, fact_id: str | None = None) -> list[FactChange]:
        """The recorded changes, oldest first (of one fact when ``fact_id`` is given)."""

        def work(db: sqlite3.Connection) -> list[FactChange]:
            where, args = (
                ("tenant = ?", (tenant,)) if fact_id is None else ("tenant = ? AND fact_id = ?", (tenant, fact_id))
            )
            rows = db.execute(
                f"SELECT fact_id, project, op, actor, agent, run_id, reason, at FROM changes WHERE {where}"  # noqa: S608
                " ORDER BY seq",
                args,
            ).fetchall()
            keys = ("fact_id", "project", "op", "actor", "agent", "run_id", "reason", "at")
            return [FactChange.model_validate(dict(zip(keys, row, strict=True))) for row in rows]

        found: list[FactChange] = await self._run(tenant, work)
        return found


_COLUMNS = "id, tenant, project, text, source, run_id, created_at, updated_at, confidence, expires_at, length"
_COLUMNS_F = ", ".join(f"f.{name.strip()}" for name in _COLUMNS.split(","))


def _phrase(word: str) -> str:
    return '"' + word.replace('"', '""') + '"'


def _bm25(
    counts: Counter[str], length: int, words: Sequence[str], frequency: dict[str, int], total: int, average: float
) -> float:
    score = 0.0
    for word in words:
        tf = counts.get(word, 0)
        if not tf:
            continue
        df = frequency.get(word, 0)
        idf = math.log(1.0 + (total - df + 0.5) / (df + 0.5))
        score += idf * tf * (_K1 + 1) / (tf + _K1 * (1 - _B + _B * length / average))
    return score


def _record(db: sqlite3.Connection, tenant: str, change: FactChange) -> None:
    db.execute(
        "INSERT INTO changes (tenant, fact_id, project, op, actor, agent, run_id, reason, at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            tenant,
            change.fact_id,
            change.project,
            change.op,
            change.actor,
            change.agent,
            change.run_id,
            change.reason,
            change.at,
        ),
    )


def _fact(db: sqlite3.Connection, tenant: str, row: Sequence[Any], projects: Sequence[str]) -> Fact:
    marks = ", ".join("?" for _ in projects)
    links = db.execute(  # only links to facts the caller may see: an id is information too
        "SELECT l.dst FROM links l JOIN facts f ON f.tenant = l.tenant AND f.id = l.dst"  # noqa: S608
        f" WHERE l.tenant = ? AND l.src = ? AND f.project IN ({marks}) ORDER BY l.dst",
        (tenant, row[0], *projects),
    ).fetchall()
    return Fact(
        id=row[0],
        tenant=row[1],
        project=row[2],
        text=row[3],
        source=Source.model_validate(json.loads(row[4])),
        run_id=row[5],
        created_at=row[6],
        updated_at=row[7],
        confidence=row[8],
        expires_at=row[9],
        links=tuple(link for (link,) in links),
    )
