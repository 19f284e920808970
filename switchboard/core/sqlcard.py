"""The database card: every table an agent's ``sql`` tool reaches, its columns and what it means, in a few lines.

```
## Databases (query them with the sql tool; fetch only the rows you need)
main: this conversation's own database (writable)
- sales (1204 rows; from inbox/sales.csv): region TEXT, month TEXT, amount REAL
catalog (read-only): The product catalogue.
- catalog.products (100000+ rows): sku TEXT, name TEXT, price REAL — one row per product
```

The card is rebuilt when a database changes: it is cached by file (path, modification time, size), and a write
primes the cache with the new image as it saves it, so building a turn's prompt costs a ``stat`` per database.
Session tables loaded from a document, or created while untrusted content was in the turn's context, make the
card :attr:`DatabaseCard.untrusted` (their names and descriptions may carry an instruction from that content).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from switchboard.core.databases import SharedDatabase, is_identifier
from switchboard.core.sqlguard import deadline_handler, quote_ident, read_uri

__all__ = ["CARD_HEADING", "SESSION_DB", "DatabaseCard", "database_card", "describe_tables", "remember_card"]

logger = logging.getLogger(__name__)

CARD_HEADING = "## Databases (query them with the sql tool; fetch only the rows you need)"
MAX_CARD_CHARS = 6_000
COUNT_CAP = 100_000
COUNT_TIMEOUT_S = 0.25
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
        stat = path.stat()
    except OSError:
        return None
    return (str(path), stat.st_mtime_ns, stat.st_size)


def _count(con: sqlite3.Connection, schema: str, table: str) -> str:
    """Rows of ``table``, counted up to :data:`COUNT_CAP` within :data:`COUNT_TIMEOUT_S` (``?`` past it)."""
    deadline_handler(con, COUNT_TIMEOUT_S)  # a view over a large join must not hold the prompt up
    try:
        name = f"{quote_ident(schema)}.{quote_ident(table)}"
        found = con.execute(f"SELECT count(*) FROM (SELECT 1 FROM {name} LIMIT {COUNT_CAP + 1})")  # noqa: S608
        count = int(found.fetchone()[0])
    except sqlite3.Error:
        return "?"
    finally:
        con.set_progress_handler(None, 0)
    return f"{COUNT_CAP}+" if count > COUNT_CAP else str(count)


def _shown(name: str) -> str:
    """A name as the card shows it: plain identifiers as they are, anything else quoted on one line."""
    return name if is_identifier(name) else json.dumps(name, ensure_ascii=False)


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def describe_tables(
    con: sqlite3.Connection, schema: str, tables: Sequence[str], meanings: Mapping[str, str]
) -> list[str]:
    """One line per table: name, row count, columns with their declared types, and what it means."""
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
        lines.append(f"{shown} ({_count(con, schema, table)} rows): {cols}" + (f" — {meaning}" if meaning else ""))
    return lines


def _user_tables(con: sqlite3.Connection, schema: str) -> list[str]:
    rows = con.execute(
        f"SELECT name FROM {quote_ident(schema)}.sqlite_master WHERE type IN ('table', 'view') "  # noqa: S608 - quoted
        "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND name NOT LIKE '\\_switchboard%' ESCAPE '\\' ORDER BY name"
    )
    return [str(r[0]) for r in rows]


def _session_tables(con: sqlite3.Connection) -> list[_Table]:
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
        [line] = describe_tables(con, "main", [table], {table: meaning})
        found.append(_Table(line, untrusted))
    return found


def _shared_tables(con: sqlite3.Connection, name: str, spec: SharedDatabase) -> list[_Table]:
    return [_Table(line, False) for line in describe_tables(con, name, _user_tables(con, name), spec.tables)]


def remember_card(db: Path, con: sqlite3.Connection) -> None:
    """Prime the cache with the session database ``con`` holds, just saved to ``db`` (blocking)."""
    key = _key(db)
    if key is not None:
        _store(key, _session_tables(con))


def _store(key: tuple[str, int, int], tables: list[_Table]) -> None:
    with _cache_lock:
        if len(_cache) >= _CACHE_SIZE:
            _cache.clear()
        _cache[key] = tables


def _tables(path: Path, schema: str, spec: SharedDatabase | None) -> list[_Table] | None:
    """The tables of one database file, cached by its modification time and size (``None``: no file)."""
    key = _key(path)
    if key is None:
        return None
    with _cache_lock:
        found = _cache.get(key)
    if found is not None:
        return found
    try:
        con = sqlite3.connect(read_uri(path) if spec is None else ":memory:", uri=True)
        try:
            con.execute("PRAGMA trusted_schema = OFF")
            if spec is None:
                found = _session_tables(con)
            else:
                con.execute(f"ATTACH DATABASE ? AS {quote_ident(schema)}", (read_uri(path),))
                found = _shared_tables(con, schema, spec)
        finally:
            con.close()
    except sqlite3.Error as err:
        logger.warning("database %s could not be described: %s", schema, err)
        return None
    _store(key, found)
    return found


def database_card(workspace: Path, databases: Mapping[str, SharedDatabase]) -> DatabaseCard:
    """The card of the session database in ``workspace`` and of the agent's shared ``databases``."""
    lines = [CARD_HEADING, "main: this conversation's own database (writable; what you create or load stays here)"]
    session = _tables(workspace / SESSION_DB, "main", None) or []
    untrusted = any(t.untrusted for t in session)
    entries: list[str] = [f"- {t.line}" for t in session] or [
        "- (no tables yet: CREATE TABLE with sql, or load a CSV/XLSX with read_document(into_table=...))"
    ]
    for name, spec in databases.items():
        about = f"{name} (read-only)" + (f": {_one_line(spec.description)}" if spec.description.strip() else "")
        shared = _tables(spec.path, name, spec)
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
