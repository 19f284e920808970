"""The production :class:`~switchboard.core.memory.store.MemoryStore`: PostgreSQL, full-text search and pgvector.

Every tenant's memory is in the same tables (in their own schema, ``memory`` by default), and every statement names
the tenant. The store creates what it needs on first use — ``CREATE EXTENSION IF NOT EXISTS vector``, then
``CREATE ... IF NOT EXISTS`` under an advisory lock, so gateways and workers starting together do not race — and
raises :class:`~switchboard.errors.ConfigError` saying what to install when the server has no pgvector.

A fact is indexed as passages (one for a fact, a chunk each for a document, as
:func:`~switchboard.core.memory.chunks.passages` cuts them); a passage row carries the tenant, project and expiry of
its fact, its words as a ``tsvector`` (each word once, with as many positions as it occurs, so the term frequency is
in the index) and its ``vector``. Every read filters by tenant, project and expiry in the ``WHERE`` clause **before**
it ranks:

- :meth:`PostgresMemoryStore.search` computes BM25 in SQL over the visible passages alone: the passage count, the
  average length and each word's document frequency come from the rows the caller may see, so rows it may not see
  change neither which facts it gets nor their scores (the same BM25 as the embedded store's, on the same words).
- :meth:`PostgresMemoryStore.nearest` is an exact cosine scan (pgvector's ``<=>``) of the visible passages. No ANN
  index is built on purpose: an HNSW or IVFFlat index ranks first and filters after, so a tenant's rows could push
  another's out of the candidate list.

The ``vector`` column has no fixed dimension, so changing the embedding model needs no migration: every passage of a
fact must have vectors of one length, and :meth:`~PostgresMemoryStore.nearest` compares only rows whose
``vector_dims`` equal the query's (vectors of another model are skipped, never an error mid-query).

With a :class:`~switchboard.core.sealing.Keyring`, fact text, sources and change reasons are stored sealed (context
``memory:<tenant>``) and the ``tsvector`` holds blind terms instead of words; a query looks for the blind terms of
its words under every listed key (and the words themselves, for rows indexed before sealing was switched on), and
:meth:`~PostgresMemoryStore.rotate` re-seals and re-indexes a tenant's rows under the current key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from switchboard.core.memory.chunks import passages
from switchboard.core.memory.embeddings import digest
from switchboard.core.memory.facts import Fact, FactChange, FactKind, Hit, Source, check_name
from switchboard.core.memory.store import memory_context, terms
from switchboard.core.sealing import (
    DATA_KEYS_ENV,
    SEALED_PREFIX,
    Keyring,
    SealError,
    escape_plain,
    is_sealed,
    unescape_plain,
)
from switchboard.errors import ConfigError

__all__ = ["PostgresMemoryStore"]

logger = logging.getLogger(__name__)

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_MAX_TERMS = 16
_MAX_WORD = 200
"""Longer words are indexed and looked up by their first characters (a ``tsvector`` lexeme is at most 2 KB)."""
_MAX_POSITIONS = 255
"""A lexeme holds at most 256 positions; the term frequency is capped there."""
_LOCK = 0x5B_3E_40_24
"""The advisory lock held while the schema is created."""
_K1 = 1.2
_B = 0.75

_DDL = """
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.facts (
    tenant TEXT NOT NULL,
    id TEXT NOT NULL,
    project TEXT NOT NULL,
    kind TEXT NOT NULL,
    text TEXT NOT NULL,
    source TEXT NOT NULL,
    run_id TEXT NOT NULL,
    actor TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION,
    confidence DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX IF NOT EXISTS facts_scope ON {s}.facts (tenant, project, created_at);
CREATE INDEX IF NOT EXISTS facts_actor ON {s}.facts (tenant, actor);
CREATE TABLE IF NOT EXISTS {s}.passages (
    tenant TEXT NOT NULL,
    fact_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    project TEXT NOT NULL,
    expires_at DOUBLE PRECISION,
    start INTEGER NOT NULL,
    stop INTEGER NOT NULL,
    length INTEGER NOT NULL,
    terms TSVECTOR NOT NULL,
    embedding VECTOR,
    PRIMARY KEY (tenant, fact_id, idx),
    FOREIGN KEY (tenant, fact_id) REFERENCES {s}.facts (tenant, id) ON DELETE CASCADE
);
ALTER TABLE {s}.passages ALTER COLUMN embedding SET STORAGE PLAIN;
CREATE INDEX IF NOT EXISTS passages_terms ON {s}.passages USING gin (terms);
CREATE INDEX IF NOT EXISTS passages_scope ON {s}.passages (tenant, project) INCLUDE (expires_at, length);
CREATE TABLE IF NOT EXISTS {s}.links (
    tenant TEXT NOT NULL,
    src TEXT NOT NULL,
    dst TEXT NOT NULL,
    PRIMARY KEY (tenant, src, dst)
);
CREATE INDEX IF NOT EXISTS links_dst ON {s}.links (tenant, dst);
CREATE TABLE IF NOT EXISTS {s}.changes (
    seq BIGSERIAL PRIMARY KEY,
    tenant TEXT NOT NULL,
    fact_id TEXT NOT NULL,
    project TEXT NOT NULL,
    op TEXT NOT NULL,
    actor TEXT NOT NULL,
    agent TEXT NOT NULL,
    run_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS changes_fact ON {s}.changes (tenant, fact_id, seq);
CREATE TABLE IF NOT EXISTS {s}.embedding_cache (
    tenant TEXT NOT NULL,
    model TEXT NOT NULL,
    digest TEXT NOT NULL,
    vector DOUBLE PRECISION[] NOT NULL,
    PRIMARY KEY (tenant, model, digest)
);
"""

_FRAGMENTS = {
    "live": "(p.expires_at IS NULL OR p.expires_at > $3)",
    "visible": "p.tenant = $1 AND p.project = ANY($2::text[]) AND (p.expires_at IS NULL OR p.expires_at > $3)",
    "columns": "f.id, f.tenant, f.project, f.kind, f.text, f.source, f.run_id, f.actor, f.created_at, f.updated_at,"
    " f.confidence, f.expires_at",
    "k1": str(_K1),
    "b": str(_B),
}
"""Constant pieces of the statements: what a read may see (tenant ``$1``, projects ``$2``, now ``$3``), and more."""

_SEARCH = """
WITH stats AS (
    SELECT count(*)::float8 AS n, coalesce(avg(p.length), 0)::float8 AS average
    FROM {s}.passages p WHERE {visible}
), matched AS (
    SELECT p.fact_id, p.idx, p.length, q.word, sum(cardinality(u.positions))::float8 AS tf
    FROM {s}.passages p
    CROSS JOIN LATERAL unnest(p.terms) AS u
    JOIN unnest($5::text[], $6::int[]) AS q (lexeme, word) ON q.lexeme = u.lexeme
    WHERE {visible} AND p.terms @@ $4::tsquery
    GROUP BY p.fact_id, p.idx, p.length, q.word
), frequency AS (
    SELECT word, count(*)::float8 AS df FROM matched GROUP BY word
), scored AS (
    SELECT m.fact_id, m.idx, sum(
        ln(1 + (s.n - d.df + 0.5) / (d.df + 0.5)) * m.tf * ({k1} + 1)
        / (m.tf + {k1} * (1 - {b} + {b} * m.length / (CASE WHEN s.average > 0 THEN s.average ELSE 1 END)))
    ) AS score
    FROM matched m JOIN frequency d USING (word) CROSS JOIN stats s
    GROUP BY m.fact_id, m.idx
), best AS (  -- the ties at the limit too: the final order breaks them by the fact's age
    SELECT fact_id, max(ARRAY[score, -idx]) AS top FROM scored GROUP BY fact_id
    ORDER BY (max(ARRAY[score, -idx]))[1] DESC FETCH FIRST ($7) ROWS WITH TIES
)
SELECT b.top[1] AS score, (-b.top[2])::int AS idx, {columns}
FROM best b JOIN {s}.facts f ON f.tenant = $1 AND f.id = b.fact_id
ORDER BY b.top[1] DESC, f.created_at DESC, f.id
LIMIT $7
"""

_NEAREST = """
WITH query AS MATERIALIZED (
    SELECT $4::text::vector AS embedding
), distances AS MATERIALIZED (  -- each distance computed once, in the scan; only small rows go on
    SELECT p.fact_id, p.idx,
        CASE WHEN vector_dims(p.embedding) = $5 THEN p.embedding <=> q.embedding END AS distance
    FROM {s}.passages p CROSS JOIN query q
    WHERE {visible} AND p.embedding IS NOT NULL AND vector_dims(p.embedding) = $5
), best AS (  -- the CASE: the planner may compute the distance before it checks the length
    SELECT fact_id, min(ARRAY[distance, idx]) AS top FROM distances WHERE distance < 'NaN'::float8
    GROUP BY fact_id ORDER BY (min(ARRAY[distance, idx]))[1], fact_id LIMIT $6
)
SELECT 1 - b.top[1] AS score, b.top[2]::int AS idx, {columns}
FROM best b JOIN {s}.facts f ON f.tenant = $1 AND f.id = b.fact_id
ORDER BY b.top[1], f.id
"""


class PostgresMemoryStore:
    """Memory in PostgreSQL: ``tsvector`` BM25 for words, pgvector for nearness, one schema for every tenant.

    The pool opens, and the schema is created, on first use (or by :meth:`create`); :meth:`close` closes the pool.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "memory",
        keyring: Keyring | None = None,
        max_connections: int = 5,
    ) -> None:
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ConfigError(f"memory schema {schema!r} must be lower-case letters, digits and '_'", field="schema")
        self.dsn = dsn
        """``postgresql://user@host:port/db`` (its password from the environment, never in the file)."""
        self.schema = schema
        self.keyring = keyring
        self._keys_checked: set[str] = set()
        self.max_connections = max_connections
        self._pool: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()

    # --------------------------------------------------------------- lifecycle

    async def create(self) -> None:
        """Open the pool and create the extension, the schema and its tables when missing (idempotent)."""
        await self._connections()

    async def close(self) -> None:
        """Close the pool."""
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def _connections(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a pool serves the loop that opened it (a CLI may run one loop per command)
            if self._pool is not None:
                with contextlib.suppress(RuntimeError):  # its loop is closed: so are its connections' transports
                    self._pool.terminate()
            self._pool, self._loop, self._lock = None, loop, asyncio.Lock()
        async with self._lock:
            if self._pool is None:
                import asyncpg

                pool = await asyncpg.create_pool(self.dsn, min_size=0, max_size=self.max_connections)
                try:
                    async with pool.acquire() as con, con.transaction():
                        await con.execute("SELECT pg_advisory_xact_lock($1)", _LOCK)
                        await _create_extension(con)
                        await con.execute(self._sql(_DDL))
                except BaseException:
                    await pool.close()
                    raise
                self._pool = pool
            return self._pool

    def _sql(self, statement: str) -> str:
        """``statement`` with its placeholders filled in: ``{s}`` the schema, then the constant fragments."""
        for name, value in _FRAGMENTS.items():
            statement = statement.replace("{" + name + "}", value)
        return statement.replace("{s}", f'"{self.schema}"')

    # ------------------------------------------------------------------ writes

    async def add(self, fact: Fact, change: FactChange, embeddings: Sequence[Sequence[float]] | None = None) -> None:
        """Store a new fact and record its change; an id already stored is left as it is (a re-run).

        Raises:
            ValueError: ``embeddings`` is not one vector per passage, its vectors differ in length, or the text holds
                a NUL character.
        """
        check_name(fact.tenant, "tenant")
        rows = self._passage_rows(fact.tenant, fact.kind, fact.text, embeddings)
        pool = await self._connections()
        async with pool.acquire() as con, con.transaction():
            inserted = await con.fetchval(
                self._sql(
                    "INSERT INTO {s}.facts (tenant, id, project, kind, text, source, run_id, actor, created_at,"
                    " updated_at, confidence, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
                    " ON CONFLICT (tenant, id) DO NOTHING RETURNING 1"
                ),
                fact.tenant,
                fact.id,
                fact.project,
                fact.kind,
                self._seal(fact.tenant, fact.text),
                self._seal(fact.tenant, fact.source.model_dump_json()),
                fact.run_id,
                fact.actor,
                fact.created_at,
                fact.updated_at,
                fact.confidence,
                fact.expires_at,
            )
            if inserted is None:
                return
            await self._insert_passages(con, fact.tenant, fact.id, fact.project, fact.expires_at, rows)
            await self._record(con, fact.tenant, change)

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
        """Replace a fact's text, source and confidence (and its passages and their vectors), and record the change.

        Raises:
            KeyError: no fact ``fact_id`` in ``tenant``.
            ValueError: the text is too long for the fact's kind, or ``embeddings`` does not fit its passages.
        """
        pool = await self._connections()
        async with pool.acquire() as con, con.transaction():
            row = await con.fetchrow(
                self._sql("SELECT {columns} FROM {s}.facts f WHERE f.tenant = $1 AND f.id = $2 FOR UPDATE"),
                tenant,
                fact_id,
            )
            if row is None:
                raise KeyError(fact_id)
            current = self._fact(row, ())
            Fact.model_validate(  # the new text must fit the fact's kind, before anything changes
                {**current.model_dump(), "text": text, "source": source, "confidence": confidence}
            )
            rows = self._passage_rows(tenant, current.kind, text, embeddings)
            if current.text != text:
                await self._drop_cached(con, tenant, [(current.kind, current.text)])
            await con.execute(
                self._sql(
                    "UPDATE {s}.facts SET text = $3, source = $4, confidence = $5, updated_at = $6"
                    " WHERE tenant = $1 AND id = $2"
                ),
                tenant,
                fact_id,
                self._seal(tenant, text),
                self._seal(tenant, source.model_dump_json()),
                confidence,
                change.at,
            )
            await con.execute(self._sql("DELETE FROM {s}.passages WHERE tenant = $1 AND fact_id = $2"), tenant, fact_id)
            await self._insert_passages(con, tenant, fact_id, current.project, current.expires_at, rows)
            await self._record(con, tenant, change)

    async def link(self, tenant: str, src: str, dst: str, change: FactChange) -> None:
        """Relate two facts (both ways) and record the change."""
        pool = await self._connections()
        async with pool.acquire() as con, con.transaction():
            await con.executemany(
                self._sql("INSERT INTO {s}.links (tenant, src, dst) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING"),
                [(tenant, src, dst), (tenant, dst, src)],
            )
            await self._record(con, tenant, change)

    async def forget(self, tenant: str, fact_id: str, change: FactChange) -> None:
        """Delete a fact, its text, passages and links, and record the change.

        Raises:
            KeyError: no fact ``fact_id`` in ``tenant``.
        """
        pool = await self._connections()
        async with pool.acquire() as con, con.transaction():
            gone = await self._delete(con, tenant, [fact_id])
            if not gone:
                raise KeyError(fact_id)
            await self._record(con, tenant, change)

    async def cache_embeddings(self, tenant: str, model: str, vectors: Mapping[str, Sequence[float]]) -> None:
        """Keep ``vectors`` of ``model`` by digest (content hash)."""
        if not vectors:
            return
        pool = await self._connections()
        await pool.executemany(
            self._sql(
                "INSERT INTO {s}.embedding_cache (tenant, model, digest, vector) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (tenant, model, digest) DO UPDATE SET vector = excluded.vector"
            ),
            [(tenant, model, key, [float(value) for value in vector]) for key, vector in vectors.items()],
        )

    async def erase(self, tenant: str, *, actor: str | None = None) -> int:
        """Remove all of ``tenant``'s memory (``actor`` ``None``), or the facts remembered for ``actor``.

        With them go their passages, links, changes and cached embeddings; the number of facts removed.
        """
        pool = await self._connections()
        async with pool.acquire() as con, con.transaction():
            if actor is None:
                count = await con.fetchval(
                    self._sql(
                        "WITH gone AS (DELETE FROM {s}.facts WHERE tenant = $1 RETURNING 1) SELECT count(*) FROM gone"
                    ),
                    tenant,
                )
                for table in ("passages", "links", "changes", "embedding_cache"):
                    await con.execute(self._sql(f"DELETE FROM {{s}}.{table} WHERE tenant = $1"), tenant)  # noqa: S608
                return int(count)
            rows = await con.fetch(
                self._sql("SELECT id, kind, text FROM {s}.facts WHERE tenant = $1 AND actor = $2 FOR UPDATE"),
                tenant,
                actor,
            )
            if not rows:
                return 0
            ids = [row["id"] for row in rows]
            await con.execute(
                self._sql("DELETE FROM {s}.changes WHERE tenant = $1 AND fact_id = ANY($2::text[])"), tenant, ids
            )
            return await self._delete(con, tenant, ids)

    async def purge(self, tenant: str, before: float, *, kind: FactKind | None = None) -> int:
        """Remove ``tenant``'s facts (of ``kind``, or both kinds) created before ``before``; the number removed."""
        pool = await self._connections()
        async with pool.acquire() as con, con.transaction():
            ids = [
                fact_id
                for (fact_id,) in await con.fetch(
                    self._sql(
                        "SELECT id FROM {s}.facts WHERE tenant = $1 AND created_at < $2"
                        " AND ($3::text IS NULL OR kind = $3) FOR UPDATE"
                    ),
                    tenant,
                    before,
                    kind,
                )
            ]
            return await self._delete(con, tenant, ids) if ids else 0

    async def rotate(self, tenant: str) -> int:
        """Re-seal with the current key (and re-index) every row of ``tenant`` sealed otherwise; the facts changed.

        Without a keyring there is nothing to seal with: 0.
        """
        keyring = self.keyring
        if keyring is None:
            return 0
        pool = await self._connections()
        changed = 0
        prefix = f"{SEALED_PREFIX}{keyring.current}:"
        async with pool.acquire() as con, con.transaction():
            rows = await con.fetch(
                self._sql(
                    "SELECT id, kind, text, source FROM {s}.facts WHERE tenant = $1 AND left(text, $3) <> $2 FOR UPDATE"
                ),
                tenant,
                prefix,
                len(prefix),
            )
            for row in rows:
                text = self._open(tenant, row["text"])
                source = self._open(tenant, row["source"])
                await con.execute(
                    self._sql("UPDATE {s}.facts SET text = $3, source = $4 WHERE tenant = $1 AND id = $2"),
                    tenant,
                    row["id"],
                    self._seal(tenant, text),
                    self._seal(tenant, source),
                )
                for piece in await con.fetch(
                    self._sql("SELECT idx, start, stop FROM {s}.passages WHERE tenant = $1 AND fact_id = $2"),
                    tenant,
                    row["id"],
                ):
                    await con.execute(
                        self._sql(
                            "UPDATE {s}.passages SET terms = $4::tsvector"
                            " WHERE tenant = $1 AND fact_id = $2 AND idx = $3"
                        ),
                        tenant,
                        row["id"],
                        piece["idx"],
                        self._tsvector(tenant, text[piece["start"] : piece["stop"]]),
                    )
                changed += 1
            for row in await con.fetch(
                self._sql(
                    "SELECT seq, reason FROM {s}.changes WHERE tenant = $1 AND reason <> '' AND left(reason, $3) <> $2"
                ),
                tenant,
                prefix,
                len(prefix),
            ):
                await con.execute(
                    self._sql("UPDATE {s}.changes SET reason = $2 WHERE seq = $1"),
                    row["seq"],
                    keyring.reseal(row["reason"], memory_context(tenant)),
                )
        return changed

    # ------------------------------------------------------------------- reads

    async def tenants(self) -> list[str]:
        """The tenants that have memory (facts, changes or cached vectors), sorted: what a sweep goes through."""
        pool = await self._connections()
        rows = await pool.fetch(
            self._sql(
                "SELECT tenant FROM {s}.facts UNION SELECT tenant FROM {s}.changes"
                " UNION SELECT tenant FROM {s}.embedding_cache ORDER BY 1"
            )
        )
        return [row["tenant"] for row in rows]

    async def get(self, tenant: str, fact_id: str, projects: Sequence[str]) -> Fact | None:
        """The fact ``fact_id`` when it is in one of ``projects`` of ``tenant`` (expired or not), else ``None``."""
        if not projects:
            return None
        pool = await self._connections()
        async with pool.acquire() as con:
            row = await con.fetchrow(
                self._sql(
                    "SELECT {columns} FROM {s}.facts f"
                    " WHERE f.tenant = $1 AND f.id = $2 AND f.project = ANY($3::text[])"
                ),
                tenant,
                fact_id,
                list(projects),
            )
            if row is None:
                return None
            links = await self._links(con, tenant, [fact_id], projects)
        return self._fact(row, links.get(fact_id, ()))

    async def facts(self, tenant: str, projects: Sequence[str]) -> list[Fact]:
        """Every fact of ``projects``, expired ones included, oldest first (for operators)."""
        if not projects:
            return []
        pool = await self._connections()
        async with pool.acquire() as con:
            rows = await con.fetch(
                self._sql(
                    "SELECT {columns} FROM {s}.facts f WHERE f.tenant = $1 AND f.project = ANY($2::text[])"
                    " ORDER BY f.created_at, f.id"
                ),
                tenant,
                list(projects),
            )
            links = await self._links(con, tenant, [row["id"] for row in rows], projects)
        return [self._fact(row, links.get(row["id"], ())) for row in rows]

    async def search(self, tenant: str, projects: Sequence[str], query: str, limit: int, now: float) -> list[Hit]:
        """Live facts of ``projects`` matching any word of ``query``, best first, BM25 among those alone."""
        words = list(dict.fromkeys(word[:_MAX_WORD] for word in terms(query)))[:_MAX_TERMS]
        if not projects or not words or limit < 1:
            return []
        lexemes: list[str] = []
        numbers: list[int] = []
        for number, word in enumerate(words):
            looked_for = [word]
            if self.keyring is not None:
                looked_for = [*self.keyring.blind_all(word, memory_context(tenant)), word]
            for lexeme in dict.fromkeys(looked_for):
                lexemes.append(lexeme)
                numbers.append(number)
        tsquery = " | ".join(_quoted(lexeme) for lexeme in lexemes)
        pool = await self._connections()
        async with pool.acquire() as con:
            await self._check_keys(con, tenant)
            rows = await con.fetch(self._sql(_SEARCH), tenant, list(projects), now, tsquery, lexemes, numbers, limit)
            return await self._hits(con, tenant, projects, rows)

    async def nearest(
        self, tenant: str, projects: Sequence[str], embedding: Sequence[float], limit: int, now: float
    ) -> list[Hit]:
        """Live facts of ``projects`` whose passage is nearest ``embedding`` (exact cosine), best first.

        ``Hit.score`` is the cosine similarity of the fact's best passage; passages whose vectors have another
        length than ``embedding`` (another model's) are not compared.
        """
        if not projects or not embedding or limit < 1:
            return []
        pool = await self._connections()
        async with pool.acquire() as con:
            rows = await con.fetch(
                self._sql(_NEAREST), tenant, list(projects), now, _vector(embedding), len(embedding), limit
            )
            return await self._hits(con, tenant, projects, rows)

    async def neighbours(
        self, tenant: str, projects: Sequence[str], fact_ids: Sequence[str], now: float
    ) -> dict[str, list[str]]:
        """For each of ``fact_ids``: the ids it is linked to that are live and in ``projects`` (sorted)."""
        found: dict[str, list[str]] = {fact_id: [] for fact_id in fact_ids}
        if not projects or not fact_ids:
            return found
        pool = await self._connections()
        rows = await pool.fetch(
            self._sql(
                "SELECT l.src, l.dst FROM {s}.links l JOIN {s}.facts p ON p.tenant = l.tenant AND p.id = l.dst"
                " WHERE l.tenant = $1 AND l.src = ANY($4::text[]) AND p.project = ANY($2::text[]) AND {live}"
                " ORDER BY l.src, l.dst"
            ),
            tenant,
            list(projects),
            now,
            list(dict.fromkeys(fact_ids)),
        )
        for row in rows:
            found[row["src"]].append(row["dst"])
        return found

    async def changes(self, tenant: str, fact_id: str | None = None) -> list[FactChange]:
        """The recorded changes, oldest first (of one fact when ``fact_id`` is given)."""
        pool = await self._connections()
        rows = await pool.fetch(
            self._sql(
                "SELECT fact_id, project, op, actor, agent, run_id, reason, at FROM {s}.changes"
                " WHERE tenant = $1 AND ($2::text IS NULL OR fact_id = $2) ORDER BY seq"
            ),
            tenant,
            fact_id,
        )
        return [FactChange.model_validate({**row, "reason": self._open(tenant, row["reason"])}) for row in rows]

    async def cached_embeddings(self, tenant: str, model: str, digests: Sequence[str]) -> dict[str, list[float]]:
        """The cached vectors of ``model`` among ``digests`` (content hashes), by digest."""
        if not digests:
            return {}
        pool = await self._connections()
        rows = await pool.fetch(
            self._sql(
                "SELECT digest, vector FROM {s}.embedding_cache"
                " WHERE tenant = $1 AND model = $2 AND digest = ANY($3::text[])"
            ),
            tenant,
            model,
            list(digests),
        )
        return {row["digest"]: list(row["vector"]) for row in rows}

    # ----------------------------------------------------------------- helpers

    async def _check_keys(self, con: Any, tenant: str) -> None:
        """Raise :class:`SealError` when the keyring cannot open ``tenant``'s sealed memory.

        A word search looks for blind terms, so without the right key it would silently find only plain rows.
        """
        if tenant in self._keys_checked:
            return
        sealed = await con.fetchval(
            self._sql("SELECT text FROM {s}.facts WHERE tenant = $1 AND starts_with(text, $2) LIMIT 1"),
            tenant,
            SEALED_PREFIX,
        )
        if sealed is not None:
            if self.keyring is None:
                raise SealError(f"memory is sealed at rest: set {DATA_KEYS_ENV} to search it")
            try:
                self.keyring.open(sealed, memory_context(tenant))
            except SealError as error:
                raise SealError(f"the keys of {DATA_KEYS_ENV} do not open this memory: {error}") from None
        self._keys_checked.add(tenant)

    def _seal(self, tenant: str, value: str) -> str:
        value = escape_plain(value)  # plain text a user wrote as "sb1:…" is never taken for a sealed value
        return value if self.keyring is None else self.keyring.seal(value, memory_context(tenant))

    def _open(self, tenant: str, value: str) -> str:
        if self.keyring is None:
            if is_sealed(value):
                raise SealError(f"memory is sealed at rest: set {DATA_KEYS_ENV} to read it")
            return unescape_plain(value)
        return unescape_plain(self.keyring.open(value, memory_context(tenant)))

    def _tsvector(self, tenant: str, text: str) -> str:
        """The ``tsvector`` literal of ``text``: each word (or its blind term) once, one position per occurrence."""
        counts: dict[str, int] = {}
        for word in terms(text):
            lexeme = word[:_MAX_WORD]
            if self.keyring is not None:
                lexeme = self.keyring.blind(lexeme, memory_context(tenant))
            counts[lexeme] = counts.get(lexeme, 0) + 1
        return " ".join(
            f"{_quoted(lexeme)}:{','.join(str(n) for n in range(1, min(count, _MAX_POSITIONS) + 1))}"
            for lexeme, count in counts.items()
        )

    def _passage_rows(
        self, tenant: str, kind: FactKind, text: str, embeddings: Sequence[Sequence[float]] | None
    ) -> list[tuple[int, int, int, int, str, str | None]]:
        """``(idx, start, stop, length, tsvector, vector)`` of each passage of ``text``, before anything is written."""
        _check_text(text)
        pieces = _spans(kind, text)
        if embeddings is not None:
            if len(embeddings) != len(pieces):
                raise ValueError(f"{len(embeddings)} embeddings for {len(pieces)} passages: one per passage")
            if len({len(vector) for vector in embeddings}) > 1 or any(not vector for vector in embeddings):
                raise ValueError("the embeddings of one fact must all have the same, non-zero length")
        return [
            (
                index,
                start,
                stop,
                len(terms(text[start:stop])),
                self._tsvector(tenant, text[start:stop]),
                None if embeddings is None else _vector(embeddings[index]),
            )
            for index, (start, stop) in enumerate(pieces)
        ]

    async def _insert_passages(
        self,
        con: Any,
        tenant: str,
        fact_id: str,
        project: str,
        expires_at: float | None,
        rows: Iterable[tuple[int, int, int, int, str, str | None]],
    ) -> None:
        await con.executemany(
            self._sql(
                "INSERT INTO {s}.passages (tenant, fact_id, idx, project, expires_at, start, stop, length, terms,"
                " embedding) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::tsvector, $10::text::vector)"
            ),
            [(tenant, fact_id, index, project, expires_at, *rest) for index, *rest in rows],
        )

    async def _drop_cached(self, con: Any, tenant: str, texts: Sequence[tuple[FactKind, str]]) -> None:
        """Delete the cached embeddings of the passages of ``texts`` (kind, plain text), under every model.

        A cache row is keyed by a hash of a passage's text: kept after its fact went, it would confirm a guess of it.
        """
        if not texts:
            return
        models = [
            model
            for (model,) in await con.fetch(
                self._sql("SELECT DISTINCT model FROM {s}.embedding_cache WHERE tenant = $1"), tenant
            )
        ]
        digests = [digest(model, piece) for model in models for kind, text in texts for piece in _pieces(kind, text)]
        if digests:
            await con.execute(
                self._sql("DELETE FROM {s}.embedding_cache WHERE tenant = $1 AND digest = ANY($2::text[])"),
                tenant,
                digests,
            )

    async def _delete(self, con: Any, tenant: str, ids: Sequence[str]) -> int:
        """Delete facts, their passages, links and cached embeddings; how many facts were deleted."""
        rows = await con.fetch(
            self._sql("SELECT kind, text FROM {s}.facts WHERE tenant = $1 AND id = ANY($2::text[])"), tenant, list(ids)
        )
        await self._drop_cached(con, tenant, [(row["kind"], self._open(tenant, row["text"])) for row in rows])
        count = await con.fetchval(
            self._sql(
                "WITH gone AS (DELETE FROM {s}.facts WHERE tenant = $1 AND id = ANY($2::text[]) RETURNING 1)"
                " SELECT count(*) FROM gone"
            ),
            tenant,
            list(ids),
        )
        await con.execute(
            self._sql("DELETE FROM {s}.links WHERE tenant = $1 AND (src = ANY($2::text[]) OR dst = ANY($2::text[]))"),
            tenant,
            list(ids),
        )
        return int(count)

    async def _record(self, con: Any, tenant: str, change: FactChange) -> None:
        _check_text(change.reason)  # in the caller's transaction: an error undoes the whole change
        await con.execute(
            self._sql(
                "INSERT INTO {s}.changes (tenant, fact_id, project, op, actor, agent, run_id, reason, at)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
            ),
            tenant,
            change.fact_id,
            change.project,
            change.op,
            change.actor,
            change.agent,
            change.run_id,
            self._seal(tenant, change.reason) if change.reason else "",
            change.at,
        )

    async def _links(self, con: Any, tenant: str, ids: Sequence[str], projects: Sequence[str]) -> dict[str, list[str]]:
        """The links of ``ids`` to facts of ``projects`` (expired or not): an id the caller may not see is not shown."""
        if not ids:
            return {}
        rows = await con.fetch(
            self._sql(
                "SELECT l.src, l.dst FROM {s}.links l JOIN {s}.facts f ON f.tenant = l.tenant AND f.id = l.dst"
                " WHERE l.tenant = $1 AND l.src = ANY($2::text[]) AND f.project = ANY($3::text[]) ORDER BY l.dst"
            ),
            tenant,
            list(ids),
            list(projects),
        )
        found: dict[str, list[str]] = {}
        for row in rows:
            found.setdefault(row["src"], []).append(row["dst"])
        return found

    async def _hits(self, con: Any, tenant: str, projects: Sequence[str], rows: Sequence[Any]) -> list[Hit]:
        links = await self._links(con, tenant, [row["id"] for row in rows], projects)
        hits: list[Hit] = []
        for row in rows:
            fact = self._fact(row, links.get(row["id"], ()))
            passage = ""
            if fact.kind == "document":
                start, stop = _spans(fact.kind, fact.text)[row["idx"]]
                passage = fact.text[start:stop]
            hits.append(Hit(fact=fact, score=round(float(row["score"]), 6), passage=passage))
        return hits

    def _fact(self, row: Any, links: Sequence[str]) -> Fact:
        tenant = row["tenant"]
        return Fact(
            id=row["id"],
            tenant=tenant,
            project=row["project"],
            kind=row["kind"],
            text=self._open(tenant, row["text"]),
            source=Source.model_validate(json.loads(self._open(tenant, row["source"]))),
            run_id=row["run_id"],
            actor=row["actor"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            confidence=row["confidence"],
            expires_at=row["expires_at"],
            links=tuple(links),
        )


async def _create_extension(con: Any) -> None:
    import asyncpg

    try:
        await con.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except (asyncpg.FeatureNotSupportedError, asyncpg.UndefinedFileError, asyncpg.InsufficientPrivilegeError) as err:
        raise ConfigError(
            f"memory store: PostgreSQL cannot enable pgvector ({err}); install pgvector on the server"
            " (Debian: apt-get install postgresql-<version>-pgvector) and let this role, or an administrator,"
            " run CREATE EXTENSION vector",
            field="memory.dsn_env",
        ) from None
    except asyncpg.PostgresError as err:
        if "vector" not in str(err):
            raise
        raise ConfigError(
            f"memory store: PostgreSQL has no pgvector ({err}); install pgvector on the server"
            " (Debian: apt-get install postgresql-<version>-pgvector)",
            field="memory.dsn_env",
        ) from None


def _check_text(text: str) -> None:
    """PostgreSQL text cannot hold NUL: :class:`ValueError` before anything is written."""
    if "\x00" in text:
        raise ValueError("memory text cannot hold NUL characters")


def _spans(kind: FactKind, text: str) -> list[tuple[int, int]]:
    """``(start, stop)`` of each passage: the whole text of a fact, the chunks of a document."""
    if kind == "fact":
        return [(0, len(text))]
    return [(piece.start, piece.start + len(piece.text)) for piece in passages(text)]


def _pieces(kind: FactKind, text: str) -> list[str]:
    return [text[start:stop] for start, stop in _spans(kind, text)]


def _quoted(lexeme: str) -> str:
    """``lexeme`` as a ``tsvector``/``tsquery`` literal (quoted, so it is taken as it is, never parsed)."""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def _vector(values: Sequence[float]) -> str:
    """The text form pgvector reads of ``values``."""
    return "[" + ",".join(repr(float(value)) for value in values) + "]"
