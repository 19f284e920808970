"""Memory through a whole turn with the offline model: the runtime shows the tools what the turn has in view."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.core.tools.builtin import default_registry
from switchboard.core.turn import HistoryEntry, TurnRequest
from switchboard.settings import FileConfig
from tests.core.turns import MemorySink, MemoryStore, agent, message, runtime

CONFIG: dict[str, Any] = {"projects": {"shop": {}}, "agents": {"a": {"name": "a", "projects": ["shop"]}}}


def _turn(text: str, message_id: str) -> TurnRequest:
    connected = agent(tools=[]).model_copy(update={"projects": ["shop"], "model": "offline"})
    msg = message(text, id=message_id)
    return TurnRequest(
        session_key=msg.session_key,
        agent=connected,
        messages=[msg],
        run_id=f"run-{message_id}",
        deadline=time.time() + 60,
    )


def _command(tool: str, args: dict[str, Any]) -> str:
    return f"/tool {tool} {json.dumps(args)}"


def _tool_entries(history: list[HistoryEntry]) -> list[HistoryEntry]:
    return [entry for entry in history if entry.role == "tool"]


async def test_remember_then_recall_with_the_offline_model(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path / "memory")
    config = FileConfig.model_validate(CONFIG)
    rt = runtime(tmp_path, registry=default_registry(sandbox=None, memory=(store, config.connected_projects)))
    try:
        said = {"kind": "message", "ref": "m1", "quote": "ships on Friday"}
        remember = _command("remember", {"text": "Ann's order ships on Friday", "source": said})
        sink = MemorySink()
        first = await rt.run_turn(_turn(remember, "m1"), sink, MemoryStore())
        (made,) = _tool_entries(first.history)
        assert "remembered" in made.text, made
        (changed,) = sink.of("memory_changed")
        assert changed.op == "remembered" and changed.run_id == "run-m1" and changed.agent == "a"

        invented = {"kind": "message", "ref": "m1", "quote": "Ann is a VIP"}  # cites m1, which is not this turn's
        refused = await rt.run_turn(
            _turn(_command("remember", {"text": "Ann is a VIP", "source": invented}), "m2"), MemorySink(), MemoryStore()
        )
        (answer,) = _tool_entries(refused.history)
        assert "not remembered" in answer.text and len(await store.facts("default", ["shop"])) == 1

        recalled = await rt.run_turn(_turn(_command("recall", {"query": "friday"}), "m3"), MemorySink(), MemoryStore())
        (found,) = _tool_entries(recalled.history)
        assert "Ann's order ships on Friday" in found.text and found.untrusted  # shown as outside data
    finally:
        store.close()
