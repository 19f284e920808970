"""A table write and its idempotency record commit together (the ledger in the table's own database), so a worker
that dies between the write and the gateway's record leaves nothing in doubt; ``table_delete`` waits for a person."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path

import pytest
import yaml

from switchboard.core.agent.config import Agent
from switchboard.core.tables.backends import LEDGER_TABLE, PostgresBackend, SqliteBackend
from switchboard.core.tables.connections import TableConnections
from switchboard.core.tables.statements import Built
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.effects import EffectRecord, TurnEffects, effect_key, logical_action
from switchboard.core.tools.gateway import ToolGateway, action_sha256
from tests.tables.postgres import postgres_dsn
from tests.tables.test_connected import AGENT, _ctx, _database, _rows

__all__ = ["postgres_dsn"]

ROW = {"table": "orders", "values": {"id": 3, "status": "new"}}


class DyingEffects(TurnEffects):
    """The gateway's effect records, kept until the process dies right after the tool ran (before the record)."""

    dead = False

    async def effect_finish(self, key: str, record: EffectRecord | None) -> None:
        if not self.dead:
            self.dead = True
            raise SystemExit("the worker died before recording the write")
        await super().effect_finish(key, record)


def _gateway(tmp_path: Path) -> ToolGateway:
    """A worker's gateway over the agent's tables (the database made by the first one)."""
    path = tmp_path / "shop.sqlite"
    if not path.exists():
        _database(tmp_path)
    agent = Agent.model_validate(yaml.safe_load(AGENT.format(path=path)))
    return ToolGateway(
        default_registry(sandbox=None, tables=TableConnections({"shop": agent})), workspace_root=tmp_path
    )


async def test_a_worker_dying_after_the_commit_is_answered_from_the_ledger_and_never_repeated(tmp_path: Path) -> None:
    effects = DyingEffects()
    with pytest.raises(SystemExit):
        await _gateway(tmp_path).call("table_insert", ROW, _ctx(tmp_path, effects))
    [record] = effects.records.values()
    assert record.status == "started"  # the gateway's record never learnt the outcome
    assert _rows(tmp_path)[-1] == ("acme", 3, "new")

    rerun = await _gateway(tmp_path).call("table_insert", ROW, _ctx(tmp_path, effects))  # another worker, the turn
    assert (rerun.ok, rerun.value) == (True, {"table": "orders", "inserted": 1}), rerun
    assert _rows(tmp_path) == [("acme", 1, "open"), ("globex", 2, "open"), ("acme", 3, "new")]  # once
    assert effects.records[rerun.idempotency_key or ""].status == "done"


async def test_a_worker_dying_before_the_commit_leaves_a_write_the_rerun_performs_once(tmp_path: Path) -> None:
    effects = TurnEffects()
    tool = _gateway(tmp_path).registry.get("table_insert")
    assert tool is not None
    normalised = tool.input.model_validate(ROW).model_dump(mode="json")
    key = effect_key("run-1", "table_insert", logical_action(tool, normalised))
    # what a worker that died between its claim and the commit leaves: a claim, no row, no ledger entry
    effects.records[key] = EffectRecord(action_sha256("table_insert", normalised), tool="table_insert", run_id="run-1")

    rerun = await _gateway(tmp_path).call("table_insert", ROW, _ctx(tmp_path, effects))
    assert (rerun.ok, rerun.idempotency_key) == (True, key), rerun
    assert _rows(tmp_path)[-1] == ("acme", 3, "new") and len(_rows(tmp_path)) == 3


async def test_a_failed_write_leaves_no_ledger_entry(tmp_path: Path) -> None:
    effects = TurnEffects()
    clash = {"table": "orders", "values": {"id": 1, "status": "dup"}}  # id 1 exists: the insert fails
    out = await _gateway(tmp_path).call("table_insert", clash, _ctx(tmp_path, effects))
    assert not out.ok and out.error_class == "validation"
    con = sqlite3.connect(tmp_path / "shop.sqlite")
    try:
        assert con.execute(f"SELECT count(*) FROM {LEDGER_TABLE}").fetchone() == (0,)
    finally:
        con.close()


async def test_sqlite_runs_a_keyed_write_once(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (n INTEGER)")
    con.commit()
    con.close()
    backend = SqliteBackend(path)
    built = Built("INSERT INTO t VALUES (?)", (1,))
    assert [await backend.execute(built, timeout_s=5, key="k1") for _ in range(3)] == [1, 1, 1]
    assert await backend.execute(built, timeout_s=5, key="k2") == 1
    con = sqlite3.connect(path)
    try:
        assert con.execute("SELECT count(*) FROM t").fetchone() == (2,)
    finally:
        con.close()


async def test_postgres_runs_a_keyed_write_once_even_when_two_attempts_race(postgres_dsn: str) -> None:
    import asyncpg

    table = f"t_{uuid.uuid4().hex[:8]}"
    con = await asyncpg.connect(postgres_dsn)
    backend = PostgresBackend(postgres_dsn)
    try:
        await con.execute(f"CREATE TABLE {table} (n INTEGER)")
        built = Built(f"INSERT INTO {table} VALUES ($1)", (1,))
        assert await backend.execute(built, timeout_s=5, key=f"{table}-a") == 1
        assert await backend.execute(built, timeout_s=5, key=f"{table}-a") == 1
        raced = await asyncio.gather(*(backend.execute(built, timeout_s=5, key=f"{table}-b") for _ in range(4)))
        assert raced == [1, 1, 1, 1]
        assert await con.fetchval(f"SELECT count(*) FROM {table}") == 2
        with pytest.raises(Exception, match="PostgreSQL"):
            await backend.execute(Built(f"INSERT INTO {table} VALUES ('x')", ()), timeout_s=5, key=f"{table}-c")
        assert await con.fetchval(f"SELECT count(*) FROM {LEDGER_TABLE} WHERE key = $1", f"{table}-c") == 0
    finally:
        await backend.close()
        await con.close()


async def test_a_table_delete_waits_for_approval_and_deletes_nothing_before_it(tmp_path: Path) -> None:
    effects = TurnEffects()
    gateway = _gateway(tmp_path)
    ctx = _ctx(tmp_path, effects)
    delete = {"table": "orders", "where": [{"column": "id", "value": 1}]}
    asked = await gateway.call("table_delete", delete, ctx)
    assert (asked.ok, asked.error_class) == (False, "needs_approval"), asked
    assert asked.approval is not None and asked.approval.resources == ("table orders",)
    assert _rows(tmp_path) == [("acme", 1, "open"), ("globex", 2, "open")] and effects.records == {}

    done = await gateway.call("table_delete", delete, ctx, approved=asked.approval)
    assert (done.ok, done.value) == (True, {"table": "orders", "deleted": 1}), done
    assert _rows(tmp_path) == [("globex", 2, "open")]
