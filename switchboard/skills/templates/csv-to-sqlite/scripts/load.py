"""Load a CSV file into a SQLite table (column types inferred); prints one JSON line.

Usage: python3 load.py --csv FILE --db DATABASE --table NAME [--replace]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sqlite3
import sys
from pathlib import Path, PurePosixPath

__all__ = ["main"]


def column_type(values: list[str]) -> str:
    """``INTEGER``, ``REAL`` or ``TEXT``: numeric only when every non-empty value is."""
    found = [v.strip() for v in values if v.strip()]
    if found and all(re.fullmatch(r"[-+]?\d+", v) for v in found):
        return "INTEGER"
    try:
        for v in found:
            float(v)
    except ValueError:
        return "TEXT"
    return "REAL" if found else "TEXT"


def main(argv: list[str] | None = None) -> int:
    """Load the CSV; 0 and an ``ok`` JSON line on success, 1 and an ``error`` otherwise."""
    parser = argparse.ArgumentParser(description="Load a CSV file into a SQLite table.")
    parser.add_argument("--csv", required=True)
    parser.add_argument("--db", required=True, help="relative path of the SQLite database")
    parser.add_argument("--table", required=True)
    parser.add_argument("--replace", action="store_true")
    args = parser.parse_args(argv)

    def fail(code: str, message: str) -> int:
        print(json.dumps({"ok": False, "error": {"code": code, "message": message}}))
        return 1

    db = PurePosixPath(args.db)
    if db.is_absolute() or ".." in db.parts:
        return fail("bad_output", "--db must be a relative path inside the workspace")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", args.table):
        return fail("bad_table", "--table must be letters, digits and underscores")
    try:
        with open(args.csv, newline="", encoding="utf-8-sig") as handle:
            rows = [r for r in csv.reader(handle) if any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError) as err:
        return fail("bad_input", f"{args.csv}: {err}")
    if not rows:
        return fail("empty", f"{args.csv} has no rows")
    header, body = rows[0], rows[1:]
    names = [re.sub(r"\W+", "_", h.strip()).strip("_") or f"column_{i + 1}" for i, h in enumerate(header)]
    types = [column_type([r[i] if i < len(r) else "" for r in body]) for i in range(len(names))]
    columns = ", ".join(f'"{n}" {t}' for n, t in zip(names, types, strict=True))
    with sqlite3.connect(Path(args.db)) as conn:
        if args.replace:
            conn.execute(f'DROP TABLE IF EXISTS "{args.table}"')
        conn.execute(f'CREATE TABLE IF NOT EXISTS "{args.table}" ({columns})')
        marks = ", ".join("?" for _ in names)
        conn.executemany(
            f'INSERT INTO "{args.table}" VALUES ({marks})',  # noqa: S608 - the table name is checked above
            [[(r[i] if i < len(r) and r[i].strip() else None) for i in range(len(names))] for r in body],
        )
        count = conn.execute(f'SELECT COUNT(*) FROM "{args.table}"').fetchone()[0]  # noqa: S608 - checked name
    result = {"table": args.table, "columns": [{"name": n, "type": t} for n, t in zip(names, types, strict=True)]}
    print(json.dumps({"ok": True, "data": {**result, "rows": count, "db": args.db}, "artifacts": [args.db]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
