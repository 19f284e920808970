"""The session database: a SQLite file in the session workspace, queried and changed one statement at a time.

Each session has ``data.sqlite`` at the root of its workspace (it travels with the workspace), with the agent's shared
databases attached read-only. Reads use a read-only connection; a write runs on an in-memory copy in one transaction
with its idempotency record and is written back through :meth:`Workspaces.store`, so quotas apply, a crash leaves the
old file, and a re-run turn gets the recorded outcome instead of inserting its rows twice. Results are capped and
what was left out is counted.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from switchboard.core.sql.card import (
    SESSION_DB,
    DatabaseCard,
    database_card,
    describe_tables,
    remember_card,
    session_image,
)
from switchboard.core.sql.databases import SharedDatabase
from switchboard.core.sql.guard import Guard, SqlLimits, attach_shared, deadline_handler, limit, quote_ident, read_uri
from switchboard.core.workspaces.disk import Workspaces
from switchboard.core.workspaces.safepaths import UnsafePathError
from switchboard.errors import ToolError

__all__ = ["SESSION_DB", "DatabaseCard", "Statement", "adopt_table", "database_card", "run_statement"]

EFFECT_TTL_S = 8 * 24 * 3600
_META = (
    "CREATE TABLE IF NOT EXISTS _switchboard_tables (name TEXT PRIMARY KEY, description TEXT NOT NULL DEFAULT '', "
    "source TEXT NOT NULL DEFAULT '', untrusted INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS _switchboard_effects (key TEXT PRIMARY KEY, at REAL NOT NULL, outcome TEXT NOT NULL)",
)
_LOCKS: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()
_LOCKS_GUARD = threading.Lock()


@dataclass(frozen=True, slots=True)
class Statement:
    """One ``sql`` call, as the store needs it."""

    sql: str
    max_rows: int = 50
    description: str | None = None
    """What a table the statement creates holds."""
    key: str = ""
    """The call's idempotency key (empty: no ledger)."""
    untrusted: bool = False
    """Untrusted content was in the turn's context: tables it creates are marked (see :func:`database_card`)."""


def _lock(path: Path) -> threading.Lock:
    with _LOCKS_GUARD:
        found = _LOCKS.get(str(path))
        if found is None:
            found = threading.Lock()
            _LOCKS[str(path)] = found
        return found


def _refused(guard: Guard, err: sqlite3.Error, limits: SqlLimits) -> ToolError:
    text = str(err)
    if guard.refusal is not None:
        return ToolError(f"not allowed: {guard.refusal}", error_class="validation")
    if "interrupted" in text:
        return ToolError(
            f"the statement ran past the {limits.timeout_s:g}s limit and was stopped: narrow it "
            "(WHERE, LIMIT, fewer joins) or aggregate",
            error_class="permanent",
        )
    if isinstance(err, sqlite3.ProgrammingError) and "one statement" in text:
        return ToolError("one statement per call: send the next one in another call", error_class="validation")
    if "database or disk is full" in text:
        return ToolError("the session database is full (its workspace quota): delete rows or tables first")
    return ToolError(f"SQLite: {text}", error_class="validation")


def _cell(value: Any, limits: SqlLimits) -> Any:
    if isinstance(value, bytes):
        return f"<blob of {len(value)} bytes>"
    if isinstance(value, str) and len(value) > limits.cell_chars:
        return value[: limits.cell_chars] + f"… [{len(value) - limits.cell_chars} chars cut]"
    return value


def _rows(cursor: sqlite3.Cursor, max_rows: int, limits: SqlLimits) -> dict[str, Any]:
    """The rows of ``cursor``: at most ``max_rows`` and ``limits.max_chars``, the rest counted."""
    if cursor.description is None:
        return {}
    columns = [d[0] for d in cursor.description]
    shown: list[list[Any]] = []
    chars = len(json.dumps(columns))
    more = 0
    capped = False
    for row in cursor:
        if len(shown) < max_rows:
            cells = [_cell(v, limits) for v in row]
            size = len(json.dumps(cells, ensure_ascii=False, default=str)) + 1
            if chars + size <= limits.max_chars or not shown:
                shown.append(cells)
                chars += size
                continue
            max_rows = len(shown)  # full: count the rest
        more += 1
        if more >= limits.count_cap:
            capped = True
            break
    found: dict[str, Any] = {"columns": columns, "rows": shown, "row_count": len(shown) + more}
    if more:
        plus = "+" if capped else ""
        found["row_count"] = f"{len(shown) + more}+" if capped else len(shown) + more
        found["more"] = (
            f"{more}{plus} more rows not shown: narrow the query (WHERE, LIMIT/OFFSET) or aggregate (COUNT, GROUP BY)"
        )
    return found


def _session_bytes(workspace: Path) -> bytes | None:
    """The session database's bytes (``None``: none yet), never through a symlink nor from a FIFO.

    A symlink or a special file named :data:`SESSION_DB` (a command may leave one) is never read nor followed: it
    counts as no database, and the next write puts a new database in its place.
    """
    try:
        return session_image(workspace)
    except UnsafePathError:
        return None
    except OSError as exc:
        raise ToolError(f"{SESSION_DB} could not be read: {exc.strerror or type(exc).__name__}") from None


def _read_connection(workspace: Path, shared: Mapping[str, SharedDatabase], limits: SqlLimits) -> sqlite3.Connection:
    """The session database, loaded into memory read-only (empty if there is none), with the shared ones attached.

    Its bytes are read through one verified descriptor (:func:`session_image`), never reopened by name.
    """

    def read_only(con: sqlite3.Connection) -> None:
        attach_shared(con, shared)
        con.execute("PRAGMA query_only = 1")

    return _loaded(workspace, limits, read_only)


def _memory_image(
    workspace: Path, shared: Mapping[str, SharedDatabase], limits: SqlLimits, quota: int
) -> sqlite3.Connection:
    """The session database loaded into memory (empty if there is none), growing to ``quota`` bytes at most."""

    def writable(con: sqlite3.Connection) -> None:
        page = int(con.execute("PRAGMA page_size").fetchone()[0])
        con.execute(f"PRAGMA max_page_count = {max(16, quota // page + 1)}")
        for statement in _META:
            con.execute(statement)
        attach_shared(con, shared)

    return _loaded(workspace, limits, writable)


def _loaded(workspace: Path, limits: SqlLimits, prepare: Callable[[sqlite3.Connection], None]) -> sqlite3.Connection:
    """The session database loaded into memory under ``limits``, then ``prepare``d; closed if it is not usable.

    Raises:
        ToolError: the workspace's database is damaged (``permanent``).
    """
    image = _session_bytes(workspace)
    con = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    try:
        if image is not None:
            con.deserialize(image)
        limit(con, limits)
        prepare(con)
    except sqlite3.DatabaseError as err:
        con.close()
        raise _unreadable(err) from None
    return con


def _unreadable(err: sqlite3.DatabaseError) -> ToolError:
    return ToolError(
        f"{SESSION_DB} in your workspace is not a usable SQLite database ({err}): rename or delete it",
        error_class="permanent",
    )


def run_statement(
    workspace: Path,
    statement: Statement,
    shared: Mapping[str, SharedDatabase],
    workspaces: Workspaces,
    limits: SqlLimits,
) -> dict[str, Any]:
    """Run one statement (blocking: call it from a tool thread); returns what the model is shown.

    Raises:
        ToolError: ``validation`` for a refused or malformed statement, ``permanent`` past the time limit or a quota.
    """
    guard = Guard()
    con = _read_connection(workspace, shared, limits)
    try:
        guard.install(con)
        deadline_handler(con, limits.timeout_s)
        try:
            cursor = con.execute(statement.sql)
            return {"statement": "read", **_rows(cursor, statement.max_rows, limits)}
        except sqlite3.Error as err:
            if not (guard.wants_write and guard.refusal is None):
                raise _refused(guard, err, limits) from None
    finally:
        con.close()
    return _write(workspace, statement, shared, workspaces, limits)


def _write(
    workspace: Path,
    statement: Statement,
    shared: Mapping[str, SharedDatabase],
    workspaces: Workspaces,
    limits: SqlLimits,
) -> dict[str, Any]:
    db = workspace / SESSION_DB
    with _lock(db):
        con = _memory_image(workspace, shared, limits, workspaces.quotas.session_bytes)
        try:
            recorded = _recorded(con, statement.key)
            if recorded is not None:
                return {**recorded, "already_done": "this exact write already ran in this turn; not repeated"}
            guard = Guard(mode="off")
            guard.install(con)
            before = _names(con)
            con.execute("BEGIN")
            guard.reset("write")
            deadline_handler(con, limits.timeout_s)
            try:
                cursor = con.execute(statement.sql)
                found = _rows(cursor, statement.max_rows, limits)
            except sqlite3.Error as err:
                guard.reset("off")
                if con.in_transaction:  # an interrupted statement has rolled it back already
                    con.execute("ROLLBACK")
                raise _refused(guard, err, limits) from None
            changed = cursor.rowcount
            touched = set(guard.touched)
            guard.reset("off")
            con.set_progress_handler(None, 0)
            after = _names(con)
            created, dropped = after - before, before - after
            if len(created) == 1 and len(dropped) == 1:  # ALTER TABLE … RENAME TO: its description moves with it
                con.execute("UPDATE _switchboard_tables SET name = ? WHERE name = ?", (*created, *dropped))
            else:
                _describe_created(con, created, statement)
                con.executemany("DELETE FROM _switchboard_tables WHERE name = ?", [(n,) for n in dropped])
            live = sorted((touched & after) | created)
            outcome: dict[str, Any] = {"statement": "write", "changed_rows": max(changed, 0), **found}
            if live:
                outcome["tables"] = describe_tables(con, "main", live, {})
            if dropped:
                outcome["gone"] = sorted(dropped)
            _record(con, statement.key, outcome)
            con.execute("COMMIT")
            _save(con, workspace, workspaces)
            return outcome
        finally:
            con.close()


def _names(con: sqlite3.Connection) -> set[str]:
    """The tables and views of ``main``, ours left out."""
    rows = con.execute("SELECT name FROM main.sqlite_master WHERE type IN ('table', 'view')")
    return {str(name) for (name,) in rows if not str(name).startswith(("sqlite_", "_switchboard"))}


def _exists(con: sqlite3.Connection, table: str) -> bool:
    found = con.execute("SELECT 1 FROM main.sqlite_master WHERE name = ? AND type IN ('table', 'view')", (table,))
    return found.fetchone() is not None


def _describe_created(con: sqlite3.Connection, created: set[str], statement: Statement) -> None:
    for name in created:
        con.execute(
            "INSERT INTO _switchboard_tables (name, description, source, untrusted) VALUES (?, ?, 'sql', ?) "
            "ON CONFLICT(name) DO UPDATE SET description = excluded.description, source = 'sql', "
            "untrusted = excluded.untrusted",
            (name, (statement.description or "").strip(), int(statement.untrusted)),
        )


def _recorded(con: sqlite3.Connection, key: str) -> dict[str, Any] | None:
    if not key:
        return None
    row = con.execute("SELECT outcome FROM _switchboard_effects WHERE key = ?", (key,)).fetchone()
    if row is None:
        return None
    found: dict[str, Any] = json.loads(row[0])
    return found


def _record(con: sqlite3.Connection, key: str, outcome: dict[str, Any]) -> None:
    if not key:
        return
    now = time.time()
    con.execute("DELETE FROM _switchboard_effects WHERE at < ?", (now - EFFECT_TTL_S,))
    con.execute(
        "INSERT OR REPLACE INTO _switchboard_effects (key, at, outcome) VALUES (?, ?, ?)",
        (key, now, json.dumps(outcome, ensure_ascii=False, default=str)),
    )


def _save(con: sqlite3.Connection, workspace: Path, workspaces: Workspaces) -> None:
    """Write the new image through the workspace quotas, and prime the card cache with it."""
    for (name,) in con.execute("SELECT name FROM pragma_database_list WHERE name NOT IN ('main', 'temp')").fetchall():
        con.execute(f"DETACH DATABASE {quote_ident(str(name))}")
    image = con.serialize()
    workspaces.store(workspace, workspace / SESSION_DB, image, shown=SESSION_DB)
    remember_card(workspace, con)


def adopt_table(
    workspace: Path,
    loaded: Path,
    table: str,
    *,
    source: str,
    replace: bool,
    key: str,
    outcome: dict[str, Any],
    workspaces: Workspaces,
    limits: SqlLimits,
) -> dict[str, Any]:
    """Copy ``table`` from the SQLite file ``loaded`` into the session database (blocking); returns ``outcome``.

    ``outcome`` (what the model is told) is recorded under ``key`` in the same transaction: a re-run of the turn
    gets it back instead of loading again. The table is marked untrusted (its names and rows come from a document).

    Raises:
        ToolError: the table exists and ``replace`` is false (``validation``), or a quota refused the write.
    """
    db = workspace / SESSION_DB
    with _lock(db):
        con = _memory_image(workspace, {}, limits, workspaces.quotas.session_bytes)
        try:
            recorded = _recorded(con, key)
            if recorded is not None:
                return recorded
            if _exists(con, table) and not replace:
                raise ToolError(
                    f"the session database already has a table {table!r}: choose another into_table, pass "
                    "replace_table=true, or DROP it with the sql tool",
                    error_class="validation",
                )
            con.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 1)
            con.execute("ATTACH DATABASE ? AS loaded", (read_uri(loaded),))
            ddl = con.execute("SELECT sql FROM loaded.sqlite_master WHERE name = ?", (table,)).fetchone()
            if ddl is None:
                raise ToolError("the document held no table to load", error_class="permanent")
            con.execute("BEGIN")
            try:
                con.execute(f"DROP TABLE IF EXISTS main.{quote_ident(table)}")
                con.execute(str(ddl[0]))  # our own CREATE TABLE "name" (...) from the loader
                copy = f"INSERT INTO main.{quote_ident(table)} SELECT * FROM loaded.{quote_ident(table)}"  # noqa: S608
                con.execute(copy)
                con.execute(
                    "INSERT OR REPLACE INTO _switchboard_tables (name, description, source, untrusted) "
                    "VALUES (?, '', ?, 1)",
                    (table, source),
                )
                _record(con, key, outcome)
            except sqlite3.Error as err:
                if con.in_transaction:  # an interrupted statement has rolled it back already
                    con.execute("ROLLBACK")
                if "database or disk is full" in str(err):
                    raise ToolError("the table does not fit in the session workspace's quota") from None
                raise
            con.execute("COMMIT")
            con.execute("DETACH DATABASE loaded")
            _save(con, workspace, workspaces)
            return outcome
        finally:
            con.close()
