"""``switchboard eval record`` on hostile session content: the written case loads back exactly as recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from switchboard.control.replay import build_case, case_yaml
from switchboard.core.turn import HistoryEntry
from switchboard.evals.record import write_case
from switchboard.evals.scenario import Scenario, load_scenarios

HOSTILE = [
    "key: value",
    "&anchor *alias",
    "!!python/object/apply:os.system ['id']",
    "line one\nline two\n",
    "next\x85line",  # NEL: YAML reads it as a line break
    "p\n\x85q",
    "sep\u2028and\u2029para",
    " leading and trailing ",
    "---\n...",
    "yes",
    "x" * 3000 + " " + "y" * 200,
    "\ufeffbom",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_session_text_round_trips_exactly(tmp_path: Path, text: str) -> None:
    call = {"id": "c1", "name": "lookup", "arguments": {"q": text}}
    history = [
        HistoryEntry(role="user", text=text, message_id="m1"),
        HistoryEntry(role="assistant", text="", meta={"tool_calls": [call]}),
        HistoryEntry(
            role="tool", text=json.dumps({"v": text}), meta={"call_id": "c1", "ok": True, "side_effect": "read"}
        ),
        HistoryEntry(role="assistant", text=f"said: {text}", message_id="m1"),
    ]
    case = build_case("acme/desk/web/default/c1", history, [])
    out = tmp_path / "case.yaml"
    write_case(case_yaml(case), out)

    (loaded,) = load_scenarios(out)
    assert loaded == Scenario.model_validate(case)
    assert loaded.messages == [text]
    assert loaded.tools[0].responses[0].result == {"v": text}
