"""Connected tables under attack: the tenant column named in another case is still the tenant column (SQLite)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from switchboard.core.tables.access import TableAccess
from switchboard.core.tables.backends import SqliteBackend
from switchboard.core.tables.config import ConnectedTable
from switchboard.core.tables.statements import Condition, TableInsertInput, TableQueryInput, TableUpdateInput
from switchboard.errors import ToolError


def orders(tmp_path: Path, **config: object) -> TableAccess:
    """A table whose tenant column is ``TenantId`` in the database, ``tenantid`` in the YAML file."""
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, TenantId TEXT, status TEXT)")
        con.executemany("INSERT INTO orders (TenantId, status) VALUES (?, ?)", [("acme", "open"), ("globex", "open")])
    table = ConnectedTable.model_validate(
        {"database": "shop", "table": "orders", "permission": "full", "tenant_column": "tenantid", **config}
    )
    return TableAccess("orders", table, SqliteBackend(path))


def tenants(tmp_path: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(tmp_path / "shop.db") as con:
        return con.execute("SELECT id, TenantId FROM orders ORDER BY id").fetchall()


async def test_the_tenant_column_in_another_case_is_neither_shown_nor_writable(tmp_path: Path) -> None:
    table = orders(tmp_path)
    assert await table.allowed() == ("id", "status")
    found = await table.query(TableQueryInput(table="orders"), "acme")
    assert found["rows"] == [[1, "open"]]
    with pytest.raises(ToolError, match="not a column"):
        await table.update(
            TableUpdateInput(table="orders", set={"TenantId": "globex"}, where=[Condition(column="id", op="not_null")]),
            "acme",
        )
    with pytest.raises(ToolError, match="not a column"):
        await table.insert(TableInsertInput(table="orders", values={"TenantId": "globex", "status": "x"}), "acme")
    assert tenants(tmp_path) == [(1, "acme"), (2, "globex")]


async def test_a_listed_column_that_is_the_tenant_column_in_another_case_is_refused(tmp_path: Path) -> None:
    table = orders(tmp_path, columns=["id", "TenantId", "status"])
    with pytest.raises(ToolError, match="tenant column"):
        await table.query(TableQueryInput(table="orders"), "acme")
