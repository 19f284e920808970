"""``read_document(into_table=...)``: a CSV or XLSX loaded into the session database instead of the context."""

from __future__ import annotations

import dataclasses
import datetime as dt
import sqlite3
from pathlib import Path
from typing import Any

import openpyxl
import pytest

from switchboard.core.sql.card import database_card
from switchboard.core.sql.load import BATCH_ROWS, sanitise_names
from switchboard.core.sql.store import SESSION_DB
from switchboard.core.tools.builtin.documents import ReadDocumentInput, read_document
from switchboard.core.tools.definition import ToolContext
from switchboard.core.workspaces.disk import Quotas, Workspaces
from switchboard.errors import ToolError


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    (path / "inbox").mkdir(parents=True)
    return path


def context(workspace: Path, **kw: Any) -> ToolContext:
    base = {"session_key": "t/a/web/default/c", "tenant": "t", "run_id": "r", "actor": "u", "idempotency_key": ""}
    return ToolContext(workspace=workspace, **{**base, **kw})


async def load(ctx: ToolContext, **args: Any) -> dict[str, Any]:
    return await read_document(ReadDocumentInput.model_validate(args), ctx)


def table(workspace: Path, statement: str) -> list[Any]:
    con = sqlite3.connect(workspace / SESSION_DB)
    try:
        return con.execute(statement).fetchall()
    finally:
        con.close()


def test_header_names_are_sanitised_to_plain_unique_identifiers() -> None:
    header = ["Region", "Amount (€)", "", "2024 total", "select", "Region", None, "  Zip-Code "]
    assert sanitise_names(header) == [
        "region",
        "amount",
        "column_3",
        "c_2024_total",
        "select_",
        "region_2",
        "column_7",
        "zip_code",
    ]


async def test_a_csv_loads_with_inferred_types_and_its_row_count(workspace: Path) -> None:
    rows = [f"{'north' if i % 2 else 'south'},{i},{i * 1.25},0{i % 9}123,2024-01-{1 + i % 28:02d}" for i in range(2500)]
    text = "Region,Units Sold,Revenue (EUR),Zip Code,Day\n" + "\n".join(rows) + "\n\n"
    (workspace / "inbox" / "sales.csv").write_text(text)
    found = await load(context(workspace), path="inbox/sales.csv", into_table="sales")
    assert found["table"] == "sales" and found["rows"] == 2500 > BATCH_ROWS  # streamed in several batches
    assert found["columns"] == [
        {"name": "region", "type": "TEXT", "header": "Region"},
        {"name": "units_sold", "type": "INTEGER", "header": "Units Sold"},
        {"name": "revenue_eur", "type": "REAL", "header": "Revenue (EUR)"},
        {"name": "zip_code", "type": "TEXT", "header": "Zip Code"},  # leading zeros are kept
        {"name": "day", "type": "TEXT", "header": "Day"},
    ]
    assert found["sample"][0] == ["south", 0, 0.0, "00123", "2024-01-01"]
    assert "text" not in found and "rows_capped" not in found  # not the sheet pasted into the context
    assert table(workspace, "SELECT count(*), sum(units_sold), typeof(revenue_eur) FROM sales") == [
        (2500, sum(range(2500)), "real")
    ]
    card = database_card(workspace, {})
    line = "- sales (2500 rows): region TEXT, units_sold INTEGER, revenue_eur REAL, zip_code TEXT, day TEXT"
    assert line + " — from inbox/sales.csv" in card.text and card.untrusted


async def test_an_xlsx_sheet_loads_with_dates_booleans_and_blank_rows_skipped(workspace: Path) -> None:
    book = openpyxl.Workbook()
    first = book.active
    assert first is not None
    first.title = "Notes"
    first.append(["ignored"])
    orders = book.create_sheet("Orders")
    orders.append(["Order ID", "Placed", "Paid?", "Total"])
    orders.append([1, dt.datetime(2024, 3, 1, 9, 30), True, 10])
    orders.append([None, None, None, None])
    orders.append([2, dt.datetime(2024, 3, 2), False, 12.5])
    book.save(workspace / "inbox" / "orders.xlsx")
    found = await load(context(workspace), path="inbox/orders.xlsx", sheet="Orders", into_table="orders")
    assert found["rows"] == 2
    assert [(c["name"], c["type"]) for c in found["columns"]] == [
        ("order_id", "INTEGER"),
        ("placed", "TEXT"),
        ("paid", "INTEGER"),
        ("total", "REAL"),
    ]
    assert table(workspace, "SELECT * FROM orders ORDER BY order_id") == [
        (1, "2024-03-01T09:30:00", 1, 10.0),
        (2, "2024-03-02T00:00:00", 0, 12.5),
    ]
    assert "from inbox/orders.xlsx (sheet Orders)" in database_card(workspace, {}).text


async def test_an_existing_table_is_kept_unless_replaced(workspace: Path) -> None:
    (workspace / "inbox" / "a.csv").write_text("x\n1\n2\n")
    (workspace / "inbox" / "b.csv").write_text("y\nz\n")
    ctx = context(workspace)
    await load(ctx, path="inbox/a.csv", into_table="t")
    with pytest.raises(ToolError, match="already has a table 't'") as caught:
        await load(ctx, path="inbox/b.csv", into_table="t")
    assert caught.value.error_class == "validation"
    assert table(workspace, "SELECT * FROM t") == [(1,), (2,)]
    replaced = await load(ctx, path="inbox/b.csv", into_table="t", replace_table=True)
    assert replaced["rows"] == 1 and table(workspace, "SELECT * FROM t") == [("z",)]


async def test_a_load_rerun_under_the_same_key_is_not_repeated(workspace: Path) -> None:
    (workspace / "inbox" / "a.csv").write_text("x\n1\n")
    keyed = context(workspace, idempotency_key="run-1/load")
    first = await load(keyed, path="inbox/a.csv", into_table="t")
    again = await load(keyed, path="inbox/a.csv", into_table="t")  # no "already has a table": the recorded outcome
    assert again == first


async def test_bad_loads_get_clear_errors_and_change_nothing(workspace: Path) -> None:
    (workspace / "inbox" / "notes.txt").write_text("hello")
    (workspace / "inbox" / "a.csv").write_text("x\n1\n")
    (workspace / "inbox" / "empty.csv").write_text("")
    ctx = context(workspace)
    with pytest.raises(ToolError, match="loads CSV and XLSX only"):
        await load(ctx, path="inbox/notes.txt", into_table="t")
    for name in ("1abc", "a b", "sqlite_master", "_switchboard_tables", 'x"; DROP TABLE y; --'):
        with pytest.raises(ToolError, match="not a plain table name"):
            await load(ctx, path="inbox/a.csv", into_table=name)
    with pytest.raises(ToolError, match="no rows to load"):
        await load(ctx, path="inbox/empty.csv", into_table="t")
    assert not (workspace / SESSION_DB).exists()


async def test_a_load_past_the_workspace_quota_is_refused_and_changes_nothing(workspace: Path) -> None:
    rows = "\n".join(f"{i},{'x' * 200}" for i in range(3000))
    (workspace / "inbox" / "big.csv").write_text("id,text\n" + rows)
    (workspace / "inbox" / "small.csv").write_text("id\n1\n")
    spaces = Workspaces(None, Quotas(session_bytes=1_000_000))
    ctx = context(workspace, workspaces=spaces)
    await load(ctx, path="inbox/small.csv", into_table="small")
    before = (workspace / SESSION_DB).read_bytes()
    with pytest.raises(ToolError, match="quota"):
        await load(dataclasses.replace(ctx, run_id="r2"), path="inbox/big.csv", into_table="big")
    assert (workspace / SESSION_DB).read_bytes() == before
