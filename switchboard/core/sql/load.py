"""Loading a CSV or XLSX into a SQLite table: runs in a sandbox child, like the document parsers.

:func:`load` reads the document twice, as a stream: once to name the columns (from the header row, sanitised
to plain identifiers) and infer their types over every row (``INTEGER``, ``REAL``, ``TEXT``; dates become ISO
text; booleans 0/1; a number with a leading zero stays text), once to insert the rows in batches into a new
SQLite file that holds only that table. The worker then copies the table into the session database under the
workspace quotas (:func:`switchboard.core.sql.store.adopt_table`); the child itself may only write that one file,
up to the size the quota leaves (``RLIMIT_FSIZE``).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from switchboard.core.sql.guard import quote_ident
from switchboard.core.tools.parsers import MAX_COLUMNS, MAX_UNZIPPED_BYTES, csv_dialect
from switchboard.core.tools.parsers import _check_zip as check_zip  # the same zip-bomb check as read_document
from switchboard.core.tools.parsers import _decode as decode
from switchboard.core.workspaces.safepaths import read_bytes
from switchboard.errors import ToolError

__all__ = ["BATCH_ROWS", "load", "sanitise_names"]

BATCH_ROWS = 1000
"""Rows inserted per batch."""
SAMPLE_ROWS = 3
_RESERVED = frozenset(
    [
        "abort",
        "add",
        "all",
        "alter",
        "and",
        "as",
        "asc",
        "between",
        "by",
        "case",
        "check",
        "collate",
        "column",
        "constraint",
        "create",
        "cross",
        "current",
        "default",
        "delete",
        "desc",
        "distinct",
        "drop",
        "else",
        "end",
        "escape",
        "except",
        "exists",
        "filter",
        "from",
        "full",
        "glob",
        "group",
        "having",
        "in",
        "index",
        "inner",
        "insert",
        "intersect",
        "into",
        "is",
        "isnull",
        "join",
        "key",
        "left",
        "like",
        "limit",
        "match",
        "natural",
        "not",
        "notnull",
        "null",
        "of",
        "offset",
        "on",
        "or",
        "order",
        "outer",
        "primary",
        "references",
        "regexp",
        "replace",
        "right",
        "rowid",
        "select",
        "set",
        "table",
        "then",
        "to",
        "union",
        "unique",
        "update",
        "using",
        "values",
        "when",
        "where",
        "window",
        "with",
    ]
)
_NON_WORD = re.compile(r"[^0-9a-z]+")
_INT = re.compile(r"^[+-]?(0|[1-9][0-9]{0,17})$")


def sanitise_names(header: Sequence[Any]) -> list[str]:
    """Column names from a header row: lower-case letters, digits and ``_``; never empty, reserved or repeated."""
    names: list[str] = []
    seen: set[str] = set()
    for index, raw in enumerate(header, start=1):
        name = _NON_WORD.sub("_", str(raw if raw is not None else "").strip().lower()).strip("_")[:60]
        if not name:
            name = f"column_{index}"
        elif name[0].isdigit():
            name = f"c_{name}"
        if name in _RESERVED or name.startswith(("sqlite_", "_switchboard")):
            name = f"{name}_"
        base, suffix = name, 2
        while name in seen:
            name, suffix = f"{base}_{suffix}", suffix + 1
        seen.add(name)
        names.append(name)
    return names


def _kind(value: Any) -> str:
    if value is None or value == "":
        return "empty"
    if isinstance(value, bool):
        return "int"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float | Decimal):
        return "float"
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return "text"
    text = str(value).strip()
    if _INT.match(text):
        return "int"
    try:
        float(text)
    except ValueError:
        return "text"
    return "float" if not text.lstrip("+-").startswith("0") or text.lstrip("+-").startswith("0.") else "text"


def _type(kinds: set[str]) -> str:
    kinds = kinds - {"empty"}
    if not kinds or "text" in kinds:
        return "TEXT"
    return "INTEGER" if kinds == {"int"} else "REAL"


def _value(value: Any, kind: str) -> Any:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if kind == "TEXT":
        return value if isinstance(value, str) else str(value)
    if isinstance(value, int | float):
        return value
    text = str(value).strip()
    return int(text) if kind == "INTEGER" else float(text)


def _nonblank(rows: Iterable[Sequence[Any]]) -> Iterator[Sequence[Any]]:
    for row in rows:
        if any(cell not in (None, "") for cell in row):
            yield row


def _csv_rows(target: Path, suffix: str) -> Callable[[], Iterator[Sequence[Any]]]:
    text = decode(read_bytes(Path(), target.parts))  # from the workspace (cwd), no link followed
    dialect = csv_dialect(text, suffix)
    return lambda: _nonblank(csv.reader(io.StringIO(text, newline=""), dialect))


def _xlsx_rows(target: Path, sheet: str | None, unzipped: int) -> tuple[Callable[[], Iterator[Sequence[Any]]], Any]:
    import openpyxl

    check_zip(target, unzipped)
    workbook = openpyxl.load_workbook(target, read_only=True, data_only=True)
    names = list(workbook.sheetnames)
    if sheet is not None and sheet not in names:
        workbook.close()
        raise ToolError(f"no sheet {sheet!r}; the sheets are {names}", error_class="validation")
    worksheet = workbook[sheet if sheet is not None else names[0]]
    width = min(worksheet.max_column or MAX_COLUMNS, MAX_COLUMNS)
    return lambda: _nonblank(worksheet.iter_rows(max_col=width, values_only=True)), workbook


def _fill(out: Path, table: str, rows: Callable[[], Iterator[Sequence[Any]]]) -> dict[str, Any]:
    first = rows()
    header = next(first, None)
    if header is None:
        raise ToolError("the document has no rows to load", error_class="validation")
    width = min(max(i for i, cell in enumerate(header, start=1) if cell not in (None, "")), MAX_COLUMNS)
    names = sanitise_names(list(header)[:width])
    kinds: list[set[str]] = [set() for _ in names]
    for row in first:
        for index, cell in enumerate(list(row)[:width]):
            kinds[index].add(_kind(cell))
    types = [_type(k) for k in kinds]
    con = sqlite3.connect(out, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode = OFF")
        con.execute("PRAGMA synchronous = OFF")
        columns = ", ".join(f"{quote_ident(n)} {t}" for n, t in zip(names, types, strict=True))
        con.execute(f"CREATE TABLE {quote_ident(table)} ({columns})")
        insert = f"INSERT INTO {quote_ident(table)} VALUES ({', '.join('?' * len(names))})"  # noqa: S608 - quoted
        second = rows()
        next(second)  # the header
        count = 0
        sample: list[list[Any]] = []
        batch: list[list[Any]] = []
        con.execute("BEGIN")
        for row in second:
            cells = list(row)[:width]
            values = [_value(cells[i] if i < len(cells) else None, types[i]) for i in range(width)]
            batch.append(values)
            if len(sample) < SAMPLE_ROWS:
                sample.append(values)
            if len(batch) >= BATCH_ROWS:
                con.executemany(insert, batch)
                count, batch = count + len(batch), []
        con.executemany(insert, batch)
        con.execute("COMMIT")
        count += len(batch)
    finally:
        con.close()
    headers = [str(h) if h is not None else "" for h in list(header)[:width]]
    described = [
        {"name": n, "type": t, **({"header": h} if h != n else {})}
        for n, t, h in zip(names, types, headers, strict=True)
    ]
    return {"table": table, "rows": count, "columns": described, "sample": sample}


def load(request: dict[str, Any]) -> dict[str, Any]:
    """The child's entry point: one document in, one new SQLite file holding one table out.

    The request holds ``path`` (relative to the workspace), ``suffix``, ``table``, ``out`` (the new SQLite file),
    ``sheet`` and ``max_unzipped_bytes``. Returns ``{"result": {...}}`` or ``{"error": ..., "error_class": ...}``.
    """
    target, suffix = Path(request["path"]), str(request["suffix"])
    workbook: Any = None
    try:
        if suffix in {".csv", ".tsv"}:
            rows = _csv_rows(target, suffix)
        elif suffix in {".xlsx", ".xlsm"}:
            unzipped = int(request.get("max_unzipped_bytes") or MAX_UNZIPPED_BYTES)
            rows, workbook = _xlsx_rows(target, request.get("sheet"), unzipped)
        else:
            raise ToolError("only CSV, TSV and XLSX documents load into a table", error_class="validation")
        return {"result": _fill(Path(request["out"]), str(request["table"]), rows)}
    except ToolError as exc:
        return {"error": str(exc), "error_class": exc.error_class}
    except MemoryError:
        raise
    except (sqlite3.Error, OSError) as exc:
        if (
            any(s in str(exc) for s in ("disk is full", "File too large", "disk I/O error"))
            or getattr(exc, "errno", None) == 27
        ):
            return {"error": "the table would not fit in the session workspace's quota", "error_class": "permanent"}
        return {"error": f"could not be loaded: {type(exc).__name__}: {exc}"[:1000]}
    except Exception as exc:  # parsers raise many kinds of errors on malformed files; all mean "unreadable"
        return {"error": f"could not be loaded as {suffix}: {type(exc).__name__}: {exc}"[:1000]}
    finally:
        if workbook is not None:
            workbook.close()
