"""Connected tables as an agent has them: YAML config, the tools it is given, calls through the gateway, the CLI."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from switchboard.core.agent.config import Agent
from switchboard.core.agent.prompt import build_prompt
from switchboard.core.agent.slots import Slots
from switchboard.core.tables.connections import TableConnections
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.effects import TurnEffects
from switchboard.core.tools.gateway import ToolGateway
from switchboard.types import SessionKey

AGENT = """
name: shop
profile: {{name: Shop}}
instructions: Answer about orders.
tools: [current_time]
databases:
  shop: {{path: {path}}}
tables:
  orders: {{database: shop, table: orders, permission: full, tenant_column: tenant_id, columns: [id, status]}}
  archive: {{database: shop, table: orders, permission: read, tenant_column: tenant_id}}
"""


def _database(tmp_path: Path) -> Path:
    path = tmp_path / "shop.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE orders (tenant_id TEXT, id INTEGER PRIMARY KEY, status TEXT)")
    con.executemany("INSERT INTO orders VALUES (?, ?, ?)", [("acme", 1, "open"), ("globex", 2, "open")])
    con.commit()
    con.close()
    return path


def _agent(tmp_path: Path) -> Agent:
    return Agent.model_validate(yaml.safe_load(AGENT.format(path=_database(tmp_path))))


def _ctx(tmp_path: Path, effects: TurnEffects, run_id: str = "run-1") -> ToolContext:
    return ToolContext(
        session_key=SessionKey("acme/shop/web/default/c"),
        tenant="acme",
        run_id=run_id,
        actor="u",
        workspace=tmp_path,
        idempotency_key="",
        effects=effects,
        agent="shop",
    )


def _rows(tmp_path: Path) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(tmp_path / "shop.sqlite")
    try:
        return con.execute("SELECT tenant_id, id, status FROM orders ORDER BY id").fetchall()
    finally:
        con.close()


def test_a_table_naming_an_unknown_database_is_refused(tmp_path: Path) -> None:
    raw = yaml.safe_load(AGENT.format(path=_database(tmp_path)))
    raw["tables"]["orders"]["database"] = "crm"
    with pytest.raises(ValidationError, match="no database 'crm'"):
        Agent.model_validate(raw)


def test_the_agent_gets_each_enabled_table_tool_once(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    registry = default_registry(sandbox=None, tables=TableConnections({"shop": agent}))
    names = [tool.name for tool in registry.for_agent(agent)]
    assert names == ["current_time", "table_query", "table_insert", "table_update", "table_delete"]
    assert sum(registry.get(n).cost for n in names if n.startswith("table_")) == 6  # type: ignore[union-attr]
    bare = agent.model_copy(update={"tables": {}})
    assert [tool.name for tool in registry.for_agent(bare)] == ["current_time"]


async def test_gateway_runs_table_calls_within_permission_and_tenant(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    gateway = ToolGateway(
        default_registry(sandbox=None, tables=TableConnections({"shop": agent})), workspace_root=tmp_path
    )
    effects = TurnEffects()
    found = await gateway.call("table_query", {"table": "orders"}, _ctx(tmp_path, effects))
    assert found.ok, found
    assert "open" in str(found.value) and "globex" not in str(found.value)

    refused = await gateway.call("table_insert", {"table": "archive", "values": {"id": 5}}, _ctx(tmp_path, effects))
    assert not refused.ok and refused.error_class == "auth"
    assert _rows(tmp_path) == [("acme", 1, "open"), ("globex", 2, "open")]

    row = {"table": "orders", "values": {"id": 3, "status": "new"}}
    first = await gateway.call("table_insert", row, _ctx(tmp_path, effects))
    again = await gateway.call("table_insert", row, _ctx(tmp_path, effects))  # the same turn re-run: same key
    assert first.ok and again.ok, (first, again)
    assert first.idempotency_key and first.idempotency_key == again.idempotency_key
    assert _rows(tmp_path) == [("acme", 1, "open"), ("globex", 2, "open"), ("acme", 3, "new")]

    bad = await gateway.call("table_query", {"table": "orders", "columns": ["tenant_id"]}, _ctx(tmp_path, effects))
    assert not bad.ok and bad.error_class == "validation"
    unknown = await gateway.call("table_query", {"table": "nope"}, _ctx(tmp_path, effects))
    assert not unknown.ok and "connected: archive, orders" in str(unknown.error)


def test_agents_show_prints_the_table_cost(base_env: dict[str, str], tmp_path: Path) -> None:
    agent = yaml.safe_load(AGENT.format(path=_database(tmp_path)))
    agent.pop("name")
    config = tmp_path / "tables.yaml"
    config.write_text(yaml.safe_dump({"default_agent": "shop", "agents": {"shop": agent}}))
    result = subprocess.run(
        [sys.executable, "-m", "switchboard", "agents", "show", "shop"],
        env=base_env | {"SWITCHBOARD_CONFIG": str(config)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "table cost:   6 (table_query 1 + table_insert 2 + table_update 2 + table_delete 1)" in result.stdout
    assert "tool cost:    7 (tools 1 + tables 6)" in result.stdout  # current_time, and two tables counted once
    assert "table archive: shop.orders read" in result.stdout


def test_the_model_is_told_its_tables_as_data(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    prompt = build_prompt(agent, Slots(), [], [], [], [], show_slots=False, text="my orders?")
    data = [m.content for m in prompt.messages if m.trust is not None]
    card = "\n".join(str(c) for c in data)
    assert "- orders (full: table_query, table_insert, table_update, table_delete; columns: id, status)" in card
    assert "- archive (read: table_query; columns: every column)" in card
    assert "table_query" not in str(prompt.system)
