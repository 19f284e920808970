"""A formatted XLSX report with a chart, from a CSV file or a SQLite query; prints one JSON line.

Usage: python3 report.py (--csv FILE | --sqlite DB --query SQL) --out REPORT.xlsx [--title T] [--chart bar|line|none]
                         [--x COLUMN] [--y COLUMN ...] [--sheet NAME] [--totals] [--delimiter CHAR]
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import re
import sqlite3
import sys
from pathlib import Path, PurePosixPath
from typing import Any

from openpyxl import Workbook
from openpyxl.chart import BarChart, LineChart, Reference
from openpyxl.styles import Alignment, Border, Font, PatternFill, Side
from openpyxl.utils import get_column_letter

__all__ = ["main"]

MAX_ROWS = 200_000
MAX_SERIES = 6
_NUMBER = re.compile(r"[-+]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?([eE][-+]?\d+)?")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class ReportError(Exception):
    """A problem the caller can act on, reported as the JSON result."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def relative_out(path: str) -> Path:
    """The output path, refused unless it is relative and stays inside the working directory."""
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.name.endswith(".xlsx"):
        raise ReportError("bad_output", f"--out must be a relative path ending in .xlsx, inside the workspace: {path}")
    return Path(path)


def read_csv(path: str, delimiter: str | None) -> tuple[list[str], list[list[Any]]]:
    """Header and rows of a CSV file (the delimiter is sniffed when not given)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            sample = handle.read(64 * 1024)
            handle.seek(0)
            if delimiter is None:
                try:
                    delimiter = csv.Sniffer().sniff(sample, delimiters=",;\t|").delimiter
                except csv.Error:
                    delimiter = ","
            rows = list(csv.reader(handle, delimiter=delimiter))
    except FileNotFoundError:
        raise ReportError("not_found", f"no such CSV file: {path}") from None
    except UnicodeDecodeError:
        raise ReportError("bad_input", f"{path} is not UTF-8 text") from None
    rows = [r for r in rows if any(cell.strip() for cell in r)]
    if not rows:
        raise ReportError("empty", f"{path} has no rows")
    return [h.strip() or f"column {i + 1}" for i, h in enumerate(rows[0])], rows[1 : MAX_ROWS + 2]


def read_sqlite(path: str, query: str) -> tuple[list[str], list[list[Any]]]:
    """Header and rows of a query, on the database opened read-only."""
    if not Path(path).is_file():
        raise ReportError("not_found", f"no such SQLite database: {path}")
    try:
        with sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True) as db:
            cursor = db.execute(query)
            header = [d[0] for d in cursor.description or []]
            rows = [list(r) for r in cursor.fetchmany(MAX_ROWS + 1)]
    except sqlite3.Error as err:
        raise ReportError("bad_query", f"the query failed: {err}") from None
    if not header:
        raise ReportError("bad_query", "the query returns no columns (use a SELECT)")
    return header, rows


def convert(value: Any) -> tuple[Any, str]:
    """A cell value and its kind: ``int``, ``float``, ``percent``, ``date``, ``text`` or ``empty``."""
    if value is None:
        return None, "empty"
    if isinstance(value, bool):
        return str(value), "text"
    if isinstance(value, int):
        return value, "int"
    if isinstance(value, float):
        return value, "float"
    text = str(value).strip()
    if not text:
        return None, "empty"
    if text.endswith("%") and _NUMBER.fullmatch(text[:-1].strip()) and any(c.isdigit() for c in text):
        return float(text[:-1].replace(",", "")) / 100, "percent"
    if _NUMBER.fullmatch(text) and any(c.isdigit() for c in text):
        plain = text.replace(",", "")
        if re.fullmatch(r"[-+]?\d+", plain) and not (len(plain.lstrip("+-")) > 1 and plain.lstrip("+-")[0] == "0"):
            return int(plain), "int"
        try:
            return float(plain), "float"
        except ValueError:
            return text, "text"
    if _DATE.fullmatch(text):
        try:
            return dt.date.fromisoformat(text), "date"
        except ValueError:
            return text, "text"
    return text, "text"


def column_kind(kinds: list[str]) -> str:
    """One kind for a column: numeric or date only when every non-empty cell is."""
    found = {k for k in kinds if k != "empty"}
    if not found:
        return "text"
    if found <= {"int"}:
        return "int"
    if found <= {"int", "float"}:
        return "float"
    if found == {"percent"}:
        return "percent"
    if found == {"date"}:
        return "date"
    return "text"


FORMATS = {"int": "#,##0", "float": "#,##0.00", "percent": "0.0%", "date": "yyyy-mm-dd"}


def build(args: argparse.Namespace) -> dict[str, Any]:
    """Write the report; the data of the JSON result."""
    out = relative_out(args.out)
    if args.csv:
        header, raw = read_csv(args.csv, args.delimiter)
    else:
        header, raw = read_sqlite(args.sqlite, args.query)
    if len(raw) > MAX_ROWS:
        raise ReportError("too_large", f"more than {MAX_ROWS} rows: filter or aggregate first")
    width = len(header)
    cells = [[convert(row[i] if i < len(row) else None) for i in range(width)] for row in raw]
    kinds = [column_kind([row[i][1] for row in cells]) for i in range(width)]
    rows = [
        [value if kinds[i] != "text" or value is None else str(value) for i, (value, _) in enumerate(row)]
        for row in cells
    ]

    numeric = [h for h, k in zip(header, kinds, strict=True) if k in {"int", "float", "percent"}]
    for name in [*(args.y or []), *([args.x] if args.x else [])]:
        if name not in header:
            raise ReportError("bad_column", f"no column {name!r} (columns: {', '.join(header)})")
    y_columns = args.y or [h for h in numeric if h != args.x][:MAX_SERIES]
    bad = [name for name in y_columns if name not in numeric]
    if bad and args.chart != "none":
        raise ReportError("bad_column", f"not numeric, cannot be charted: {', '.join(bad)}")
    x_column = args.x or next(
        (h for h, k in zip(header, kinds, strict=True) if k not in {"int", "float", "percent"}), None
    )

    book = Workbook()
    sheet = book.active
    sheet.title = (args.sheet or "Report")[:31]
    sheet.append(header)
    for row in rows:
        sheet.append(row)
    fill = PatternFill("solid", fgColor="1F4E78")
    edge = Side(style="thin", color="BFBFBF")
    for cell in sheet[1]:
        cell.font = Font(bold=True, color="FFFFFF")
        cell.fill = fill
        cell.alignment = Alignment(horizontal="center", vertical="center", wrap_text=True)
        cell.border = Border(bottom=edge)
    last_row = len(rows) + 1
    for index, kind in enumerate(kinds, start=1):
        letter = get_column_letter(index)
        if kind in FORMATS:
            for (cell,) in sheet.iter_rows(min_row=2, max_row=last_row, min_col=index, max_col=index):
                cell.number_format = FORMATS[kind]
        shown = [len(str(header[index - 1]))] + [len(_shown(r[index - 1], kind)) for r in rows[:2000]]
        sheet.column_dimensions[letter].width = min(max(shown) + 3, 60)
    if args.totals and rows:
        sheet.append(["Total" if i == 0 else None for i in range(width)])
        total_row = last_row + 1
        for index, kind in enumerate(kinds, start=1):
            if kind in {"int", "float"} and index > 1:
                cell = sheet.cell(
                    row=total_row,
                    column=index,
                    value=f"=SUM({get_column_letter(index)}2:{get_column_letter(index)}{last_row})",
                )
                cell.number_format = FORMATS[kind]
                cell.font = Font(bold=True)
        sheet.cell(row=total_row, column=1).font = Font(bold=True)
    sheet.freeze_panes = "A2"
    sheet.auto_filter.ref = f"A1:{get_column_letter(width)}{last_row}"

    chart_kind = args.chart if y_columns and rows else "none"
    if chart_kind != "none":
        chart = BarChart() if chart_kind == "bar" else LineChart()
        chart.title = args.title or ", ".join(y_columns)
        chart.height, chart.width = 9, 18
        for name in y_columns:
            col = header.index(name) + 1
            chart.add_data(Reference(sheet, min_col=col, min_row=1, max_row=last_row), titles_from_data=True)
        if x_column is not None:
            col = header.index(x_column) + 1
            chart.set_categories(Reference(sheet, min_col=col, min_row=2, max_row=last_row))
            chart.x_axis.title = x_column
        sheet.add_chart(chart, f"{get_column_letter(width + 2)}2")
    if args.title:
        book.properties.title = args.title
    if out.parent != Path():
        out.parent.mkdir(parents=True, exist_ok=True)
    book.save(out)
    return {
        "path": out.as_posix(),
        "rows": len(rows),
        "columns": header,
        "numeric": numeric,
        "charted": y_columns if chart_kind != "none" else [],
        "chart": chart_kind,
        "categories": x_column if chart_kind != "none" else None,
    }


def _shown(value: Any, kind: str) -> str:
    if value is None:
        return ""
    if kind == "float":
        return f"{value:,.2f}"
    if kind == "int":
        return f"{value:,}"
    if kind == "percent":
        return f"{value:.1%}"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, build the report, print one JSON line; 0 on success, 1 on a reported error."""
    parser = argparse.ArgumentParser(description="A formatted XLSX report with a chart from a CSV or a SQLite query.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--csv", help="CSV file to report on")
    source.add_argument("--sqlite", help="SQLite database to query (opened read-only)")
    parser.add_argument("--query", help="SQL query (with --sqlite)")
    parser.add_argument("--out", required=True, help="relative path of the .xlsx to write")
    parser.add_argument("--title", default="")
    parser.add_argument("--chart", choices=["bar", "line", "none"], default="bar")
    parser.add_argument("--x", help="category column of the chart")
    parser.add_argument("--y", action="append", help="numeric column to chart (repeatable)")
    parser.add_argument("--sheet", default="")
    parser.add_argument("--totals", action="store_true", help="add a row of sums")
    parser.add_argument("--delimiter", help="CSV delimiter (sniffed when not given)")
    args = parser.parse_args(argv)
    try:
        if args.sqlite and not args.query:
            raise ReportError("bad_arguments", "--sqlite needs --query")
        data = build(args)
    except ReportError as err:
        print(json.dumps({"ok": False, "error": {"code": err.code, "message": str(err)}}))
        return 1
    except OSError as err:
        print(json.dumps({"ok": False, "error": {"code": "io", "message": f"{err.strerror or err}"}}))
        return 1
    print(json.dumps({"ok": True, "data": data, "artifacts": [data["path"]]}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
