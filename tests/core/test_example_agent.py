"""The shipped example agent (`analyst` in config/switchboard.yaml) shows CodeAct, slots and tools offline."""

from __future__ import annotations

import json
from pathlib import Path

from switchboard.core.agent.runtime import Runtime
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import default_registry
from switchboard.settings import load_settings
from tests.core.turns import MemorySink, MemoryStore, request

CONFIG = Path(__file__).resolve().parents[2] / "config" / "switchboard.yaml"

PROGRAM = """/run update_plan(goal="total the sales", approach="CSV to data card", progress="started")
write_file(path="sales.csv", content="region,amount\\nnorth,10\\nsouth,32\\n")
card = read_document(path="sales.csv")
update_state(values={"rows": card["rows"]})
print("rows:", card["rows"])"""


async def test_analyst_runs_a_program_that_uses_slots_files_and_documents(tmp_path: Path) -> None:
    settings = load_settings({"SWITCHBOARD_CONFIG": str(CONFIG)})
    analyst = settings.file.agent("analyst")
    runtime = Runtime(models=ModelFactory(ProviderConfig()), tools=default_registry(), workspace_root=tmp_path)
    store, sink = MemoryStore(), MemorySink()

    result = await runtime.run_turn(request(PROGRAM, agent_=analyst), sink, store)

    assert "rows: 2" in result.text
    assert store.slots["plan"]["goal"] == "total the sales"
    assert store.slots["state"] == {"rows": 2}
    workspace_files = [p.name for p in tmp_path.rglob("*.csv")]
    assert workspace_files == ["sales.csv"]
    tools = [e.tool for e in sink.events if e.kind == "tool_called" and e.tool != "run_program"]
    assert tools == ["update_plan", "write_file", "read_document", "update_state"]

    # the next turn sees the plan again (slots are shown at the start of every turn), the program env is fresh
    again = await runtime.run_turn(request("/run print(card)", agent_=analyst, run_id="run-2"), sink, store)
    assert "card" in again.text and ("not defined" in again.text or "NameError" in again.text)
    assert json.dumps(store.slots["plan"])
