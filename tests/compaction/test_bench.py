"""The compaction measurement: the long scenarios run, and what each mode leaves in view is what it reports."""

from __future__ import annotations

from pathlib import Path

from bench.compaction import SCENARIOS, measure, read, table
from switchboard.evals.runner import run_scenarios
from switchboard.evals.scenario import load_scenarios


def _long() -> list:
    return [s for path in sorted(SCENARIOS.glob("*.yaml")) for s in load_scenarios(path)]


async def test_the_long_scenarios_pass_on_the_offline_model() -> None:
    results = await run_scenarios(_long(), concurrency=2)
    assert len(results) == 3
    assert [(r.id, r.error, [c.reason for c in r.checks if not c.passed]) for r in results if r.score < 1] == []


async def test_a_write_in_doubt_survives_compaction_and_facts_are_recalled() -> None:
    order = next(s for s in _long() if s.id == "long-order-in-doubt")
    rows = await measure([order], ["off", "deterministic"])
    off, deterministic = rows
    assert deterministic.folded > 0 and off.folded == 0  # the small budget did compact ...
    assert (off.pending, deterministic.pending) == ("kept", "kept")  # ... and the order was not placed twice
    assert (deterministic.recalled, deterministic.asked) == (1, 1)
    assert "long-order-in-doubt" in table(rows)


def test_the_reader_answers_only_from_what_it_is_shown() -> None:
    shown = {"input": [{"type": "message", "role": "user", "content": "Remember: the dock is Dock 9."},
                       {"type": "message", "role": "user", "content": "What is the dock?"}]}  # fmt: skip
    hidden = {"input": [{"type": "compaction", "encrypted_content": "x"},
                        {"type": "message", "role": "user", "content": "What is the dock?"}],
              "tools": [{"type": "function", "name": "search_history"}]}  # fmt: skip
    assert read(shown).text == "The dock is Dock 9."
    asked = read(hidden)
    assert asked.text == "" and [c.name for c in asked.calls] == ["search_history"]
    assert Path(SCENARIOS).name == "long"
