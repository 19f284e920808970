"""The shipped skills' scripts, run as the model runs them (``python3 scripts/…`` from the workspace) on real
inputs; each prints one JSON line, and its output opens in an independent reader."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import openpyxl
import pytest
from openpyxl.chart import BarChart, LineChart
from pypdf import PdfReader

from switchboard.skills.store import BUILTIN_DIR, TEMPLATE_DIR

XLSX = BUILTIN_DIR / "xlsx-report" / "scripts" / "report.py"
PDF = BUILTIN_DIR / "pdf-report" / "scripts" / "report.py"
LOAD = TEMPLATE_DIR / "csv-to-sqlite" / "scripts" / "load.py"

SALES = """month,region,revenue,units,margin
2024-01-01,North,"12,500.50",310,31.5%
2024-02-01,North,"13,100.00",322,32%
2024-03-01,South,9800.25,250,28.4%
2024-04-01,South,"15,020.75",401,35.1%
"""


def run(script: Path, *args: str, cwd: Path) -> tuple[int, dict[str, Any]]:
    """Run a script as python3 would from the workspace; its exit code and its one JSON line."""
    done = subprocess.run([sys.executable, str(script), *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert len(lines) == 1, f"one JSON line expected, got {done.stdout!r} (stderr {done.stderr!r})"
    return done.returncode, json.loads(lines[0])


def test_a_csv_becomes_a_formatted_xlsx_with_a_line_chart(tmp_path: Path) -> None:
    (tmp_path / "sales.csv").write_text(SALES)
    code, result = run(
        XLSX, "--csv", "sales.csv", "--out", "out/sales.xlsx", "--title", "Sales", "--chart", "line",
        "--y", "revenue", "--y", "units", "--totals", cwd=tmp_path,
    )  # fmt: skip
    assert code == 0 and result["ok"], result
    assert result["data"]["path"] == "out/sales.xlsx" and result["artifacts"] == ["out/sales.xlsx"]
    assert result["data"]["rows"] == 4 and result["data"]["numeric"] == ["revenue", "units", "margin"]
    book = openpyxl.load_workbook(tmp_path / "out" / "sales.xlsx")
    sheet = book.active
    assert [c.value for c in sheet[1]] == ["month", "region", "revenue", "units", "margin"]
    assert sheet["A1"].font.bold and sheet["A1"].fill.fgColor.rgb.endswith("1F4E78")
    assert sheet["C2"].value == 12500.5 and sheet["C2"].number_format == "#,##0.00"
    assert sheet["D2"].value == 310 and sheet["D2"].number_format == "#,##0"
    assert sheet["E2"].value == pytest.approx(0.315) and sheet["E2"].number_format == "0.0%"
    assert sheet["A2"].is_date and sheet["A2"].number_format == "yyyy-mm-dd"
    assert sheet["C6"].value == "=SUM(C2:C5)" and sheet["A6"].value == "Total"
    assert sheet.freeze_panes == "A2" and sheet.column_dimensions["C"].width > 10
    [chart] = sheet._charts
    assert isinstance(chart, LineChart) and len(chart.series) == 2
    assert [s.val.numRef.f for s in chart.series] == ["'Report'!$C$2:$C$5", "'Report'!$D$2:$D$5"]
    assert chart.series[0].cat.numRef.f == "'Report'!$A$2:$A$5"


def test_a_sqlite_query_becomes_an_xlsx_with_a_bar_chart_and_the_database_stays_read_only(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "shop.sqlite") as db:
        db.execute("CREATE TABLE orders (region TEXT, total REAL)")
        db.executemany("INSERT INTO orders VALUES (?, ?)", [("North", 10.5), ("South", 4.0), ("North", 2.0)])
    query = "SELECT region, SUM(total) AS total, COUNT(*) AS orders FROM orders GROUP BY region ORDER BY region"
    code, result = run(XLSX, "--sqlite", "shop.sqlite", "--query", query, "--out", "regions.xlsx", cwd=tmp_path)
    assert code == 0 and result["data"]["chart"] == "bar" and result["data"]["categories"] == "region"
    sheet = openpyxl.load_workbook(tmp_path / "regions.xlsx").active
    assert [[c.value for c in row] for row in sheet.iter_rows()] == [
        ["region", "total", "orders"],
        ["North", 12.5, 2],
        ["South", 4.0, 1],
    ]
    [chart] = sheet._charts
    assert isinstance(chart, BarChart) and len(chart.series) == 2

    code, result = run(
        XLSX, "--sqlite", "shop.sqlite", "--query", "DELETE FROM orders", "--out", "x.xlsx", cwd=tmp_path
    )
    assert code == 1 and result["ok"] is False and result["error"]["code"] == "bad_query"
    with sqlite3.connect(tmp_path / "shop.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM orders").fetchone() == (3,)


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--csv", "sales.csv", "--out", "/tmp/escape.xlsx"], "bad_output"),
        (["--csv", "sales.csv", "--out", "../escape.xlsx"], "bad_output"),
        (["--csv", "missing.csv", "--out", "r.xlsx"], "not_found"),
        (["--csv", "sales.csv", "--out", "r.xlsx", "--y", "region"], "bad_column"),
        (["--csv", "sales.csv", "--out", "r.xlsx", "--x", "nope"], "bad_column"),
    ],
)
def test_xlsx_errors_are_one_json_line_and_write_nothing(tmp_path: Path, args: list[str], code: str) -> None:
    (tmp_path / "sales.csv").write_text(SALES)
    exit_code, result = run(XLSX, *args, cwd=tmp_path)
    assert exit_code == 1 and result == {"ok": False, "error": {"code": code, "message": result["error"]["message"]}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sales.csv"]


REPORT = """# Quarterly summary

Revenue grew **12%** in Q3, led by *Europe*; Zürich and Malmö opened.

## Regions

| Region | Revenue |
|--------|--------:|
| Europe | 1,200 |
| Asia   | 900 |

- first finding
- second finding

```
SELECT region FROM sales
```
"""


def test_markdown_becomes_a_pdf_whose_text_reads_back(tmp_path: Path) -> None:
    (tmp_path / "report.md").write_text(REPORT + "\n".join(f"\nParagraph {i} of the appendix." for i in range(80)))
    code, result = run(
        PDF, "--markdown", "report.md", "--out", "q3.pdf", "--title", "Q3 report", "--author", "Ada", cwd=tmp_path
    )
    assert code == 0 and result["ok"] and result["data"]["path"] == "q3.pdf" and result["data"]["pages"] >= 2
    reader = PdfReader(tmp_path / "q3.pdf")
    assert reader.metadata is not None and reader.metadata.title == "Q3 report" and reader.metadata.author == "Ada"
    assert len(reader.pages) == result["data"]["pages"]
    first = reader.pages[0].extract_text()
    for text in ("Q3 report", "Quarterly summary", "Revenue grew", "Europe", "1,200", "first finding", "SELECT region"):
        assert text in first, text
    if result["data"]["unicode"]:
        assert "Zürich and Malmö" in first
    assert f"2 / {len(reader.pages)}" in reader.pages[1].extract_text(), "page numbers in the footer"
    assert "Paragraph 79 of the appendix." in reader.pages[-1].extract_text()


def test_pdf_errors_are_one_json_line(tmp_path: Path) -> None:
    code, result = run(PDF, "--markdown", "missing.md", "--out", "r.pdf", cwd=tmp_path)
    assert code == 1 and result["error"]["code"] == "not_found"
    (tmp_path / "r.md").write_text("# x")
    code, result = run(PDF, "--markdown", "r.md", "--out", "/etc/r.pdf", cwd=tmp_path)
    assert code == 1 and result["error"]["code"] == "bad_output"


def test_the_csv_to_sqlite_template_loads_a_queryable_table(tmp_path: Path) -> None:
    (tmp_path / "sales.csv").write_text("region,units,price\nNorth,3,1.5\nSouth,,2\n")
    code, result = run(LOAD, "--csv", "sales.csv", "--db", "data.sqlite", "--table", "sales", cwd=tmp_path)
    assert code == 0 and result["data"]["rows"] == 2
    assert result["data"]["columns"] == [
        {"name": "region", "type": "TEXT"},
        {"name": "units", "type": "INTEGER"},
        {"name": "price", "type": "REAL"},
    ]
    with sqlite3.connect(tmp_path / "data.sqlite") as db:
        assert db.execute("SELECT region, units, price FROM sales ORDER BY region").fetchall() == [
            ("North", 3, 1.5),
            ("South", None, 2.0),
        ]
