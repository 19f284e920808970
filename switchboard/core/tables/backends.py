"""Where connected tables live: a SQLite file or a PostgreSQL database, behind one small async interface.

Each statement runs under a time limit (SQLite: a progress-handler deadline; PostgreSQL: ``statement_timeout`` in
its own transaction); a read-only table's statements run on a read-only connection or transaction, so the
permission check in :mod:`switchboard.core.tables.access` is not the only lock.

A write with an idempotency key is recorded in the ledger table :data:`LEDGER_TABLE` of the same database, in the
write's own transaction: either both are committed or neither, and a write whose key is in the ledger is answered
from it, never run again (a worker that died after the commit, a re-run of the turn, two attempts racing).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from switchboard.core.sql.guard import deadline_handler, read_uri
from switchboard.core.tables.statements import Built, Dialect
from switchboard.errors import ToolError

__all__ = ["LEDGER_TABLE", "PostgresBackend", "SqliteBackend", "TableBackend"]

LEDGER_TABLE = "switchboard_table_writes"
"""Idempotency keys of the writes a database has committed, with the number of rows each changed."""
LEDGER_TTL_S = 8 * 24 * 3600
"""How long a ledger entry is kept: as long as the gateway's own effect records."""
_SQLITE_LEDGER = (
    f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} (key TEXT PRIMARY KEY, changed INTEGER NOT NULL, at REAL NOT NULL);"
    f"CREATE INDEX IF NOT EXISTS {LEDGER_TABLE}_at ON {LEDGER_TABLE} (at)"
)
_SQLITE_FIND = f"SELECT changed FROM {LEDGER_TABLE} WHERE key = ?"  # noqa: S608
_SQLITE_PRUNE = f"DELETE FROM {LEDGER_TABLE} WHERE at < ?"  # noqa: S608
_SQLITE_RECORD = f"INSERT INTO {LEDGER_TABLE} (key, changed, at) VALUES (?, ?, ?)"  # noqa: S608
_POSTGRES_LEDGER = (
    f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} "
    "(key TEXT PRIMARY KEY, changed BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now());"
    f"CREATE INDEX IF NOT EXISTS {LEDGER_TABLE}_at ON {LEDGER_TABLE} (at)"
)
_POSTGRES_FIND = f"SELECT changed FROM {LEDGER_TABLE} WHERE key = $1"  # noqa: S608
_POSTGRES_PRUNE = f"DELETE FROM {LEDGER_TABLE} WHERE at < now() - make_interval(secs => $1)"  # noqa: S608
_POSTGRES_RECORD = f"INSERT INTO {LEDGER_TABLE} (key, changed) VALUES ($1, $2)"  # noqa: S608


class TableBackend(Protocol):
    """A database holding connected tables."""

    dialect: Dialect

    async def columns(self, table: str) -> tuple[str, ...]:
        """The table's columns, in order (empty: no such table)."""
        ...

    async def fetch(self, built: Built, *, timeout_s: float) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run a read; its column names and rows (read-only)."""
        ...

    async def execute(self, built: Built, *, timeout_s: float, key: str = "") -> int:
        """Run a write in its own transaction; the number of rows it changed.

        With ``key``, the write and its ledger entry commit together; a key already in the ledger returns the
        recorded count and runs nothing.
        """
        ...


def _timed_out(timeout_s: float) -> ToolError:
    return ToolError(
        f"the statement ran past the {timeout_s:g}s limit and was stopped: narrow it (where, limit)",
        error_class="permanent",
    )


@dataclass(slots=True)
class SqliteBackend:
    """Tables in one SQLite file (opened per statement; reads on a read-only connection)."""

    path: Path
    dialect: Dialect = "sqlite"
    _ledger: bool = field(default=False, repr=False)

    def _connect(self, *, write: bool, timeout_s: float) -> sqlite3.Connection:
        if write:
            con = sqlite3.connect(self.path, isolation_level=None, timeout=timeout_s)
        else:
            con = sqlite3.connect(read_uri(self.path), uri=True, isolation_level=None, timeout=timeout_s)
        deadline_handler(con, timeout_s)
        return con

    def _columns(self, table: str) -> tuple[str, ...]:
        con = self._connect(write=False, timeout_s=5.0)
        try:
            return tuple(str(row[1]) for row in con.execute("SELECT * FROM pragma_table_info(?)", (table,)))
        finally:
            con.close()

    def _fetch(self, built: Built, timeout_s: float) -> tuple[list[str], list[tuple[Any, ...]]]:
        con = self._connect(write=False, timeout_s=timeout_s)
        try:
            cursor = con.execute(built.sql, built.params)
            rows = cursor.fetchall()
            return [d[0] for d in cursor.description or ()], rows
        except sqlite3.OperationalError as err:
            if "interrupted" in str(err):
                raise _timed_out(timeout_s) from None
            raise ToolError(f"SQLite: {err}", error_class="validation") from None
        finally:
            con.close()

    def _execute(self, built: Built, timeout_s: float, key: str) -> int:
        con = self._connect(write=True, timeout_s=timeout_s)
        try:
            if key and not self._ledger:
                con.executescript(_SQLITE_LEDGER)
                self._ledger = True
            con.execute("BEGIN IMMEDIATE")  # the database's one writer from here: no second attempt can interleave
            try:
                if key:
                    found = con.execute(_SQLITE_FIND, (key,)).fetchone()
                    if found is not None:
                        con.execute("ROLLBACK")
                        return int(found[0])
                changed = max(con.execute(built.sql, built.params).rowcount, 0)
                if key:
                    now = time.time()
                    con.execute(_SQLITE_PRUNE, (now - LEDGER_TTL_S,))
                    con.execute(_SQLITE_RECORD, (key, changed, now))
            except sqlite3.Error as err:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                if "interrupted" in str(err):
                    raise _timed_out(timeout_s) from None
                raise ToolError(f"SQLite: {err}", error_class="validation") from None
            con.execute("COMMIT")
            return changed
        finally:
            con.close()

    async def columns(self, table: str) -> tuple[str, ...]:
        """The table's columns, in order (empty: no such table)."""
        return await asyncio.to_thread(self._columns, table)

    async def fetch(self, built: Built, *, timeout_s: float) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run a read on a read-only connection."""
        return await asyncio.to_thread(self._fetch, built, timeout_s)

    async def execute(self, built: Built, *, timeout_s: float, key: str = "") -> int:
        """Run a write in its own transaction (with its ledger entry when it has a ``key``)."""
        return await asyncio.to_thread(self._execute, built, timeout_s, key)


@dataclass(slots=True)
class PostgresBackend:
    """Tables in a PostgreSQL database, reached with ``asyncpg`` through a small pool opened on first use."""

    dsn: str
    """``postgresql://user@host:port/db`` (its password from the environment, never the model's context)."""
    dialect: Dialect = "postgres"
    max_connections: int = 5
    _pool: Any = field(default=None, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    _ledger: bool = field(default=False, repr=False)

    async def _connections(self) -> Any:
        async with self._lock:
            if self._pool is None:
                import asyncpg

                self._pool = await asyncpg.create_pool(self.dsn, min_size=0, max_size=self.max_connections)
            return self._pool

    async def close(self) -> None:
        """Close the pool."""
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def columns(self, table: str) -> tuple[str, ...]:
        """The table's columns in the search path, in order (empty: no such table)."""
        pool = await self._connections()
        rows = await pool.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_name = $1 "
            "AND table_schema = ANY (current_schemas(false)) ORDER BY ordinal_position",
            table,
        )
        return tuple(str(row[0]) for row in rows)

    async def _ensure_ledger(self, pool: Any) -> None:
        import asyncpg

        async with self._lock:
            if self._ledger:
                return
            try:
                await pool.execute(_POSTGRES_LEDGER)
            except asyncpg.UniqueViolationError:  # another worker created it at the same moment
                pass
            except asyncpg.PostgresError as err:
                raise ToolError(
                    f"PostgreSQL: the write ledger {LEDGER_TABLE} cannot be created ({err}): create it as in "
                    "docs/computer/tables.md, or let this role create tables",
                    error_class="permanent",
                ) from None
            self._ledger = True

    async def _run(self, built: Built, timeout_s: float, *, write: bool, key: str = "") -> Any:
        import asyncpg

        pool = await self._connections()
        if key:
            await self._ensure_ledger(pool)
        async with pool.acquire() as con:
            try:
                async with con.transaction(readonly=not write):
                    await con.execute(f"SET LOCAL statement_timeout = {max(1, int(timeout_s * 1000))}")
                    if write and key:
                        found = await con.fetchval(_POSTGRES_FIND, key)
                        if found is not None:
                            return int(found)
                    if write:
                        changed = _changed(await con.execute(built.sql, *built.params))
                        if key:  # a racing attempt with the key makes this one fail here, its write undone
                            await con.execute(_POSTGRES_PRUNE, float(LEDGER_TTL_S))
                            await con.execute(_POSTGRES_RECORD, key, changed)
                        return changed
                    stmt = await con.prepare(built.sql)
                    rows = await stmt.fetch(*built.params)
                    return [a.name for a in stmt.get_attributes()], [tuple(row.values()) for row in rows]
            except asyncpg.UniqueViolationError as err:
                recorded = await con.fetchval(_POSTGRES_FIND, key) if key else None
                if recorded is not None:
                    return int(recorded)
                raise ToolError(f"PostgreSQL: {err}", error_class="validation") from None
            except asyncpg.QueryCanceledError:
                raise _timed_out(timeout_s) from None
            except asyncpg.PostgresError as err:
                raise ToolError(f"PostgreSQL: {err}", error_class="validation") from None

    async def fetch(self, built: Built, *, timeout_s: float) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run a read in a read-only transaction."""
        columns, rows = await self._run(built, timeout_s, write=False)
        return columns, rows

    async def execute(self, built: Built, *, timeout_s: float, key: str = "") -> int:
        """Run a write in its own transaction (with its ledger entry when it has a ``key``)."""
        return int(await self._run(built, timeout_s, write=True, key=key))


def _changed(status: str) -> int:
    """The rows a command changed, from its status: ``INSERT 0 1`` → 1."""
    last = str(status).rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else 0
