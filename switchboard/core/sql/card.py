"""The database card: every table an agent's ``sql`` tool reaches, its columns and what it means, in a few lines.

The card is cached by file (path, modification time, size) and primed by each write, so a turn's prompt costs a
``stat`` per database. The session database is read only when it is a regular file (never through a symlink or a
FIFO), row counts share one time budget per card, and tables made from untrusted content make the card
:attr:`DatabaseCard.untrusted` (their names may carry an instruction). An example is on :func:`database_card`.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import stat
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from switchboard.core.sql.databases import SharedDatabase, is_identifier
from switchboard.core.sql.guard import deadline_handler, quote_ident, read_uri
from switchboard.core.workspaces.safepaths import entry_stat, read_bytes

__all__ = [
    "CARD_HEADING",
    "SESSION_DB",
    "CountBudget",
    "DatabaseCard",
    "database_card",
    "describe_tables",
    "remember_card",
    "session_image",
]

logger = logging.getLogger(__name__)

CARD_HEADING = "## Databases (query them with the sql tool; fetch only the rows you need)"
MAX_CARD_CHARS = 6_000
COUNT_CAP = 100_000
COUNT_TIMEOUT_S = 0.25
CARD_BUDGET_S = 1.0
"""Most seconds one card (or one description of tables) may spend counting rows, all tables together."""
SESSION_DB = "data.sqlite"
"""The session database's file name, at the root of the workspace."""
_CACHE_SIZE = 256


@dataclass(frozen=True, slots=True)
class _Table:
    line: str
    untrusted: bool


@dataclass(frozen=True, slots=True)
class DatabaseCard:
    """The card's text and whether it shows untrusted names."""

    text: str
    untrusted: bool = False


_cache: dict[tuple[str, int, int], list[_Table]] = {}
_cache_lock = threading.Lock()


def _key(path: Path) -> tuple[str, int, int] | None:
    try:
        found = path.stat()
    except OSError:
        return None
    return (str(path), found.st_mtime_ns, found.st_size)


def _session_key(workspace: Path) -> tuple[str, int, int] | None:
    """The cache key of the session database: ``None`` unless it is a regular file (a link is never followed)."""
    try:
        found = entry_stat(workspace, (SESSION_DB,))
    except OSError:
        return None
    if found is None or not stat.S_ISREG(found.st_mode):
        return None
    return (str(workspace / SESSION_DB), found.st_mtime_ns, found.st_size)


def session_image(workspace: Path) -> bytes | None:
    """The bytes of the session database, ``None`` when there is none.

    It is opened below the workspace without following a symlink and without blocking (a FIFO, a socket or a
    device is refused), so it is this session's own file whatever a command left there.

    Raises:
        UnsafePathError: ``data.sqlite`` is a symlink or not a regular file.
    """
    try:
        return read_bytes(workspace, (SESSION_DB,))
    except FileNotFoundError:
        return None


class CountBudget:
    """Seconds left for counting rows: a count that ran to its deadline spends its whole grant."""

    def __init__(self, seconds: float = CARD_BUDGET_S) -> None:
        """Start with ``seconds`` to spend."""
        self.left = seconds

    def count(self, con: sqlite3.Connection, schema: str, table: str) -> str:
        """Rows of ``table``, counted up to :data:`COUNT_CAP` within what is left (``?`` past it, or when spent)."""
        grant = min(COUNT_TIMEOUT_S, self.left)
        if grant <= 0:
            return "?"
        started = time.monotonic()
        deadline_handler(con, grant)  # a view over a large join must not hold the prompt up
        try:
            name = f"{quote_ident(schema)}.{quote_ident(table)}"
            found = con.execute(f"SELECT count(*) FROM (SELECT 1 FROM {name} LIMIT {COUNT_CAP + 1})")  # noqa: S608
            count = int(found.fetchone()[0])
        except sqlite3.Error:
            self.left -= grant
            return "?"
        finally:
            con.set_progress_handler(None, 0)
        self.left -= min(grant, time.monotonic() - started)
        return f"{COUNT_CAP}+" if count > COUNT_CAP else str(count)


def _shown(name: str) -> str:
    """A name as the card shows it: plain identifiers as they are, anything else quoted on one line."""
    return name if is_identifier(name) else json.dumps(name, ensure_ascii=False)


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def describe_tables(
    con: sqlite3.Connection,
    schema: str,
    tables: Sequence[str],
    meanings: Mapping[str, str],
    budget: CountBudget | None = None,
) -> list[str]:
    """One line per table: name, row count, columns with their declared types, and what it means.

    Row counts share ``budget`` (default: a fresh :data:`CARD_BUDGET_S`); past it they show ``?``.
    """
    budget = budget or CountBudget()
    lines = []
    for table in tables:
        try:
            columns = con.execute(f"PRAGMA {quote_ident(schema)}.table_info({quote_ident(table)})").fetchall()
        except sqlite3.Error as err:  # a view over a table that is gone
            lines.append(f"{_shown(table)}: unusable ({err})")
            continue
        cols = ", ".join(f"{_shown(str(c[1]))} {_one_line(str(c[2] or 'ANY'), 40)}" for c in columns)
        shown = _shown(table) if schema == "main" else f"{schema}.{_shown(table)}"
        meaning = _one_line(meanings.get(table, ""))
        lines.append(
            f"{shown} ({budget.count(con, schema, table)} rows): {cols}" + (f" — {meaning}" if meaning else "")
        )
    return lines


def _user_tables(con: sqlite3.Connection, schema: str) -> list[str]:
    rows = con.execute(
        f"SELECT name FROM {quote_ident(schema)}.sqlite_master WHERE type IN ('table', 'view') "  # noqa: S608 - quoted
        "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND name NOT LIKE '\\_switchboard%' ESCAPE '\\' ORDER BY name"
    )
    return [str(r[0]) for r in rows]


def _session_tables(con: sqlite3.Connection, budget: CountBudget | None = None) -> list[_Table]:
    budget = budget or CountBudget()
    meta: dict[str, tuple[str, str, bool]] = {}
    if con.execute("SELECT 1 FROM main.sqlite_master WHERE name = '_switchboard_tables'").fetchone() is not None:
        for name, description, source, untrusted in con.execute(
            "SELECT name, description, source, untrusted FROM main._switchboard_tables"
        ):
            meta[str(name)] = (str(description), str(source), bool(untrusted))
    found = []
    for table in _user_tables(con, "main"):
        description, source, untrusted = meta.get(table, ("", "", True))  # made elsewhere (the shell): untrusted
        meaning = "; ".join(p for p in (description, f"from {source}" if source not in ("", "sql") else "") if p)
        [line] = describe_tables(con, "main", [table], {table: meaning}, budget)
        found.append(_Table(line, untrusted))
    return found


def _shared_tables(con: sqlite3.Connection, name: str, spec: SharedDatabase, budget: CountBudget) -> list[_Table]:
    return [_Table(line, False) for line in describe_tables(con, name, _user_tables(con, name), spec.tables, budget)]


def remember_card(workspace: Path, con: sqlite3.Connection) -> None:
    """Prime the cache with the session database ``con`` holds, just saved in ``workspace`` (blocking)."""
    key = _session_key(workspace)
    if key is not None:
        _store(key, _session_tables(con))


def _store(key: tuple[str, int, int], tables: list[_Table]) -> None:
    with _cache_lock:
        if len(_cache) >= _CACHE_SIZE:
            _cache.clear()
        _cache[key] = tables


def _tables(path: Path, schema: str, spec: SharedDatabase | None, budget: CountBudget) -> list[_Table] | None:
    """The tables of one database file, cached by its modification time and size (``None``: no file).

    ``path`` is the workspace for the session database (``spec`` ``None``), read as :func:`session_image` does.
    """
    key = _key(path) if spec is not None else _session_key(path)
    if key is None:
        return None
    with _cache_lock:
        found = _cache.get(key)
    if found is not None:
        return found
    try:
        image = session_image(path) if spec is None else None
        con = sqlite3.connect(":memory:")
        try:
            con.execute("PRAGMA trusted_schema = OFF")
            if spec is None:
                if image is None:
                    return None
                con.deserialize(image)
                found = _session_tables(con, budget)
            else:
                con.execute(f"ATTACH DATABASE ? AS {quote_ident(schema)}", (read_uri(path),))
                found = _shared_tables(con, schema, spec, budget)
        finally:
            con.close()
    except (sqlite3.Error, OSError) as err:
        logger.warning("database %s could not be described: %s", schema, err)
        return None
    _store(key, found)
    return found


def database_card(workspace: Path, databases: Mapping[str, SharedDatabase]) -> DatabaseCard:
    """The card of the session database in ``workspace`` and of the agent's shared ``databases``.

    ```
    ## Databases (query them with the sql tool; fetch only the rows you need)
    main: this conversation's own database (writable)
    - sales (1204 rows; from inbox/sales.csv): region TEXT, month TEXT, amount REAL
    catalog (read-only): The product catalogue.
    - catalog.products (100000+ rows): sku TEXT, name TEXT, price REAL — one row per product
    ```
    """
    lines = [CARD_HEADING, "main: this conversation's own database (writable; what you create or load stays here)"]
    budget = CountBudget()
    session = _tables(workspace, "main", None, budget) or []
    untrusted = any(t.untrusted for t in session)
    entries: list[str] = [f"- {t.line}" for t in session] or [
        "- (no tables yet: CREATE TABLE with sql, or load a CSV/XLSX with read_document(into_table=...))"
    ]
    for name, spec in databases.items():
        about = f"{name} (read-only)" + (f": {_one_line(spec.description)}" if spec.description.strip() else "")
        shared = _tables(spec.path, name, spec, budget)
        entries.append(about if shared is not None else f"{about} — unavailable (the file is missing or unreadable)")
        entries += [f"- {t.line}" for t in shared or []]
    used = sum(len(line) + 1 for line in lines)
    for index, entry in enumerate(entries):
        if used + len(entry) + 1 > MAX_CARD_CHARS:
            left = len(entries) - index
            lines.append(f"… {left} more lines not shown: list the tables of a database from <db>.sqlite_master")
            break
        lines.append(entry)
        used += len(entry) + 1
    return DatabaseCard(text="\n".join(lines), untrusted=untrusted)
