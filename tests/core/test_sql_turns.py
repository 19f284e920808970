"""Structured storage in whole turns: the model sees the tables in its context and queries them with ``sql``."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from switchboard.cli.agents import agent_problems
from switchboard.core.agent.config import Agent
from switchboard.core.agent.replay import ReplayModel
from switchboard.core.model import ModelRequest
from switchboard.core.sql.card import CARD_HEADING
from switchboard.core.sql.databases import SharedDatabase
from switchboard.core.turn import TurnRequest
from switchboard.core.workspaces.disk import workspace_for
from switchboard.errors import ConfigError
from switchboard.settings import load_file, load_settings

from .turns import MemorySink, MemoryStore, agent, answer_step, calls_step, message, runtime

SALES = "Region,Units\nnorth,3\nsouth,5\nnorth,4\n"


def turn(text: str, agent_: Agent, *, conversation: str = "c1", run_id: str = "run-1") -> TurnRequest:
    msg = message(text, conversation=conversation, id=f"{conversation}-{run_id}")
    return TurnRequest(
        session_key=msg.session_key, agent=agent_, messages=[msg], run_id=run_id, deadline=time.time() + 60
    )


def data_text(request: ModelRequest) -> str:
    """The session's ``data`` block of a request (never the system prompt)."""
    return "\n".join(m.content for m in request.messages if m.trust == "data")


def tool_json(content: str) -> dict[str, Any]:
    """A tool result as the model reads it (outside data comes inside a ``<data …>`` block)."""
    found: dict[str, Any] = json.loads(content[content.index("{") : content.rindex("}") + 1])
    return found


def shop(tmp_path: Path, *, codeact: bool = False) -> Agent:
    path = tmp_path / "catalog.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE products (sku TEXT, price REAL)")
    con.executemany("INSERT INTO products VALUES (?, ?)", [("a", 1.0), ("b", 2.5)])
    con.commit()
    con.close()
    catalog = SharedDatabase(path=path, description="Our catalogue.", tables={"products": "one row per product"})
    base = agent(tools=["read_document", "sql"], codeact=codeact)
    return base.model_copy(update={"databases": {"catalog": catalog}})


async def test_a_loaded_table_is_in_the_next_turns_context_and_queried_with_sql(tmp_path: Path) -> None:
    shop_agent = shop(tmp_path)
    rt = runtime(tmp_path)
    first = turn("load it", shop_agent)
    inbox = workspace_for(tmp_path / "ws", first.session_key) / "inbox"
    inbox.mkdir(parents=True)
    (inbox / "sales.csv").write_text(SALES)
    store = MemoryStore()
    load = calls_step(("read_document", {"path": "inbox/sales.csv", "into_table": "sales"}), step=1)
    model = ReplayModel([load, answer_step("Loaded.", step=2)])
    rt.models.override("offline", model)
    await rt.run_turn(first, MemorySink(), store)
    opening = data_text(model.requests[0])
    assert CARD_HEADING in opening and "no tables yet" in opening
    assert "- catalog.products (2 rows): sku TEXT, price REAL — one row per product" in opening
    assert CARD_HEADING not in model.requests[0].system  # names may come from documents: data, never system
    loaded = tool_json(model.requests[1].messages[-1].content)
    assert loaded["rows"] == 3 and [c["type"] for c in loaded["columns"]] == ["TEXT", "INTEGER"]

    query = "SELECT region, sum(units) AS units FROM sales GROUP BY region ORDER BY region"
    model = ReplayModel([calls_step(("sql", {"statement": query}), step=1), answer_step("north 7, south 5", step=2)])
    rt.models.override("offline", model)
    sink = MemorySink()
    result = await rt.run_turn(turn("totals?", shop_agent, run_id="run-2"), sink, store)
    assert "- sales (3 rows): region TEXT, units INTEGER — from inbox/sales.csv" in data_text(model.requests[0])
    rows = tool_json(model.requests[1].messages[-1].content)
    assert rows["rows"] == [["north", 7], ["south", 5]] and rows["row_count"] == 2
    assert [e.tool for e in sink.of("tool_called")] == ["sql"] and sink.of("tool_called")[0].ok
    assert result.text == "north 7, south 5"


async def test_a_codeact_program_calls_sql_as_a_function(tmp_path: Path) -> None:
    shop_agent = shop(tmp_path, codeact=True)
    code = (
        "sql(statement='CREATE TABLE picks (sku TEXT)', description='what the user picked')\n"
        'sql(statement="INSERT INTO picks SELECT sku FROM catalog.products WHERE price > 2")\n'
        "found = sql(statement='SELECT sku FROM picks')\n"
        "print(found['rows'])"
    )
    model = ReplayModel([calls_step(("run_program", {"code": code}), step=1), answer_step("done", step=2)])
    sink = MemorySink()
    await runtime(tmp_path, model=model).run_turn(turn("pick", shop_agent), sink, MemoryStore())
    program = tool_json(model.requests[1].messages[-1].content)
    assert program["output"].strip() == "[['b']]"
    assert [e.tool for e in sink.of("tool_called")] == ["sql", "sql", "sql", "run_program"]


async def test_one_sessions_database_is_invisible_to_another(tmp_path: Path) -> None:
    shop_agent = shop(tmp_path)
    rt = runtime(tmp_path)
    create = calls_step(("sql", {"statement": "CREATE TABLE secrets (x TEXT)", "description": "mine"}), step=1)
    rt.models.override("offline", ReplayModel([create, answer_step("ok", step=2)]))
    await rt.run_turn(turn("make", shop_agent, conversation="alice"), MemorySink(), MemoryStore())

    peek = calls_step(("sql", {"statement": "SELECT * FROM secrets"}), step=1)
    model = ReplayModel([peek, answer_step("nothing", step=2)])
    rt.models.override("offline", model)
    await rt.run_turn(turn("peek", shop_agent, conversation="bob"), MemorySink(), MemoryStore())
    assert "secrets" not in data_text(model.requests[0]) and "no tables yet" in data_text(model.requests[0])
    refused = tool_json(model.requests[1].messages[-1].content)
    assert "no such table: secrets" in refused["error"]


async def test_without_the_sql_tool_no_card_is_shown(tmp_path: Path) -> None:
    model = ReplayModel([answer_step("hi")])
    plain = shop(tmp_path).model_copy(update={"tools": ["current_time"]})
    await runtime(tmp_path, model=model).run_turn(turn("hi", plain), MemorySink(), MemoryStore())
    assert CARD_HEADING not in data_text(model.requests[0])


def test_yaml_paths_are_relative_to_the_config_file_and_names_are_checked(tmp_path: Path) -> None:
    config = tmp_path / "config" / "switchboard.yaml"
    config.parent.mkdir()
    config.write_text(
        "agents:\n  shop:\n    tools: [sql]\n    databases:\n"
        "      catalog:\n        path: data/catalog.sqlite\n        description: Our catalogue.\n"
        "        tables: {products: one row per product}\n"
        "default_agent: shop\n"
    )
    spec = load_file(config).agents["shop"].databases["catalog"]
    assert spec.path == tmp_path / "config" / "data" / "catalog.sqlite"
    assert spec.tables == {"products": "one row per product"}
    config.write_text("agents:\n  shop:\n    databases:\n      main: {path: x.sqlite}\ndefault_agent: shop\n")
    with pytest.raises(ConfigError, match="not main or temp"):
        load_file(config)


@pytest.mark.parametrize("loaded", [True, False])
async def test_a_table_loaded_from_a_document_makes_later_turns_untrusted(tmp_path: Path, loaded: bool) -> None:
    sender = shop(tmp_path).model_copy(update={"tools": ["read_document", "sql", "send_file"]})
    rt = runtime(tmp_path)
    first = turn("load", sender)
    inbox = workspace_for(tmp_path / "ws", first.session_key) / "inbox"
    inbox.mkdir(parents=True)
    (inbox / "sales.csv").write_text(SALES)
    store = MemoryStore()
    if loaded:
        load = calls_step(("read_document", {"path": "inbox/sales.csv", "into_table": "sales"}), step=1)
        rt.models.override("offline", ReplayModel([load, answer_step("Loaded.", step=2)]))
        await rt.run_turn(first, MemorySink(), store)
    send = calls_step(("send_file", {"path": "inbox/sales.csv"}), step=1)
    rt.models.override("offline", ReplayModel([send, answer_step("sent?", step=2)]))
    sink = MemorySink()
    await rt.run_turn(turn("send it", sender, run_id="run-2"), sink, store)
    [called] = sink.of("tool_called")
    # the card shows names from the document: a risky write now waits for a person's approval and does not run
    assert (called.error_class == "needs_approval") is loaded


def test_a_missing_database_file_is_a_problem_switchboard_check_names(tmp_path: Path) -> None:
    config = tmp_path / "switchboard.yaml"
    config.write_text("agents:\n  shop:\n    databases: {catalog: {path: catalog.sqlite}}\ndefault_agent: shop\n")
    settings = load_settings({"SWITCHBOARD_CONFIG": str(config), "SWITCHBOARD_DATA_DIR": str(tmp_path / "data")})
    shop_agent = settings.file.agent("shop")
    assert f"agent 'shop': database catalog has no file at {tmp_path / 'catalog.sqlite'}" in agent_problems(
        settings, shop_agent
    )
    sqlite3.connect(tmp_path / "catalog.sqlite").close()
    assert not [p for p in agent_problems(settings, shop_agent) if "database" in p]
