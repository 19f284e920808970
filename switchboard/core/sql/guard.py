"""What a model's SQL may do: connections, the authoriser, limits and the time limit of one statement.

SQLite itself checks every statement at prepare time through an authoriser (:class:`Guard`), shared databases are
opened read-only besides, so the authoriser is not the only lock. A statement runs under a deadline enforced by a
progress handler, and under size limits.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from switchboard.core.sql.databases import SharedDatabase

__all__ = [
    "READ_PRAGMAS",
    "Guard",
    "GuardMode",
    "SqlLimits",
    "attach_shared",
    "deadline_handler",
    "limit",
    "quote_ident",
    "read_uri",
]

GuardMode = Literal["read", "write", "off"]

READ_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo", "foreign_key_list"}
)
"""``PRAGMA`` queries a statement may run (they only describe tables); every other pragma is refused."""
INTERNAL_PREFIX = "_switchboard"
"""Our own tables in the session database (descriptions, the write ledger): never the model's to change."""
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_sequence", "sqlite_stat1"})
"""SQLite writes these itself while it creates or drops a table; a statement cannot write them directly."""
_REFUSED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"})

_WRITES = {
    sqlite3.SQLITE_INSERT: "insert into",
    sqlite3.SQLITE_UPDATE: "update",
    sqlite3.SQLITE_DELETE: "delete from",
    sqlite3.SQLITE_CREATE_TABLE: "create table",
    sqlite3.SQLITE_CREATE_INDEX: "create an index on",
    sqlite3.SQLITE_CREATE_VIEW: "create view",
    sqlite3.SQLITE_DROP_TABLE: "drop table",
    sqlite3.SQLITE_DROP_INDEX: "drop an index of",
    sqlite3.SQLITE_DROP_VIEW: "drop view",
    sqlite3.SQLITE_REINDEX: "reindex",  # CREATE INDEX fills the new index this way
}
_TABLE_CHANGES = frozenset(
    {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE, sqlite3.SQLITE_ALTER_TABLE}
)
_NEVER = {
    sqlite3.SQLITE_ATTACH: "ATTACH is not allowed (the databases you may use are already attached)",
    sqlite3.SQLITE_DETACH: "DETACH is not allowed",
    sqlite3.SQLITE_TRANSACTION: "transactions are managed for you: each statement commits on its own",
    sqlite3.SQLITE_SAVEPOINT: "savepoints are not allowed: each statement commits on its own",
    sqlite3.SQLITE_CREATE_VTABLE: "virtual tables are not allowed",
    sqlite3.SQLITE_DROP_VTABLE: "virtual tables are not allowed",
    sqlite3.SQLITE_CREATE_TRIGGER: "triggers are not allowed",
    sqlite3.SQLITE_DROP_TRIGGER: "triggers are not allowed",
    sqlite3.SQLITE_CREATE_TEMP_TABLE: "temporary tables are not allowed: create a table in main",
    sqlite3.SQLITE_CREATE_TEMP_INDEX: "temporary objects are not allowed",
    sqlite3.SQLITE_CREATE_TEMP_VIEW: "temporary views are not allowed: create a view in main",
    sqlite3.SQLITE_CREATE_TEMP_TRIGGER: "triggers are not allowed",
    sqlite3.SQLITE_DROP_TEMP_TABLE: "temporary tables are not allowed",
    sqlite3.SQLITE_DROP_TEMP_INDEX: "temporary objects are not allowed",
    sqlite3.SQLITE_DROP_TEMP_VIEW: "temporary views are not allowed",
    sqlite3.SQLITE_DROP_TEMP_TRIGGER: "triggers are not allowed",
    sqlite3.SQLITE_ANALYZE: "ANALYZE is not allowed",
}


@dataclass(frozen=True, slots=True)
class SqlLimits:
    """Bounds of one ``sql`` call (and of one table loaded by ``read_document``)."""

    timeout_s: float = 5.0
    """Wall-clock limit of one statement, fetching its rows included; a progress handler interrupts it."""
    max_rows: int = 500
    """Most rows one call returns, whatever ``max_rows`` the model asks for."""
    max_chars: int = 12_000
    """Most characters of rows one call returns; the rows past it are counted, not shown."""
    cell_chars: int = 500
    """Longest text cell shown; longer ones keep their head and say how much was cut."""
    count_cap: int = 100_000
    """Rows past those shown are counted up to this many (``100000+ more rows``)."""
    max_value_bytes: int = 16 * 2**20
    """Longest string or blob a statement may build (``SQLITE_LIMIT_LENGTH``)."""
    max_statement_chars: int = 100_000
    """Longest statement (``SQLITE_LIMIT_SQL_LENGTH``)."""


@dataclass(slots=True)
class Guard:
    """The authoriser of one connection; :attr:`mode` says what passes, the rest records why something did not.

    Every statement the ``sql`` tool runs is checked by SQLite itself, at prepare time, through an authoriser
    callback (:class:`Guard`): in ``read`` mode only reads (``SELECT``, recursive CTEs, a few read-only ``PRAGMA``
    queries) pass; in ``write`` mode writes and schema changes pass too, but only on ``main`` (the session's own
    database), never on the shared databases and never on our own bookkeeping tables. ``ATTACH``/``DETACH``,
    transactions, savepoints, virtual tables, triggers, ``load_extension`` and every ``PRAGMA`` that sets something
    are refused in both modes. Shared databases are attached before the guard is installed, from ``mode=ro`` URIs,
    and read connections also set ``PRAGMA query_only``: the authoriser is not the only lock.
    """

    mode: GuardMode = "read"
    refusal: str | None = None
    """Why the last statement was refused (the first reason met)."""
    wants_write: bool = False
    """In ``read`` mode: the statement writes to ``main`` (run it again on the write path)."""
    touched: set[str] = field(default_factory=set)
    """Tables of ``main`` whose rows or columns the statement changes."""

    def reset(self, mode: GuardMode) -> None:
        """Start a new statement in ``mode``."""
        self.mode, self.refusal, self.wants_write = mode, None, False
        self.touched = set()

    def install(self, con: sqlite3.Connection) -> None:
        """Make this guard the connection's authoriser."""
        con.set_authorizer(self)

    def _deny(self, reason: str) -> int:
        if self.refusal is None:
            self.refusal = reason
        return sqlite3.SQLITE_DENY

    def __call__(self, action: int, arg1: str | None, arg2: str | None, db: str | None, _source: str | None) -> int:
        """SQLite's authoriser callback: ``SQLITE_OK`` or ``SQLITE_DENY`` for one action of the statement."""
        if self.mode == "off":
            return sqlite3.SQLITE_OK
        if action in _NEVER:
            return self._deny(_NEVER[action])
        if action in (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_RECURSIVE):
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_READ:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            name = (arg2 or "").lower()
            return self._deny(f"the function {name}() is not allowed") if name in _REFUSED_FUNCTIONS else 0
        if action == sqlite3.SQLITE_PRAGMA:
            name = (arg1 or "").lower()
            if name in READ_PRAGMAS:
                return sqlite3.SQLITE_OK
            return self._deny(f"PRAGMA {name} is not allowed (only {', '.join(sorted(READ_PRAGMAS))})")
        if action == sqlite3.SQLITE_ALTER_TABLE:
            return self._write("alter table", arg1, arg2 or "", action)
        if action in _WRITES:
            table = arg2 if action in (sqlite3.SQLITE_CREATE_INDEX, sqlite3.SQLITE_DROP_INDEX) else arg1
            return self._write(_WRITES[action], db, table or "", action)
        return self._deny(f"this statement is not allowed (SQLite action {action})")

    def _write(self, verb: str, db: str | None, table: str, action: int) -> int:
        schema = db or "main"
        if table.lower() in _SCHEMA_TABLES and schema in ("main", "temp"):
            return sqlite3.SQLITE_OK  # SQLite's own bookkeeping while it creates, alters or drops a table
        if schema == "temp":
            return self._deny("temporary objects are not allowed: create them in main")
        if schema != "main":
            return self._deny(f"{schema} is a read-only database: you cannot {verb} {schema}.{table}")
        if table.lower().startswith(INTERNAL_PREFIX):
            return self._deny(f"{table} is kept by Switchboard and cannot be changed")
        if self.mode == "read":
            self.wants_write = True
            return sqlite3.SQLITE_DENY
        if action in _TABLE_CHANGES:
            self.touched.add(table)
        return sqlite3.SQLITE_OK


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (any name the model gave a table is safe in a statement this way)."""
    return '"' + name.replace('"', '""') + '"'


def read_uri(path: Path) -> str:
    """A ``mode=ro`` URI for ``path`` (SQLite opens it read-only; it must exist)."""
    return f"file:{quote(str(path.resolve()))}?mode=ro"


def deadline_handler(con: sqlite3.Connection, timeout_s: float) -> None:
    """Interrupt whatever ``con`` runs after ``timeout_s`` from now (``sqlite3.OperationalError: interrupted``)."""
    deadline = time.monotonic() + timeout_s
    con.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 1000)


def limit(con: sqlite3.Connection, limits: SqlLimits) -> None:
    """The size limits and hardening every model-facing connection gets."""
    con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
    con.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, limits.max_statement_chars)
    con.execute("PRAGMA trusted_schema = OFF")  # views and defaults may not call functions with side effects
    con.execute("PRAGMA cache_size = -8192")  # 8 MiB of page cache at most


def attach_shared(con: sqlite3.Connection, databases: Mapping[str, SharedDatabase]) -> list[str]:
    """Attach each shared database read-only under its name; returns the names of those missing on disk."""
    missing = []
    for name, spec in databases.items():
        if not spec.path.is_file():
            missing.append(name)
            continue
        con.execute(f"ATTACH DATABASE ? AS {quote_ident(name)}", (read_uri(spec.path),))
    con.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, len(databases) - len(missing))
    return missing
