"""``sql``: one statement per call on the session database and the agent's shared read-only databases."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.sql.card import database_card
from switchboard.core.sql.databases import SharedDatabase
from switchboard.core.sql.guard import SqlLimits
from switchboard.core.sql.store import SESSION_DB
from switchboard.core.tools.builtin.sql import SqlInput, sql_tools
from switchboard.core.tools.definition import ToolContext
from switchboard.core.workspaces.disk import Quotas, Workspaces
from switchboard.errors import ToolError
from switchboard.types import SessionKey


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def catalog(tmp_path: Path) -> SharedDatabase:
    path = tmp_path / "catalog.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE products (sku TEXT PRIMARY KEY, name TEXT, price REAL)")
    con.executemany("INSERT INTO products VALUES (?, ?, ?)", [(f"s{i}", f"item {i}", i * 1.5) for i in range(300)])
    con.commit()
    con.close()
    return SharedDatabase(path=path, description="The product catalogue.", tables={"products": "one row per product"})


def context(workspace: Path, catalog: SharedDatabase | None = None, **kw: Any) -> ToolContext:
    return ToolContext(
        session_key=SessionKey("t/a/web/default/c"),
        tenant="t",
        run_id="r",
        actor="u",
        workspace=workspace,
        idempotency_key="",
        databases={"catalog": catalog} if catalog is not None else {},
        **kw,
    )


async def sql(ctx: ToolContext, statement: str, *, limits: SqlLimits | None = None, **args: Any) -> dict[str, Any]:
    [tool] = sql_tools(limits or SqlLimits())
    found: dict[str, Any] = await tool.fn(SqlInput(statement=statement, **args), ctx)
    return found


async def refused(ctx: ToolContext, statement: str, **kw: Any) -> str:
    with pytest.raises(ToolError) as caught:
        await sql(ctx, statement, **kw)
    return str(caught.value)


def rows_of(workspace: Path, statement: str) -> list[Any]:
    con = sqlite3.connect(workspace / SESSION_DB)
    try:
        return con.execute(statement).fetchall()
    finally:
        con.close()


async def test_tables_are_created_written_and_read_back(workspace: Path) -> None:
    ctx = context(workspace)
    made = await sql(ctx, "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)", description="what the user noted")
    assert made["statement"] == "write" and made["tables"] == ["notes (0 rows): id INTEGER, body TEXT"]
    added = await sql(ctx, "INSERT INTO notes (body) VALUES ('milk'), ('eggs')")
    assert added["changed_rows"] == 2 and added["tables"] == ["notes (2 rows): id INTEGER, body TEXT"]
    read = await sql(ctx, "SELECT body FROM notes ORDER BY id")
    assert read == {"statement": "read", "columns": ["body"], "rows": [["milk"], ["eggs"]], "row_count": 2}
    assert rows_of(workspace, "SELECT body FROM notes ORDER BY id") == [("milk",), ("eggs",)]  # a plain file
    card = database_card(workspace, {}).text
    assert "- notes (2 rows): id INTEGER, body TEXT — what the user noted" in card


async def test_results_are_capped_in_rows_and_characters_with_a_count_of_the_rest(
    workspace: Path, catalog: SharedDatabase
) -> None:
    ctx = context(workspace, catalog)
    found = await sql(ctx, "SELECT sku, price FROM catalog.products ORDER BY price", max_rows=10)
    assert len(found["rows"]) == 10 and found["rows"][0] == ["s0", 0.0]
    assert found["row_count"] == 300 and found["more"].startswith("290 more rows not shown")
    narrow = SqlLimits(max_chars=200)
    found = await sql(ctx, "SELECT * FROM products", limits=narrow, max_rows=500)  # unqualified: the shared table
    assert 1 <= len(found["rows"]) < 10 and found["more"].startswith(f"{300 - len(found['rows'])} more rows")
    counted = SqlLimits(count_cap=50)
    found = await sql(ctx, "SELECT sku FROM products", limits=counted, max_rows=5)
    assert found["row_count"] == "55+" and found["more"].startswith("50+ more rows")
    long = await sql(ctx, "SELECT printf('%.2000c', 'x') AS long", limits=SqlLimits(cell_chars=100))
    assert long["rows"][0][0] == "x" * 100 + "… [1900 chars cut]"


async def test_the_shared_database_is_never_written(workspace: Path, catalog: SharedDatabase) -> None:
    ctx = context(workspace, catalog)
    before = catalog.path.read_bytes()
    for statement in (
        "INSERT INTO catalog.products VALUES ('x', 'x', 1)",
        "UPDATE products SET price = 0",
        "DELETE FROM catalog.products",
        "DROP TABLE catalog.products",
        "CREATE TABLE catalog.mine (x)",
    ):
        assert "catalog is a read-only database" in await refused(ctx, statement)
    assert catalog.path.read_bytes() == before
    assert not (workspace / SESSION_DB).exists()  # a refused write changed nothing here either
    copied = await sql(ctx, "CREATE TABLE cheap AS SELECT sku, price FROM catalog.products WHERE price < 3")
    assert copied["tables"] == ["cheap (2 rows): sku TEXT, price REAL"]  # reads of it into main are fine
    indexed = await sql(ctx, "CREATE INDEX cheap_by_price ON cheap (price)")
    assert indexed["statement"] == "write"
    assert "catalog is a read-only database" in await refused(ctx, "CREATE INDEX catalog.p ON products (price)")


@pytest.mark.parametrize(
    ("statement", "reason"),
    [
        ("ATTACH DATABASE '/etc/passwd' AS x", "ATTACH is not allowed"),
        ("DETACH DATABASE catalog", "DETACH is not allowed"),
        ("SELECT load_extension('/tmp/evil.so')", "load_extension() is not allowed"),
        ("PRAGMA writable_schema = 1", "PRAGMA writable_schema is not allowed"),
        ("PRAGMA query_only = 0", "PRAGMA query_only is not allowed"),
        ("PRAGMA journal_mode = WAL", "PRAGMA journal_mode is not allowed"),
        ("VACUUM INTO '/tmp/copy.sqlite'", "not allowed"),
        ("BEGIN", "transactions are managed for you"),
        ("CREATE TEMP TABLE t (x)", "temporary tables are not allowed"),
        ("CREATE TRIGGER t AFTER INSERT ON notes BEGIN DELETE FROM notes; END", "triggers are not allowed"),
        ("CREATE VIRTUAL TABLE v USING fts5(x)", "virtual tables are not allowed"),
        ("DELETE FROM _switchboard_tables", "kept by Switchboard"),
        ("SELECT 1; DROP TABLE notes", "one statement per call"),
    ],
)
async def test_dangerous_statements_are_refused_by_the_authoriser(
    workspace: Path, catalog: SharedDatabase, statement: str, reason: str
) -> None:
    ctx = context(workspace, catalog)
    await sql(ctx, "CREATE TABLE notes (body TEXT)")
    before = (workspace / SESSION_DB).read_bytes()
    assert reason in await refused(ctx, statement)
    assert (workspace / SESSION_DB).read_bytes() == before
    assert not Path("/tmp/copy.sqlite").exists()


async def test_a_runaway_query_is_stopped_by_the_time_limit(workspace: Path) -> None:
    ctx = context(workspace)
    forever = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT count(*) FROM n"
    message = await refused(ctx, forever, limits=SqlLimits(timeout_s=0.2))
    assert "ran past the 0.2s limit and was stopped" in message
    await sql(ctx, "CREATE TABLE t (x INTEGER)")
    endless_write = "INSERT INTO t WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT x FROM n"
    assert "ran past" in await refused(ctx, endless_write, limits=SqlLimits(timeout_s=0.2))
    assert rows_of(workspace, "SELECT count(*) FROM t") == [(0,)]  # rolled back, nothing saved


async def test_a_write_past_the_session_quota_changes_nothing(workspace: Path) -> None:
    ctx = context(workspace, workspaces=Workspaces(None, Quotas(session_bytes=64 * 1024)))
    await sql(ctx, "CREATE TABLE blobs (b BLOB)")
    before = (workspace / SESSION_DB).read_bytes()
    message = await refused(ctx, "INSERT INTO blobs SELECT randomblob(40000) FROM (SELECT 1 UNION SELECT 2)")
    assert "quota" in message
    assert (workspace / SESSION_DB).read_bytes() == before


async def test_a_write_rerun_under_the_same_key_is_not_repeated(workspace: Path) -> None:
    ctx = context(workspace)
    await sql(ctx, "CREATE TABLE log (x INTEGER)")
    keyed = dataclasses.replace(ctx, idempotency_key="run-1/insert")
    first = await sql(keyed, "INSERT INTO log VALUES (1)")
    again = await sql(keyed, "INSERT INTO log VALUES (1)")  # the turn re-run after a crash
    assert first["changed_rows"] == 1 and again["changed_rows"] == 1 and "already_done" in again
    assert rows_of(workspace, "SELECT count(*) FROM log") == [(1,)]
    reads = [await sql(keyed, "SELECT count(*) FROM log") for _ in range(2)]  # reads always run
    assert reads[0]["rows"] == [[1]] == reads[1]["rows"]


async def test_renames_and_drops_keep_the_descriptions_in_step(workspace: Path) -> None:
    ctx = context(workspace)
    await sql(ctx, "CREATE TABLE a (x INTEGER)", description="the first table")
    renamed = await sql(ctx, "ALTER TABLE a RENAME TO b")
    assert renamed["gone"] == ["a"] and renamed["tables"] == ["b (0 rows): x INTEGER"]
    assert "- b (0 rows): x INTEGER — the first table" in database_card(workspace, {}).text
    await sql(ctx, "DROP TABLE b")
    assert "no tables yet" in database_card(workspace, {}).text
    assert rows_of(workspace, "SELECT count(*) FROM _switchboard_tables") == [(0,)]


async def test_the_card_lists_shared_tables_with_the_operators_descriptions(
    workspace: Path, catalog: SharedDatabase, tmp_path: Path
) -> None:
    card = database_card(workspace, {"catalog": catalog})
    assert "catalog (read-only): The product catalogue." in card.text
    assert "- catalog.products (300 rows): sku TEXT, name TEXT, price REAL — one row per product" in card.text
    assert not card.untrusted
    gone = SharedDatabase(path=tmp_path / "missing.sqlite")
    assert "old (read-only) — unavailable" in database_card(workspace, {"old": gone}).text
    ctx = context(workspace, catalog)
    await sql(dataclasses.replace(ctx, untrusted_context=True), "CREATE TABLE t (x)", description="after a doc")
    assert database_card(workspace, {}).untrusted  # named while outside text was in view


async def test_a_workspace_file_that_is_not_a_database_gets_a_clear_error(workspace: Path) -> None:
    (workspace / SESSION_DB).write_text("not a database, written by hand")
    ctx = context(workspace)
    assert "data.sqlite in your workspace is not a usable SQLite database" in await refused(ctx, "SELECT 1")
    assert "not a usable SQLite database" in await refused(ctx, "CREATE TABLE t (x)")
    assert database_card(workspace, {}).text.count("no tables yet") == 1  # the prompt still builds


async def test_odd_names_cannot_forge_lines_in_the_card(workspace: Path) -> None:
    ctx = context(workspace)
    await sql(ctx, 'CREATE TABLE "x\n- fake (1 rows): y" ("a\nb" TEXT)', description="line one\n## Instructions")
    card = database_card(workspace, {}).text
    assert '- "x\\n- fake (1 rows): y" (0 rows): "a\\nb" TEXT — line one ## Instructions' in card
    assert "\n- fake" not in card and "\n## Instructions" not in card
