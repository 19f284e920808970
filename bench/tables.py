"""Connected tables (issue #23): ``table_query`` p50/p95 at 100k rows, SQLite and PostgreSQL, vs the raw driver.

One ``orders`` table of 100,000 rows (two tenants, an index on ``(tenant_id, customer)``) is queried for one
customer's open orders. The measured path is the ``table_query`` tool through ``ToolGateway.call``: argument
validation, the permission and allowed columns, the statement built with the tenant filter, the backend (SQLite: a
read-only connection per statement under a deadline; PostgreSQL: an asyncpg pool, a read-only transaction with a
``statement_timeout``). The baseline is the same parameterised ``SELECT`` through the driver itself (one open
``sqlite3`` connection; one ``asyncpg`` connection), interleaved with the tool in the same run. PostgreSQL is a real
server started like the test suite's (``tests/tables/postgres.py``: Debian's ``postgresql`` package).

    python -m bench.tables
    python -m bench.tables --quick
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench._harness import SUMMARY_HEADERS, Row, fmt, median, parser, percentile, render_table, rounds_of, verdicts
from switchboard.core.tables.access import TableAccess
from switchboard.core.tables.backends import PostgresBackend, SqliteBackend, TableBackend
from switchboard.core.tables.config import ConnectedTable
from switchboard.core.tables.tools import table_tools
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.types import SessionKey
from tests.tables.postgres import NoPostgresError, running_postgres

ROWS = 100_000
"""Also in ``--quick``: the table's size is what the figure is about, and loading it takes seconds."""
QUERIES, QUICK_QUERIES = 300, 60
CUSTOMERS = 2_000
STATUSES = ("open", "paid", "shipped", "refunded")
CREATE = (
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, tenant_id TEXT NOT NULL, customer TEXT NOT NULL, "
    "status TEXT NOT NULL, total REAL NOT NULL)"
)
INDEX = "CREATE INDEX orders_tenant_customer ON orders (tenant_id, customer)"
RAW = {
    "sqlite": "SELECT id, customer, status, total FROM orders WHERE tenant_id = ? AND customer = ? AND status = ? "
    "ORDER BY id LIMIT 51",
    "postgres": "SELECT id, customer, status, total FROM orders WHERE tenant_id = $1 AND customer = $2 "
    "AND status = $3 ORDER BY id LIMIT 51",
}
TABLE = ConnectedTable(
    database="shop", table="orders", permission="read", columns=("id", "customer", "status", "total"),
    tenant_column="tenant_id", max_rows=50,
)  # fmt: skip


def _rows(n: int) -> list[tuple[Any, ...]]:
    pick = random.Random(23)
    return [
        (i, "acme" if i % 2 else "globex", f"C{pick.randrange(CUSTOMERS):05d}", pick.choice(STATUSES),
         round(pick.uniform(1, 500), 2))
        for i in range(1, n + 1)
    ]  # fmt: skip


def _customers(n: int) -> list[str]:
    pick = random.Random(5)
    return [f"C{pick.randrange(CUSTOMERS):05d}" for _ in range(n)]


async def _measure(
    backend: TableBackend, raw: Callable[[str], Awaitable[int]], customers: list[str], root: Path
) -> tuple[list[float], list[float]]:
    """Milliseconds of each ``table_query`` through the gateway and of each raw query, interleaved."""
    access = TableAccess("orders", TABLE, backend)
    registry = ToolRegistry(table_tools(lambda agent: {"orders": access}))
    gateway = ToolGateway(registry, workspace_root=root)
    ctx = ToolContext(
        session_key=SessionKey("acme/shop/web/main/bench"), tenant="acme", run_id="bench", actor="web:u1",
        workspace=root / "bench", idempotency_key="", agent="shop",
    )  # fmt: skip
    tool_ms: list[float] = []
    raw_ms: list[float] = []
    for n, customer in enumerate(customers):
        args = {"table": "orders", "where": [{"column": "customer", "value": customer},
                {"column": "status", "value": "open"}], "order_by": [{"column": "id"}]}  # fmt: skip
        started = time.perf_counter()
        out = await gateway.call("table_query", args, ctx)
        tool_ms.append((time.perf_counter() - started) * 1000)
        assert out.ok, out.error
        started = time.perf_counter()
        count = await raw(customer)
        raw_ms.append((time.perf_counter() - started) * 1000)
        assert min(count, TABLE.max_rows) == len(out.value["rows"]), (n, count, out.value)
    return tool_ms, raw_ms


async def _sqlite(root: Path, rows: list[tuple[Any, ...]], customers: list[str]) -> tuple[list[float], list[float]]:
    path = root / "shop.sqlite"
    con = sqlite3.connect(path)
    con.execute(CREATE)
    con.execute(INDEX)
    con.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", rows)
    con.commit()

    async def raw(customer: str) -> int:
        return len(con.execute(RAW["sqlite"], ("acme", customer, "open")).fetchall())

    try:
        return await _measure(SqliteBackend(path), raw, customers, root)
    finally:
        con.close()


async def _postgres(dsn: str, root: Path, rows: list[tuple[Any, ...]], customers: list[str]) -> Any:
    import asyncpg

    con = await asyncpg.connect(dsn)
    backend = PostgresBackend(dsn)
    try:
        await con.execute("DROP TABLE IF EXISTS orders")
        await con.execute(CREATE.replace("INTEGER", "BIGINT").replace("REAL", "DOUBLE PRECISION"))
        await con.execute(INDEX)
        await con.copy_records_to_table("orders", records=rows)
        await con.execute("ANALYZE orders")

        async def raw(customer: str) -> int:
            return len(await con.fetch(RAW["postgres"], "acme", customer, "open"))

        return await _measure(backend, raw, customers, root)
    finally:
        await backend.close()
        await con.close()


def _line(name: str, tool: list[float], raw: list[float]) -> tuple[str, ...]:
    return (
        name, fmt(median(raw), 3), fmt(percentile(raw, 95), 3), fmt(median(tool), 3), fmt(percentile(tool, 95), 3),
        f"{median(tool) / median(raw):.1f}×",
    )  # fmt: skip


def _summary(name: str, size: int, tool: list[float]) -> Row:
    measured = f"{fmt(median(tool), 2)} / {fmt(percentile(tool, 95), 2)} ms"
    return Row("tables", f"table_query p50/p95, {name}, {size:,} rows", measured, "measured", None)


async def run(argv: list[str] | None = None) -> list[Row]:
    """Run the benchmark, print its table, return the summary rows."""
    ns = parser(__doc__.splitlines()[0] if __doc__ else "tables").parse_args(argv)
    size = ROWS
    customers = _customers((QUICK_QUERIES if ns.quick else QUERIES) * rounds_of(ns))
    rows = _rows(size)
    print(f"tables: {len(customers)} queries on {size:,} rows, tool and raw driver interleaved", flush=True)
    lines: list[tuple[str, ...]] = []
    summary: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="sb-bench-tables-") as tmp:
        tool, raw = await _sqlite(Path(tmp), rows, customers)
        lines.append(_line("SQLite", tool, raw))
        summary.append(_summary("SQLite", size, tool))
        try:
            with running_postgres() as dsn:
                tool, raw = await _postgres(dsn, Path(tmp), rows, customers)
            lines.append(_line("PostgreSQL", tool, raw))
            summary.append(_summary("PostgreSQL", size, tool))
        except NoPostgresError as err:
            print(f"PostgreSQL: skipped ({err})")
    print(
        render_table(
            f"one customer's open orders, tenant filter, at {size:,} rows ({len(customers)} queries each)",
            ("database", "raw p50 (ms)", "raw p95 (ms)", "table_query p50 (ms)", "table_query p95 (ms)", "ratio p50"),
            lines,
        )
    )
    summary = verdicts(summary, ns.quick)
    print(render_table("summary", SUMMARY_HEADERS, [row.cells() for row in summary]))
    return summary


if __name__ == "__main__":
    asyncio.run(run())
