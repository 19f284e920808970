"""Where facts live: the :class:`MemoryStore` protocol, and its embedded SQLite implementation.

Each tenant has its own database file (``<root>/<tenant>.sqlite``, opened with ``sqlean`` and the ``sqlite-vec``
extension) and every query also names the tenant, so no path reads another tenant's facts. A fact's text is indexed as
passages (a fact is one passage, a document several): words in FTS5, a vector per passage. Every read filters by
tenant, project and expiry in SQL **before** it ranks: BM25 is computed here over the passages the caller may see, and
cosine distance only over those, so rows the caller may not see change neither what it gets nor the scores and order
of what it gets.

With a :class:`~switchboard.core.sealing.Keyring`, texts, sources and change reasons are stored sealed (context
``memory:<tenant>``) and FTS5 holds blind terms instead of words; a query looks for the blind terms under every listed
key (and the plain word, for rows written before sealing was on) until :meth:`SQLiteMemoryStore.rotate` re-seals.
Deleted rows are overwritten (``secure_delete``), and erasing a tenant removes its files.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import sqlean
import sqlite_vec

from switchboard.core.memory.chunks import passages_for
from switchboard.core.memory.embeddings import digest
from switchboard.core.memory.facts import Fact, FactChange, FactKind, Hit, Source, check_name
from switchboard.core.sealing import (
    DATA_KEYS_ENV,
    SEALED_PREFIX,
    Keyring,
    SealError,
    escape_plain,
    is_sealed,
    unescape_plain,
)

__all__ = ["MemoryStore", "SQLiteMemoryStore", "memory_context", "terms"]

_WORD = re.compile(r"\w+", re.UNICODE)
_BUSY_TIMEOUT_S = 60.0
"""How long a statement waits for another process's lock on the tenant's file (a write, a checkpoint after a
forget, a migration at open) before "database is locked": workers sharing a tenant wait their turn, even on a
loaded machine, rather than fail the tool call."""

_K1 = 1.2
_B = 0.75
_MAX_TERMS = 16
_BATCH = 500
"""Most values bound in one ``IN (...)``."""

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
    length INTEGER NOT NULL,
    kind TEXT NOT NULL DEFAULT 'fact',
    actor TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS facts_scope ON facts (tenant, project);
CREATE TABLE IF NOT EXISTS passages (
    id INTEGER PRIMARY KEY,
    fact INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    start INTEGER NOT NULL,
    text TEXT NOT NULL,
    length INTEGER NOT NULL,
    dims INTEGER,
    embedding BLOB
);
CREATE INDEX IF NOT EXISTS passages_fact ON passages (fact, idx);
CREATE VIRTUAL TABLE IF NOT EXISTS passages_fts USING fts5(terms, content='', contentless_delete=1,
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
CREATE TABLE IF NOT EXISTS embedding_cache (
    tenant TEXT NOT NULL,
    model TEXT NOT NULL,
    digest TEXT NOT NULL,
    vector BLOB NOT NULL,
    PRIMARY KEY (tenant, model, digest)
);
"""
_VERSION = 2


def terms(text: str) -> list[str]:
    """The words of ``text`` as the index holds them (lower case, as FTS5's ``unicode61`` splits them)."""
    return [word.lower() for word in _WORD.findall(text)]


def memory_context(tenant: str) -> str:
    """The sealing context of ``tenant``'s memory: a value sealed for one tenant does not open for another."""
    return f"memory:{tenant}"


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
        """Delete a fact, its text, passages, links and cached vectors, and record the change."""
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
        """Remove the facts (of ``kind``, or both) created before ``before``, with their cached vectors; how many."""
        ...

    async def rotate(self, tenant: str) -> int:
        """Re-seal with the current key (and re-index) every row of ``tenant`` sealed otherwise; the facts changed."""
        ...


class SQLiteMemoryStore:
    """The embedded :class:`MemoryStore`: one SQLite file per tenant under ``root``, FTS5 and ``sqlite-vec``."""

    def __init__(self, root: Path, keyring: Keyring | None = None) -> None:
        self.root = root
        self.keyring = keyring
        self._lock = threading.Lock()
        """Guards the two maps below only; a tenant's database is used under its own lock, so one tenant's long
        search never holds up another's calls."""
        self._connections: dict[str, sqlean.Connection] = {}
        self._files: dict[str, int | None] = {}
        """The inode each open connection's file had: another process erasing the tenant unlinks it."""
        self._locks: dict[str, threading.Lock] = {}
        self._keys_checked: set[str] = set()
        """Tenants whose sealed passages the keyring was seen to open."""

    def path(self, tenant: str) -> Path:
        """The tenant's database file."""
        return self.root / f"{check_name(tenant, 'tenant')}.sqlite"

    def tenants(self) -> list[str]:
        """The tenants that have a database file, sorted (what a rotation or a retention sweep goes through)."""
        if not self.root.is_dir():
            return []
        return sorted(path.stem for path in self.root.glob("*.sqlite") if path.is_file())

    def close(self) -> None:
        """Close every open database."""
        with self._lock:
            tenants = list(self._connections)
        for tenant in tenants:
            with self._held(tenant):
                self._close(tenant)

    def _held(self, tenant: str) -> threading.Lock:
        """The lock of ``tenant``'s database (its connection is used by one thread at a time)."""
        with self._lock:
            return self._locks.setdefault(tenant, threading.Lock())

    def _close(self, tenant: str) -> None:
        """Close ``tenant``'s connection; the caller holds the tenant's lock."""
        with self._lock:
            connection = self._connections.pop(tenant, None)
            self._files.pop(tenant, None)
        if connection is not None:
            connection.close()

    def _db(self, tenant: str) -> sqlean.Connection:
        """``tenant``'s connection, opened (and migrated) on first use; the caller holds the tenant's lock.

        A connection whose file was removed or replaced since it was opened (the tenant was erased by another
        process) is reopened, so it neither reads the erased file nor writes where no one else looks.
        """
        path = self.path(tenant)
        with self._lock:
            found = self._connections.get(tenant)
            inode = self._files.get(tenant)
        if found is not None and _inode(path) != inode:
            self._close(tenant)
            found = None
        if found is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            found = sqlean.connect(str(path), check_same_thread=False, isolation_level=None, timeout=_BUSY_TIMEOUT_S)
            found.enable_load_extension(True)
            sqlite_vec.load(found)
            found.enable_load_extension(False)
            found.execute("PRAGMA journal_mode=WAL")
            found.execute("PRAGMA secure_delete=ON")  # a deleted or erased text is overwritten, not left in free pages
            _migrate(found)
            with self._lock:
                self._connections[tenant] = found
                self._files[tenant] = _inode(path)
        return found

    async def _run(self, tenant: str, work: Any, *args: Any, write: bool = True) -> Any:
        """``work(db, *args)`` in one transaction of ``tenant``'s database, in a thread.

        A read (``write`` false) takes no write lock, so a long search never locks out another worker's writes.
        """

        def call() -> Any:
            with self._held(tenant):
                db = self._db(tenant)
                db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = work(db, *args)
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
                return result

        return await asyncio.to_thread(call)

    # ----------------------------------------------------------------- sealing

    def _seal(self, tenant: str, text: str) -> str:
        text = escape_plain(text)
        return text if self.keyring is None else self.keyring.seal(text, memory_context(tenant))

    def _open(self, tenant: str, value: str) -> str:
        if self.keyring is None:
            if is_sealed(value):
                raise SealError(f"memory is sealed at rest: set {DATA_KEYS_ENV} to read it")
            return unescape_plain(value)
        return unescape_plain(self.keyring.open(value, memory_context(tenant)))

    def _check_keys(self, db: sqlean.Connection, tenant: str, scope: str, bound: tuple[Any, ...]) -> None:
        """Raise :class:`SealError` when the keyring cannot open the sealed passages in ``scope``.

        A word search looks for blind terms, so without the right key it would silently find only plain rows.
        """
        if tenant in self._keys_checked:
            return
        row = db.execute(
            "SELECT p.text FROM passages p JOIN facts f ON f.rowid = p.fact"  # noqa: S608
            f" WHERE {scope} AND p.text >= ? AND p.text < ? LIMIT 1",
            (*bound, SEALED_PREFIX, SEALED_PREFIX[:-1] + chr(ord(SEALED_PREFIX[-1]) + 1)),
        ).fetchone()
        if row is None:
            return
        if self.keyring is None:
            raise SealError(f"memory is sealed at rest: set {DATA_KEYS_ENV} to search it")
        try:
            self.keyring.open(row[0], memory_context(tenant))
        except SealError as error:
            raise SealError(f"the keys of {DATA_KEYS_ENV} do not open this memory: {error}") from None
        self._keys_checked.add(tenant)

    def _index_terms(self, tenant: str, text: str) -> str:
        words = terms(text)
        if self.keyring is None:
            return " ".join(words)
        context = memory_context(tenant)
        return " ".join(self.keyring.blind(word, context) for word in words)

    def _match(self, tenant: str, word: str) -> str:
        """The FTS5 expression finding ``word``: the word itself and, when sealing, its blind terms under every key."""
        forms = [word]
        if self.keyring is not None:
            forms += self.keyring.blind_all(word, memory_context(tenant))
        return " OR ".join(_phrase(form) for form in forms)

    # ------------------------------------------------------------------ writes

    def _insert_passages(
        self,
        db: sqlean.Connection,
        tenant: str,
        rowid: int,
        kind: FactKind,
        text: str,
        embeddings: Sequence[Sequence[float]] | None,
    ) -> None:
        pieces = passages_for(kind, text)
        if embeddings is not None and len(embeddings) != len(pieces):
            raise ValueError(f"{len(embeddings)} embeddings for {len(pieces)} passages")
        for number, piece in enumerate(pieces):
            vector = None if embeddings is None else embeddings[number]
            blob = None if vector is None or not any(vector) else sqlite_vec.serialize_float32(list(vector))
            cursor = db.execute(
                "INSERT INTO passages (fact, idx, start, text, length, dims, embedding) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    rowid,
                    piece.index,
                    piece.start,
                    self._seal(tenant, piece.text),
                    len(terms(piece.text)),
                    None if blob is None or vector is None else len(vector),
                    blob,
                ),
            )
            db.execute(
                "INSERT INTO passages_fts (rowid, terms) VALUES (?, ?)",
                (cursor.lastrowid, self._index_terms(tenant, piece.text)),
            )

    async def add(self, fact: Fact, change: FactChange, embeddings: Sequence[Sequence[float]] | None = None) -> None:
        """Store a new fact with its passages and record its change (an id already stored is kept as it is)."""

        def work(db: sqlean.Connection) -> None:
            if db.execute("SELECT 1 FROM facts WHERE tenant = ? AND id = ?", (fact.tenant, fact.id)).fetchone():
                return
            cursor = db.execute(
                "INSERT INTO facts (id, tenant, project, text, source, run_id, created_at, updated_at, confidence,"
                " expires_at, length, kind, actor) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    fact.id,
                    fact.tenant,
                    fact.project,
                    self._seal(fact.tenant, fact.text),
                    self._seal(fact.tenant, fact.source.model_dump_json()),
                    fact.run_id,
                    fact.created_at,
                    fact.updated_at,
                    fact.confidence,
                    fact.expires_at,
                    len(terms(fact.text)),
                    fact.kind,
                    fact.actor,
                ),
            )
            assert cursor.lastrowid is not None
            self._insert_passages(db, fact.tenant, cursor.lastrowid, fact.kind, fact.text, embeddings)
            self._record(db, fact.tenant, change)

        await self._run(fact.tenant, work)

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
        """Replace a fact's text, source and confidence (re-indexing its passages), and record the change."""

        def work(db: sqlean.Connection) -> None:
            row = db.execute("SELECT rowid, kind FROM facts WHERE tenant = ? AND id = ?", (tenant, fact_id)).fetchone()
            if row is None:
                raise KeyError(fact_id)
            Fact.model_validate(  # the corrected text must fit the fact's kind
                {
                    "id": fact_id,
                    "project": "p",
                    "tenant": tenant,
                    "text": text,
                    "kind": row[1],
                    "source": source,
                    "run_id": "",
                }
            )
            self._uncache(db, tenant, [row[0]], frozenset(piece.text for piece in passages_for(row[1], text)))
            _drop_passages(db, [row[0]])
            db.execute(
                "UPDATE facts SET text = ?, source = ?, confidence = ?, updated_at = ?, length = ?"
                " WHERE tenant = ? AND id = ?",
                (
                    self._seal(tenant, text),
                    self._seal(tenant, source.model_dump_json()),
                    confidence,
                    change.at,
                    len(terms(text)),
                    tenant,
                    fact_id,
                ),
            )
            self._insert_passages(db, tenant, row[0], row[1], text, embeddings)
            self._record(db, tenant, change)

        await self._run(tenant, work)

    async def link(self, tenant: str, src: str, dst: str, change: FactChange) -> None:
        """Relate two facts (both ways) and record the change."""

        def work(db: sqlean.Connection) -> None:
            db.executemany(
                "INSERT OR IGNORE INTO links (tenant, src, dst) VALUES (?, ?, ?)",
                [(tenant, src, dst), (tenant, dst, src)],
            )
            self._record(db, tenant, change)

        await self._run(tenant, work)

    async def forget(self, tenant: str, fact_id: str, change: FactChange) -> None:
        """Delete a fact, its text, passages, links and cached vectors, and record the change."""

        def work(db: sqlean.Connection) -> None:
            row = db.execute("SELECT rowid FROM facts WHERE tenant = ? AND id = ?", (tenant, fact_id)).fetchone()
            if row is None:
                raise KeyError(fact_id)
            self._uncache(db, tenant, [row[0]])
            _delete_facts(db, tenant, [(row[0], fact_id)])
            self._record(db, tenant, change)

        await self._run(tenant, work)
        await self._checkpoint(tenant)

    def _uncache(
        self, db: sqlean.Connection, tenant: str, rowids: Sequence[int], keep: frozenset[str] = frozenset()
    ) -> None:
        """Drop the cached vectors of the passages of facts ``rowids`` (about to be deleted or replaced).

        A cache row is keyed by the hash of its text: left behind, it would confirm a guess of a removed text.
        ``keep``: passage texts that stay (a corrected document's unchanged passages).
        """
        models = [
            model for (model,) in db.execute("SELECT DISTINCT model FROM embedding_cache WHERE tenant = ?", (tenant,))
        ]
        if not models:
            return
        for rowid in rowids:
            for (text,) in db.execute("SELECT text FROM passages WHERE fact = ?", (rowid,)).fetchall():
                try:
                    plain = self._open(tenant, text)
                except SealError:  # keys gone: which vectors are its own is unknown, so the whole cache goes
                    db.execute("DELETE FROM embedding_cache WHERE tenant = ?", (tenant,))
                    return
                if plain in keep:
                    continue
                db.executemany(
                    "DELETE FROM embedding_cache WHERE tenant = ? AND model = ? AND digest = ?",
                    [(tenant, model, digest(model, plain)) for model in models],
                )

    def _record(self, db: sqlean.Connection, tenant: str, change: FactChange) -> None:
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
                self._seal(tenant, change.reason) if change.reason else "",
                change.at,
            ),
        )

    # ------------------------------------------------------------------- reads

    def _fact(self, db: sqlean.Connection, tenant: str, row: Sequence[Any], projects: Sequence[str]) -> Fact:
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
            text=self._open(tenant, row[3]),
            source=Source.model_validate(json.loads(self._open(tenant, row[4]))),
            run_id=row[5],
            created_at=row[6],
            updated_at=row[7],
            confidence=row[8],
            expires_at=row[9],
            kind=row[11],
            actor=row[12],
            links=tuple(link for (link,) in links),
        )

    async def get(self, tenant: str, fact_id: str, projects: Sequence[str]) -> Fact | None:
        """The fact ``fact_id`` when it is in one of ``projects`` of ``tenant`` (expired or not), else ``None``."""
        if not projects:
            return None

        def work(db: sqlean.Connection) -> Fact | None:
            marks = ", ".join("?" for _ in projects)
            row = db.execute(
                f"SELECT {_COLUMNS} FROM facts WHERE tenant = ? AND id = ? AND project IN ({marks})",  # noqa: S608
                (tenant, fact_id, *projects),
            ).fetchone()
            return None if row is None else self._fact(db, tenant, row, projects)

        found: Fact | None = await self._run(tenant, work, write=False)
        return found

    async def facts(self, tenant: str, projects: Sequence[str]) -> list[Fact]:
        """Every fact of ``projects``, expired ones included, oldest first (for operators)."""
        if not projects:
            return []

        def work(db: sqlean.Connection) -> list[Fact]:
            marks = ", ".join("?" for _ in projects)
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM facts WHERE tenant = ? AND project IN ({marks})"  # noqa: S608
                " ORDER BY created_at, id",
                (tenant, *projects),
            ).fetchall()
            return [self._fact(db, tenant, row, projects) for row in rows]

        found: list[Fact] = await self._run(tenant, work, write=False)
        return found

    async def search(self, tenant: str, projects: Sequence[str], query: str, limit: int, now: float) -> list[Hit]:
        """Live facts of ``projects`` matching any word of ``query``, best first, BM25 among those alone.

        Passages are scored; a fact scores as its best passage, which a document's hit shows.
        """
        words = list(dict.fromkeys(terms(query)))[:_MAX_TERMS]
        if not projects or not words or limit < 1:
            return []

        def work(db: sqlean.Connection) -> list[Hit]:
            scope, bound = _scope(tenant, projects, now)
            self._check_keys(db, tenant, scope, bound)
            total, average = db.execute(
                f"SELECT count(*), coalesce(avg(p.length), 0) FROM passages p JOIN facts f ON f.rowid = p.fact"  # noqa: S608
                f" WHERE {scope}",
                bound,
            ).fetchone()
            if not total:
                return []
            frequency: dict[str, int] = {}
            for word in words:
                frequency[word] = db.execute(
                    "SELECT count(*) FROM passages_fts JOIN passages p ON p.id = passages_fts.rowid"  # noqa: S608
                    f" JOIN facts f ON f.rowid = p.fact WHERE passages_fts MATCH ? AND {scope}",
                    (self._match(tenant, word), *bound),
                ).fetchone()[0]
            rows = db.execute(
                "SELECT f.rowid, f.id, f.created_at, f.kind, p.text, p.length FROM passages_fts"  # noqa: S608
                " JOIN passages p ON p.id = passages_fts.rowid JOIN facts f ON f.rowid = p.fact"
                f" WHERE passages_fts MATCH ? AND {scope}",
                (" OR ".join(f"({self._match(tenant, word)})" for word in words), *bound),
            ).fetchall()
            best: dict[int, tuple[float, str, Sequence[Any]]] = {}
            for row in rows:
                text = self._open(tenant, row[4])
                score = _bm25(Counter(terms(text)), row[5], words, frequency, total, average or 1.0)
                if row[0] not in best or score > best[row[0]][0]:
                    best[row[0]] = (score, text, row)
            ranked = sorted(best.values(), key=lambda entry: (-entry[0], -entry[2][2], entry[2][1]))[:limit]
            return [
                Hit(
                    fact=self._fact_by_rowid(db, tenant, row[0], projects),
                    score=round(score, 6),
                    passage=text if row[3] == "document" else "",
                )
                for score, text, row in ranked
            ]

        found: list[Hit] = await self._run(tenant, work, write=False)
        return found

    def _fact_by_rowid(self, db: sqlean.Connection, tenant: str, rowid: int, projects: Sequence[str]) -> Fact:
        row = db.execute(f"SELECT {_COLUMNS} FROM facts WHERE rowid = ?", (rowid,)).fetchone()  # noqa: S608
        return self._fact(db, tenant, row, projects)

    async def nearest(
        self, tenant: str, projects: Sequence[str], embedding: Sequence[float], limit: int, now: float
    ) -> list[Hit]:
        """Live facts of ``projects`` whose passage is nearest ``embedding`` (exact cosine), best first.

        Only passages of the caller's scope are measured; ``Hit.score`` is the similarity of the best one.
        """
        if not projects or limit < 1 or not embedding or not any(embedding):
            return []
        blob = sqlite_vec.serialize_float32(list(embedding))

        def work(db: sqlean.Connection) -> list[Hit]:
            scope, bound = _scope(tenant, projects, now)
            rows = db.execute(
                "SELECT f.rowid, f.kind, p.text, min(vec_distance_cosine(p.embedding, ?)) AS distance"  # noqa: S608
                " FROM passages p JOIN facts f ON f.rowid = p.fact"
                f" WHERE {scope} AND p.dims = ? AND p.embedding IS NOT NULL"
                " GROUP BY f.rowid HAVING distance IS NOT NULL ORDER BY distance, f.id LIMIT ?",
                (blob, *bound, len(embedding), limit),
            ).fetchall()
            return [
                Hit(
                    fact=self._fact_by_rowid(db, tenant, row[0], projects),
                    score=round(1.0 - row[3], 6),
                    passage=self._open(tenant, row[2]) if row[1] == "document" else "",
                )
                for row in rows
            ]

        found: list[Hit] = await self._run(tenant, work, write=False)
        return found

    async def neighbours(
        self, tenant: str, projects: Sequence[str], fact_ids: Sequence[str], now: float
    ) -> dict[str, list[str]]:
        """For each of ``fact_ids``: the ids it is linked to that are live and in ``projects`` (sorted)."""
        out: dict[str, list[str]] = {fact_id: [] for fact_id in fact_ids}
        if not projects or not fact_ids:
            return out

        def work(db: sqlean.Connection) -> dict[str, list[str]]:
            scope, bound = _scope(tenant, projects, now)
            source_scope, source_bound = _scope(tenant, projects, now, alias="s")
            ids = list(out)
            for at in range(0, len(ids), _BATCH):
                batch = ids[at : at + _BATCH]
                marks = ", ".join("?" for _ in batch)
                rows = db.execute(
                    "SELECT l.src, l.dst FROM links l JOIN facts s ON s.tenant = l.tenant AND s.id = l.src"  # noqa: S608
                    " JOIN facts f ON f.tenant = l.tenant AND f.id = l.dst"
                    f" WHERE l.tenant = ? AND l.src IN ({marks}) AND {source_scope} AND {scope} ORDER BY l.src, l.dst",
                    (tenant, *batch, *source_bound, *bound),
                ).fetchall()
                for src, dst in rows:
                    out[src].append(dst)
            return out

        found: dict[str, list[str]] = await self._run(tenant, work, write=False)
        return found

    async def changes(self, tenant: str, fact_id: str | None = None) -> list[FactChange]:
        """The recorded changes, oldest first (of one fact when ``fact_id`` is given)."""

        def work(db: sqlean.Connection) -> list[FactChange]:
            where, args = (
                ("tenant = ?", (tenant,)) if fact_id is None else ("tenant = ? AND fact_id = ?", (tenant, fact_id))
            )
            rows = db.execute(
                f"SELECT fact_id, project, op, actor, agent, run_id, reason, at FROM changes WHERE {where}"  # noqa: S608
                " ORDER BY seq",
                args,
            ).fetchall()
            keys = ("fact_id", "project", "op", "actor", "agent", "run_id", "reason", "at")
            return [
                FactChange.model_validate(dict(zip(keys, (*row[:6], self._open(tenant, row[6]), row[7]), strict=True)))
                for row in rows
            ]

        found: list[FactChange] = await self._run(tenant, work, write=False)
        return found

    # ------------------------------------------------------------------- cache

    async def cached_embeddings(self, tenant: str, model: str, digests: Sequence[str]) -> dict[str, list[float]]:
        """The cached vectors of ``model`` among ``digests`` (content hashes), by digest."""
        if not digests:
            return {}

        def work(db: sqlean.Connection) -> dict[str, list[float]]:
            out: dict[str, list[float]] = {}
            keys = list(dict.fromkeys(digests))
            for at in range(0, len(keys), _BATCH):
                batch = keys[at : at + _BATCH]
                marks = ", ".join("?" for _ in batch)
                for key, blob in db.execute(
                    "SELECT digest, vector FROM embedding_cache"  # noqa: S608
                    f" WHERE tenant = ? AND model = ? AND digest IN ({marks})",
                    (tenant, model, *batch),
                ):
                    out[key] = _floats(blob)
            return out

        found: dict[str, list[float]] = await self._run(tenant, work, write=False)
        return found

    async def cache_embeddings(self, tenant: str, model: str, vectors: Mapping[str, Sequence[float]]) -> None:
        """Keep ``vectors`` of ``model`` by digest."""
        if not vectors:
            return

        def work(db: sqlean.Connection) -> None:
            db.executemany(
                "INSERT OR REPLACE INTO embedding_cache (tenant, model, digest, vector) VALUES (?, ?, ?, ?)",
                [(tenant, model, key, sqlite_vec.serialize_float32(list(vector))) for key, vector in vectors.items()],
            )

        await self._run(tenant, work)

    # --------------------------------------------------- erasure and retention

    async def erase(self, tenant: str, *, actor: str | None = None) -> int:
        """Remove all of ``tenant``'s memory (its files), or the facts remembered for ``actor`` and their traces.

        For an actor, their facts go with passages, links, changes, the changes the actor made, and the cached
        embeddings of their texts; the number of facts removed.
        """
        path = self.path(tenant)
        if actor is None:

            def wipe(db: sqlean.Connection) -> tuple[int, bool]:
                """Delete the tenant's rows (a worker with the file open then reads none, even before it reopens).

                Returns how many facts went, and whether rows of another tenant remain: names differing only in case
                share a file on a case-insensitive file system, which then keeps it.
                """
                rows = db.execute("SELECT rowid, id FROM facts WHERE tenant = ?", (tenant,)).fetchall()
                _delete_facts(db, tenant, [(rowid, fact_id) for rowid, fact_id in rows])
                for table in ("links", "changes", "embedding_cache"):
                    db.execute(f"DELETE FROM {table} WHERE tenant = ?", (tenant,))  # noqa: S608 - a fixed name
                others = any(
                    db.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone()  # noqa: S608 - a fixed name
                    for table in ("facts", "links", "changes", "embedding_cache")
                )
                return len(rows), others

            if not path.exists():
                return 0
            wiped: tuple[int, bool] = await self._run(tenant, wipe)
            removed, shared = wiped
            await self._checkpoint(tenant)
            if shared:
                return removed

            def drop() -> None:
                with self._held(tenant):
                    self._close(tenant)
                    for suffix in ("", "-wal", "-shm", "-journal"):
                        path.with_name(path.name + suffix).unlink(missing_ok=True)

            await asyncio.to_thread(drop)
            return removed

        def work(db: sqlean.Connection) -> int:
            rows = db.execute("SELECT rowid, id FROM facts WHERE tenant = ? AND actor = ?", (tenant, actor)).fetchall()
            self._uncache(db, tenant, [rowid for rowid, _ in rows])
            _delete_facts(db, tenant, [(rowid, fact_id) for rowid, fact_id in rows])
            for at in range(0, len(rows), _BATCH):
                batch = [fact_id for _, fact_id in rows[at : at + _BATCH]]
                marks = ", ".join("?" for _ in batch)
                db.execute(
                    f"DELETE FROM changes WHERE tenant = ? AND fact_id IN ({marks})",  # noqa: S608
                    (tenant, *batch),
                )
            db.execute("DELETE FROM changes WHERE tenant = ? AND actor = ?", (tenant, actor))
            return len(rows)

        if not path.exists():
            return 0
        erased: int = await self._run(tenant, work)
        await self._checkpoint(tenant)
        return erased

    async def purge(self, tenant: str, before: float, *, kind: FactKind | None = None) -> int:
        """Remove the facts (of ``kind``, or both) created before ``before``, with their cached vectors; how many."""
        if not self.path(tenant).exists():
            return 0

        def work(db: sqlean.Connection) -> int:
            where = "tenant = ? AND created_at < ?" + ("" if kind is None else " AND kind = ?")
            args = (tenant, before) if kind is None else (tenant, before, kind)
            rows = db.execute(f"SELECT rowid, id FROM facts WHERE {where}", args).fetchall()  # noqa: S608
            self._uncache(db, tenant, [rowid for rowid, _ in rows])
            _delete_facts(db, tenant, [(rowid, fact_id) for rowid, fact_id in rows])
            return len(rows)

        purged: int = await self._run(tenant, work)
        await self._checkpoint(tenant)
        return purged

    async def _checkpoint(self, tenant: str) -> None:
        """Leave no deleted text behind: merge the word index, fold the write-ahead log in and empty it.

        Merging drops deleted entries from the index; freed pages are zeroed by ``secure_delete``.
        """

        def call() -> None:
            with self._held(tenant):
                db = self._db(tenant)
                db.execute("INSERT INTO passages_fts (passages_fts) VALUES ('optimize')")
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

        await asyncio.to_thread(call)

    async def rotate(self, tenant: str) -> int:
        """Re-seal with the current key (and re-index) every row of ``tenant`` sealed otherwise; the facts changed."""
        keyring = self.keyring
        if keyring is None or not self.path(tenant).exists():
            return 0

        def work(db: sqlean.Connection) -> int:
            changed = 0
            context = memory_context(tenant)
            for rowid, text, source in db.execute(
                "SELECT rowid, text, source FROM facts WHERE tenant = ?", (tenant,)
            ).fetchall():
                stale = keyring.needs_rotation(text) or keyring.needs_rotation(source)
                pieces = db.execute("SELECT id, text FROM passages WHERE fact = ?", (rowid,)).fetchall()
                stale = stale or any(keyring.needs_rotation(piece) for _, piece in pieces)
                if not stale:
                    continue
                changed += 1
                db.execute(
                    "UPDATE facts SET text = ?, source = ? WHERE rowid = ?",
                    (keyring.reseal(text, context), keyring.reseal(source, context), rowid),
                )
                for passage_id, piece in pieces:
                    plain = keyring.open(piece, context)
                    db.execute("UPDATE passages SET text = ? WHERE id = ?", (keyring.seal(plain, context), passage_id))
                    db.execute("DELETE FROM passages_fts WHERE rowid = ?", (passage_id,))
                    db.execute(
                        "INSERT INTO passages_fts (rowid, terms) VALUES (?, ?)",
                        (passage_id, self._index_terms(tenant, unescape_plain(plain))),
                    )
            for seq, reason in db.execute(
                "SELECT seq, reason FROM changes WHERE tenant = ? AND reason != ''", (tenant,)
            ).fetchall():
                if keyring.needs_rotation(reason):
                    db.execute("UPDATE changes SET reason = ? WHERE seq = ?", (keyring.reseal(reason, context), seq))
            return changed

        rotated: int = await self._run(tenant, work)
        await self._checkpoint(tenant)
        return rotated


_COLUMNS = (
    "id, tenant, project, text, source, run_id, created_at, updated_at, confidence, expires_at, length, kind, actor"
)


def _inode(path: Path) -> int | None:
    """The inode of ``path`` (``None``: no such file)."""
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


def _scope(tenant: str, projects: Sequence[str], now: float, alias: str = "f") -> tuple[str, tuple[Any, ...]]:
    """The SQL condition (and its values) of the facts a caller may see: its tenant, its projects, not expired."""
    marks = ", ".join("?" for _ in projects)
    return (
        f"{alias}.tenant = ? AND {alias}.project IN ({marks})"
        f" AND ({alias}.expires_at IS NULL OR {alias}.expires_at > ?)",
        (tenant, *projects, now),
    )


def _phrase(word: str) -> str:
    return '"' + word.replace('"', '""') + '"'


def _floats(blob: bytes) -> list[float]:
    values = array("f")
    values.frombytes(blob)
    return values.tolist()


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


def _drop_passages(db: sqlean.Connection, rowids: Sequence[int]) -> None:
    for at in range(0, len(rowids), _BATCH):
        batch = list(rowids[at : at + _BATCH])
        marks = ", ".join("?" for _ in batch)
        db.execute(
            f"DELETE FROM passages_fts WHERE rowid IN (SELECT id FROM passages WHERE fact IN ({marks}))",  # noqa: S608
            batch,
        )
        db.execute(f"DELETE FROM passages WHERE fact IN ({marks})", batch)  # noqa: S608


def _delete_facts(db: sqlean.Connection, tenant: str, rows: Sequence[tuple[int, str]]) -> None:
    """Delete facts (by rowid and id) with their passages, index entries and links."""
    _drop_passages(db, [rowid for rowid, _ in rows])
    for at in range(0, len(rows), _BATCH):
        batch = rows[at : at + _BATCH]
        ids = [fact_id for _, fact_id in batch]
        marks = ", ".join("?" for _ in batch)
        db.execute(f"DELETE FROM facts WHERE rowid IN ({marks})", [rowid for rowid, _ in batch])  # noqa: S608
        db.execute(
            f"DELETE FROM links WHERE tenant = ? AND (src IN ({marks}) OR dst IN ({marks}))",  # noqa: S608
            (tenant, *ids, *ids),
        )


def _migrate(db: sqlean.Connection) -> None:
    """Create the schema, or bring a database of the first layout (facts indexed whole, no passages) up to it."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version >= _VERSION:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        columns = {row[1] for row in db.execute("PRAGMA table_info(facts)")}
        legacy = bool(columns) and "kind" not in columns
        if legacy:
            db.execute("ALTER TABLE facts ADD COLUMN kind TEXT NOT NULL DEFAULT 'fact'")
            db.execute("ALTER TABLE facts ADD COLUMN actor TEXT NOT NULL DEFAULT ''")
            db.execute("DROP TABLE IF EXISTS facts_fts")
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
        if legacy:
            for rowid, text in db.execute("SELECT rowid, text FROM facts").fetchall():
                cursor = db.execute(
                    "INSERT INTO passages (fact, idx, start, text, length) VALUES (?, 0, 0, ?, ?)",
                    (rowid, text, len(terms(text))),
                )
                db.execute(
                    "INSERT INTO passages_fts (rowid, terms) VALUES (?, ?)", (cursor.lastrowid, " ".join(terms(text)))
                )
        db.execute(f"PRAGMA user_version = {_VERSION}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
