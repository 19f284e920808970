"""Connected tables: cost model, permissions, tenant filter, allowed columns and caps, on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from switchboard.core.tables.access import TableAccess
from switchboard.core.tables.backends import PostgresBackend, SqliteBackend, TableBackend
from switchboard.core.tables.config import ConnectedTable, Permission, table_cost
from switchboard.core.tables.statements import (
    Condition,
    TableDeleteInput,
    TableInsertInput,
    TableQueryInput,
    TableUpdateInput,
)
from switchboard.errors import ToolError
from tests.tables.postgres import postgres_dsn

__all__ = ["postgres_dsn"]

ROWS = [("acme", 1, "open", 10.0, "acme secret"), ("acme", 2, "paid", 20.0, "x"), ("globex", 3, "open", 99.0, "g")]


@pytest.mark.parametrize(
    ("permissions", "total", "parts"),
    [
        ([], 0, {}),
        (["read"], 1, {"table_query": 1}),
        (["write"], 5, {"table_query": 1, "table_insert": 2, "table_update": 2}),
        (["full"], 6, {"table_query": 1, "table_insert": 2, "table_update": 2, "table_delete": 1}),
        (["read", "read", "read"], 1, {"table_query": 1}),
        (["read", "write"], 5, {"table_query": 1, "table_insert": 2, "table_update": 2}),
        (["write", "write", "full", "read"], 6, None),
    ],
)
def test_cost_is_the_union_of_enabled_operations(
    permissions: list[Permission], total: int, parts: dict[str, int] | None
) -> None:
    tables = {f"t{i}": ConnectedTable(database="db", table=f"t{i}", permission=p) for i, p in enumerate(permissions)}
    cost = table_cost(tables)
    assert cost.total == total
    assert cost.total <= 6
    if parts is not None:
        assert cost.parts == parts
    assert str(total) in cost.describe()


def test_config_refuses_bad_identifiers_and_a_listed_tenant_column() -> None:
    with pytest.raises(ValidationError):
        ConnectedTable(database="db", table='orders"; DROP TABLE x; --')
    with pytest.raises(ValidationError):
        ConnectedTable(database="db", table="orders", columns=("id", "tenant_id"), tenant_column="tenant_id")


def _sqlite(tmp_path: Path) -> TableBackend:
    path = tmp_path / "shop.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE orders (tenant_id TEXT, id INTEGER PRIMARY KEY, status TEXT, total REAL, note TEXT)")
    con.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", ROWS)
    con.commit()
    con.close()
    return SqliteBackend(path)


@pytest.fixture(params=["sqlite", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[TableBackend]:
    if request.param == "sqlite":
        yield _sqlite(tmp_path)
        return
    import asyncpg

    dsn: str = request.getfixturevalue("postgres_dsn")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(dsn)
    await admin.execute(f"CREATE SCHEMA {schema}")
    await admin.execute(
        f"CREATE TABLE {schema}.orders (tenant_id TEXT, id INTEGER PRIMARY KEY, status TEXT, total DOUBLE PRECISION, "
        "note TEXT)"
    )
    await admin.executemany(f"INSERT INTO {schema}.orders VALUES ($1, $2, $3, $4, $5)", ROWS)
    await admin.close()
    sep = "&" if "?" in dsn else "?"
    pg = PostgresBackend(f"{dsn}{sep}options=-csearch_path%3D{schema}")
    try:
        yield pg
    finally:
        await pg.close()


def _table(backend: TableBackend, permission: Permission = "read", **kw: Any) -> TableAccess:
    config = ConnectedTable(database="shop", table="orders", permission=permission, tenant_column="tenant_id", **kw)
    return TableAccess("orders", config, backend)


async def test_another_tenants_rows_never_appear(backend: TableBackend) -> None:
    table = _table(backend)
    found = await table.query(TableQueryInput(table="orders", order_by=[]), "acme")
    assert sorted(r[found["columns"].index("id")] for r in found["rows"]) == [1, 2]
    assert "tenant_id" not in found["columns"]
    # Asking for the other tenant's rows by id or by an OR-looking value finds nothing.
    where = [Condition(column="id", op="in", value=[3])]
    assert (await table.query(TableQueryInput(table="orders", where=where), "acme"))["rows"] == []
    injected = [Condition(column="status", value="open' OR '1'='1")]
    assert (await table.query(TableQueryInput(table="orders", where=injected), "acme"))["rows"] == []


async def test_tenant_column_is_not_readable_nor_writable(backend: TableBackend) -> None:
    table = _table(backend, "full")
    with pytest.raises(ToolError, match="not a column"):
        await table.query(
            TableQueryInput(table="orders", where=[Condition(column="tenant_id", value="globex")]), "acme"
        )
    with pytest.raises(ToolError, match="not a column"):
        await table.insert(TableInsertInput(table="orders", values={"id": 9, "tenant_id": "globex"}), "acme")
    with pytest.raises(ToolError, match="not a column"):
        await table.update(
            TableUpdateInput(table="orders", set={"tenant_id": "acme"}, where=[Condition(column="id", value=3)]), "acme"
        )


async def test_writes_stay_in_the_tenant(backend: TableBackend) -> None:
    table = _table(backend, "full")
    assert (await table.insert(TableInsertInput(table="orders", values={"id": 7, "status": "new"}), "acme"))[
        "inserted"
    ] == 1
    other = _table(backend, "full")
    seen = await other.query(TableQueryInput(table="orders", where=[Condition(column="id", value=7)]), "globex")
    assert seen["rows"] == []
    everything = [Condition(column="id", op=">", value=0)]
    changed = await table.update(TableUpdateInput(table="orders", set={"status": "void"}, where=everything), "acme")
    assert changed["updated"] == 3  # acme's 1, 2 and 7, never globex's 3
    assert (await table.delete(TableDeleteInput(table="orders", where=everything), "acme"))["deleted"] == 3
    left = await other.query(TableQueryInput(table="orders", columns=["id", "status"]), "globex")
    assert left["rows"] == [[3, "open"]]


async def test_read_only_table_refuses_writes(backend: TableBackend) -> None:
    table = _table(backend, "read")
    calls: list[Callable[[], Any]] = [
        lambda: table.insert(TableInsertInput(table="orders", values={"id": 8}), "acme"),
        lambda: table.update(
            TableUpdateInput(table="orders", set={"status": "x"}, where=[Condition(column="id", value=1)]), "acme"
        ),
        lambda: table.delete(TableDeleteInput(table="orders", where=[Condition(column="id", value=1)]), "acme"),
    ]
    for call in calls:
        with pytest.raises(ToolError, match="'read' permission") as err:
            await call()
        assert err.value.error_class == "auth"
    writable = _table(backend, "write")
    with pytest.raises(ToolError, match="'write' permission"):
        await writable.delete(TableDeleteInput(table="orders", where=[Condition(column="id", value=1)]), "acme")
    found = await table.query(TableQueryInput(table="orders", columns=["id", "status"], order_by=[]), "acme")
    assert sorted(found["rows"]) == [[1, "open"], [2, "paid"]]


async def test_columns_not_listed_are_not_readable(backend: TableBackend) -> None:
    table = _table(backend, "read", columns=("id", "status"))
    found = await table.query(TableQueryInput(table="orders"), "acme")
    assert found["columns"] == ["id", "status"]
    for args in (
        TableQueryInput(table="orders", columns=["note"]),
        TableQueryInput(table="orders", where=[Condition(column="note", value="acme secret")]),
        TableQueryInput(table="orders", columns=['id", "note']),
    ):
        with pytest.raises(ToolError, match="not a column"):
            await table.query(args, "acme")


async def test_rows_are_capped_and_the_rest_counted(backend: TableBackend) -> None:
    table = _table(backend, "read", max_rows=1)
    found = await table.query(TableQueryInput(table="orders", limit=50), "acme")
    assert found["row_count"] == 1
    assert "more" in found


async def test_a_slow_statement_is_stopped(backend: TableBackend, tmp_path: Path) -> None:
    if isinstance(backend, SqliteBackend):
        con = sqlite3.connect(backend.path)
        con.execute("CREATE TABLE big (tenant_id TEXT, n INTEGER)")
        con.execute(
            "INSERT INTO big WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 300000) "
            "SELECT 'acme', x FROM c"
        )
        con.commit()
        con.close()
        slow = Condition(column="n", op="like", value="%99999%")
        config = ConnectedTable(database="shop", table="big", tenant_column="tenant_id", timeout_s=0.001)
        with pytest.raises(ToolError, match="limit and was stopped"):
            await TableAccess("big", config, backend).query(
                TableQueryInput(table="big", where=[slow], order_by=[{"column": "n", "descending": True}]),  # type: ignore[list-item]
                "acme",
            )
        return
    assert isinstance(backend, PostgresBackend)
    pool = await backend._connections()
    await pool.execute(
        "CREATE VIEW slow AS SELECT 'acme'::text AS tenant_id, n FROM generate_series(1, 1) n, pg_sleep(2) s"
    )
    config = ConnectedTable(database="shop", table="slow", tenant_column="tenant_id", timeout_s=0.2)
    with pytest.raises(ToolError, match="limit and was stopped"):
        await TableAccess("slow", config, backend).query(TableQueryInput(table="slow"), "acme")
