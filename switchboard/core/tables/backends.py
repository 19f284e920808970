"""Where connected tables live: a SQLite file or a PostgreSQL database, behind one small async interface.

Each statement runs under a time limit (SQLite: a progress-handler deadline; PostgreSQL: ``statement_timeout`` in
its own transaction); a read-only table's statements run on a read-only connection or transaction, so the
permission check in :mod:`switchboard.core.tables.access` is not the only lock.
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from switchboard.core.sql.guard import deadline_handler, read_uri
from switchboard.core.tables.statements import Built, Dialect
from switchboard.errors import ToolError

__all__ = ["PostgresBackend", "SqliteBackend", "TableBackend"]


class TableBackend(Protocol):
    """A database holding connected tables."""

    dialect: Dialect

    async def columns(self, table: str) -> tuple[str, ...]:
        """The table's columns, in order (empty: no such table)."""
        ...

    async def fetch(self, built: Built, *, timeout_s: float) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run a read; its column names and rows (read-only)."""
        ...

    async def execute(self, built: Built, *, timeout_s: float) -> int:
        """Run a write in its own transaction; the number of rows it changed."""
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

    def _execute(self, built: Built, timeout_s: float) -> int:
        con = self._connect(write=True, timeout_s=timeout_s)
        try:
            con.execute("BEGIN IMMEDIATE")
            try:
                changed = con.execute(built.sql, built.params).rowcount
            except sqlite3.Error as err:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                if "interrupted" in str(err):
                    raise _timed_out(timeout_s) from None
                raise ToolError(f"SQLite: {err}", error_class="validation") from None
            con.execute("COMMIT")
            return max(changed, 0)
        finally:
            con.close()

    async def columns(self, table: str) -> tuple[str, ...]:
        """The table's columns, in order (empty: no such table)."""
        return await asyncio.to_thread(self._columns, table)

    async def fetch(self, built: Built, *, timeout_s: float) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run a read on a read-only connection."""
        return await asyncio.to_thread(self._fetch, built, timeout_s)

    async def execute(self, built: Built, *, timeout_s: float) -> int:
        """Run a write in its own transaction."""
        return await asyncio.to_thread(self._execute, built, timeout_s)


@dataclass(slots=True)
class PostgresBackend:
    """Tables in a PostgreSQL database, reached with ``asyncpg`` through a small pool opened on first use."""

    dsn: str
    """``postgresql://user@host:port/db`` (its password from the environment, never the model's context)."""
    dialect: Dialect = "postgres"
    max_connections: int = 5
    _pool: Any = field(default=None, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

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

    async def _run(self, built: Built, timeout_s: float, *, write: bool) -> Any:
        import asyncpg

        pool = await self._connections()
        async with pool.acquire() as con:
            try:
                async with con.transaction(readonly=not write):
                    await con.execute(f"SET LOCAL statement_timeout = {max(1, int(timeout_s * 1000))}")
                    if write:
                        return await con.execute(built.sql, *built.params)
                    stmt = await con.prepare(built.sql)
                    rows = await stmt.fetch(*built.params)
                    return [a.name for a in stmt.get_attributes()], [tuple(row.values()) for row in rows]
            except asyncpg.QueryCanceledError:
                raise _timed_out(timeout_s) from None
            except asyncpg.PostgresError as err:
                raise ToolError(f"PostgreSQL: {err}", error_class="validation") from None

    async def fetch(self, built: Built, *, timeout_s: float) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run a read in a read-only transaction."""
        columns, rows = await self._run(built, timeout_s, write=False)
        return columns, rows

    async def execute(self, built: Built, *, timeout_s: float) -> int:
        """Run a write in its own transaction; ``INSERT 0 1`` → 1."""
        status = str(await self._run(built, timeout_s, write=True))
        last = status.rsplit(" ", 1)[-1]
        return int(last) if last.isdigit() else 0
