"""Deterministic compaction: turn boundaries, tool pairs kept together, the fixed record, the budget."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.agent.compaction import (
    SCHEMA,
    Compacted,
    compact,
    entry_chars,
    estimate_tokens,
    render_record,
    split_turns,
)
from switchboard.core.agent.prompt import _as_messages
from switchboard.core.turn import HistoryEntry

REPO = Path(__file__).resolve().parents[2]
TOOL_ARGS: dict[str, dict[str, Any]] = {
    "read_file": {"path": "notes/brief.md"},
    "web_fetch": {"url": "https://example.com/pricing"},
    "write_file": {"path": "out/report.md", "content": "..."},
    "update_plan": {"goal": "Book the venue", "progress": "shortlist done"},
    "offer_choice": {"question": "Which venue?", "options": ["Hall A", "Hall B"]},
}


def user(text: str, n: int) -> HistoryEntry:
    return HistoryEntry(role="user", text=text, message_id=f"m{n}", at=1_700_000_000 + n)


def assistant(text: str, n: int, calls: list[dict[str, Any]] | None = None) -> HistoryEntry:
    meta: dict[str, Any] = {"usage": {"input_tokens": 100, "output_tokens": 10}}
    if calls:
        meta["tool_calls"] = calls
    return HistoryEntry(role="assistant", text=text, at=1_700_000_000 + n + 0.5, meta=meta)


def tool(name: str, call_id: str, text: str, n: int, **meta: Any) -> HistoryEntry:
    side = "write" if name in {"write_file", "offer_choice"} else "read"
    return HistoryEntry(
        role="tool",
        text=text,
        at=1_700_000_000 + n + 0.7,
        meta={"tool": name, "call_id": call_id, "ok": True, "side_effect": side, "cost": 1.0, **meta},
    )


def conversation(turns: int, seed: int = 7) -> list[HistoryEntry]:
    """A deterministic conversation: every third turn calls a tool; sizes vary."""
    rng = random.Random(seed)
    entries: list[HistoryEntry] = []
    for n in range(1, turns + 1):
        entries.append(user(f"turn {n}: keep the budget under 5000 EUR. " + "detail " * rng.randint(0, 60), n))
        if n % 3 == 0:
            name = rng.choice(sorted(TOOL_ARGS))
            call = {"id": f"call-{n}", "name": name, "arguments": TOOL_ARGS[name]}
            entries.append(assistant("", n, [call]))
            entries.append(tool(name, f"call-{n}", "result " * rng.randint(1, 300), n, idempotency_key=f"key-{n}"))
        entries.append(assistant(f"answer {n}. " + "words " * rng.randint(0, 120), n))
    return entries


def test_a_conversation_within_budget_is_left_alone() -> None:
    entries = conversation(3)
    result = compact(entries, budget_chars=100_000)
    assert result == Compacted(recent=entries, record=None, rendered="")
    assert result.entries() == entries


def test_turns_start_at_user_messages_but_never_split_a_pending_call() -> None:
    call = {"id": "c1", "name": "read_file", "arguments": {"path": "a.md"}}
    entries = [
        user("first", 1),
        assistant("", 1, [call]),
        user("interjection while the tool runs", 2),  # arrived before the result
        tool("read_file", "c1", "contents", 2),
        assistant("done", 2),
        user("next", 3),
        assistant("ok", 3),
    ]
    turns = split_turns(entries)
    assert [[e.text for e in t] for t in turns] == [
        ["first", "", "interjection while the tool runs", "contents", "done"],
        ["next", "ok"],
    ]


def test_recent_turns_are_verbatim_and_cuts_keep_calls_with_results() -> None:
    entries = conversation(60)
    result = compact(entries, budget_chars=12_000, keep_recent_turns=4)
    assert result.record is not None
    assert result.recent[0].role == "user"
    assert entries[-len(result.recent) :] == result.recent  # verbatim, a suffix of the history
    asked = {c["id"] for e in result.recent for c in e.meta.get("tool_calls", [])}
    answered = {e.meta["call_id"] for e in result.recent if e.role == "tool"}
    assert asked == answered
    covered = result.record["covers"]["turn_to"]
    assert covered + len(split_turns(result.recent)) == 60
    assert result.record["covers"]["seq_to"] == len(entries) - len(result.recent)


def test_the_same_history_gives_byte_identical_output() -> None:
    first = compact(conversation(80), budget_chars=9_000)
    second = compact(conversation(80), budget_chars=9_000)
    assert first.record_json is not None
    assert first.record_json == second.record_json
    assert first.rendered == second.rendered
    assert first.record_sha256 == hashlib.sha256(first.record_json.encode()).hexdigest()
    assert compact(conversation(80, seed=8), budget_chars=9_000).record_sha256 != first.record_sha256


def test_output_is_identical_across_processes_and_hash_seeds() -> None:
    code = (
        "from tests.core.test_compaction import conversation;"
        "from switchboard.core.agent.compaction import compact;"
        "c = compact(conversation(120), budget_chars=9000);"
        "print(c.record_sha256, len(c.rendered), c.chars)"
    )
    outputs = set()
    for seed in ("1", "2", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True
        )
        outputs.add(done.stdout.strip())
    here = compact(conversation(120), budget_chars=9000)
    assert outputs == {f"{here.record_sha256} {len(here.rendered)} {here.chars}"}


@pytest.mark.parametrize("budget", [4_000, 16_000])
def test_a_200_turn_conversation_never_exceeds_the_budget(budget: int) -> None:
    entries = conversation(200)
    turn_count = 0
    for end in range(1, len(entries) + 1):
        if entries[end - 1].role != "user" and end != len(entries):
            continue  # compact at each point a new message arrives
        result = compact(entries[:end], budget_chars=budget)
        assert result.chars <= budget
        turn_count += 1
    assert sum(entry_chars(e) for e in entries) > 10 * budget  # it really had to fold
    assert turn_count == 201


def test_the_record_follows_the_fixed_schema_without_floats() -> None:
    plan_call = {"id": "p1", "name": "update_plan", "arguments": TOOL_ARGS["update_plan"]}
    choice_call = {"id": "q1", "name": "offer_choice", "arguments": TOOL_ARGS["offer_choice"]}
    write_call = {"id": "w1", "name": "write_file", "arguments": TOOL_ARGS["write_file"]}
    crash_call = {"id": "x1", "name": "write_file", "arguments": {"path": "lost.md", "content": "?"}}
    long_text = "Never book before Friday. " * 40
    entries = [
        user(long_text, 1),
        assistant("", 1, [plan_call]),
        tool("update_plan", "p1", "saved", 1),
        assistant("", 1, [{"id": "r1", "name": "read_file", "arguments": TOOL_ARGS["read_file"]}]),
        tool("read_file", "r1", "brief", 1, citations=[{"ref": "https://venues.example/a", "title": "Hall A"}]),
        assistant("", 1, [choice_call]),
        tool("offer_choice", "q1", "offered", 1),
        assistant("Pick one", 1),
        user("Hall B", 2),
        assistant("", 2, [write_call]),
        tool("write_file", "w1", "written", 2, idempotency_key="idem-1", resources=["file:out/report.md"]),
        assistant("", 2, [crash_call]),  # the worker died before the result was recorded
        HistoryEntry(
            role="assistant", text="Waiting on approval", meta={"approval": {"status": "pending", "tool": "send_email"}}
        ),
        user("thanks", 3),
        assistant("ok " * 400, 3),
        user("and now?", 4),
        assistant("done", 4),
    ]
    assert sum(entry_chars(e) for e in entries) > 3_000
    result = compact(entries, budget_chars=3_000, keep_recent_turns=2)
    record = result.record
    assert record is not None
    assert set(record) == {
        "schema", "session_id", "covers", "source_sha256", "prev", "user_constraints", "decisions", "open_questions",
        "tool_effects", "reads", "citations", "artifacts", "slots_at_end", "usage", "omitted",
    }  # fmt: skip
    assert record["schema"] == SCHEMA
    assert record["covers"] == {"turn_from": 1, "turn_to": 2, "seq_from": 1, "seq_to": 13}
    assert [u["text"] for u in record["user_constraints"]] == [long_text[:400], "Hall B"]
    assert [(d["kind"], d["turn"]) for d in record["decisions"]] == [("plan_change", 1), ("user_choice", 2)]
    assert record["decisions"][1]["text"] == "Which venue? → Hall B"
    assert [(q["kind"], q["text"]) for q in record["open_questions"]] == [("approval_pending", "send_email")]
    assert [(e["tool"], e["status"], e["idempotency_key"]) for e in record["tool_effects"]] == [
        ("offer_choice", "ok", None),
        ("write_file", "ok", "idem-1"),
        ("write_file", "unknown_after_crash", None),
    ]
    assert record["tool_effects"][1]["resources"] == ["file:out/report.md"]
    assert record["reads"] == {"read_file": 1}
    assert [c["ref"] for c in record["citations"]] == ["file:notes/brief.md", "https://venues.example/a"]
    assert [a["path"] for a in record["artifacts"]] == ["out/report.md"]
    assert record["slots_at_end"]["plan_sha256"] is not None
    assert record["usage"]["tool_calls"] == 5 and record["usage"]["cost_units"] == 4
    assert record["omitted"]["events"] == 13 and record["omitted"]["log_range"] == [1, 13]

    def no_floats(value: Any) -> None:
        assert not isinstance(value, float)
        for child in value.values() if isinstance(value, dict) else value if isinstance(value, list) else []:
            no_floats(child)

    no_floats(record)
    assert json.loads(result.record_json or "") == record
    assert "Which venue? → Hall B" in result.rendered and "unknown_after_crash" in result.rendered
    assert result.chars <= 3_000


def test_rendering_caps_each_section_with_overflow_lines() -> None:
    entries = [e for n in range(1, 41) for e in (user(f"constraint number {n}", n), assistant(f"ok {n}", n))]
    result = compact(entries, budget_chars=2_000, keep_recent_turns=2)
    assert result.record is not None
    lines = result.rendered.splitlines()
    start = lines.index("User said:") + 1
    said = lines[start : next(i for i in range(start, len(lines)) if not lines[i].startswith("- "))]
    assert said[0] == "- [t1] constraint number 1"
    overflow = next(line for line in said if line.startswith("- +"))
    skipped = [
        u for u in result.record["user_constraints"] if f"constraint number {u['turn']}\n" not in result.rendered + "\n"
    ]
    assert overflow == f"- +{len(skipped)} more (log {skipped[0]['ref_seq']}–{skipped[-1]['ref_seq']})"
    assert said[-1].startswith("- [t38] constraint number 38")
    counts_only = render_record(result.record, level=3)
    assert "Folded: 38 user messages." in counts_only and "constraint number" not in counts_only


def test_a_single_huge_turn_is_squeezed_without_dropping_entries() -> None:
    call = {"id": "c1", "name": "read_file", "arguments": {"path": "big.csv"}}
    entries = [user("summarise " + "x" * 20_000, 1), assistant("", 1, [call]), tool("read_file", "c1", "y" * 50_000, 1)]
    result = compact(entries, budget_chars=3_000)
    assert result.record is None
    assert [e.role for e in result.recent] == ["user", "assistant", "tool"]
    assert result.chars <= 3_000
    assert result.recent[2].meta["truncated_chars"] == 50_000 and "chars omitted" in result.recent[2].text
    with pytest.raises(ValueError, match="budget_chars"):
        compact(entries, budget_chars=100)


def test_entries_lead_with_the_rendered_record() -> None:
    result = compact(conversation(30), budget_chars=5_000)
    sent = result.entries()
    assert sent[0].meta == {"kind": "compaction", "record_sha256": result.record_sha256, "trust": "data"}
    assert sent[0].text == result.rendered and sent[1:] == result.recent
    shown = _as_messages(sent)  # as the prompt shows it: a labelled data block, not the user's words
    assert shown[0].trust == "data" and shown[0].content.startswith('<data source="history:compacted"')


def test_estimate_tokens_is_deterministic_and_leans_high_for_non_latin_text() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2
    assert estimate_tokens("日本語") == 3
    assert estimate_tokens("hello 世界") == 2 + 2


@pytest.mark.parametrize(
    ("options", "answer"),
    [
        ([{"id": "hall-b", "label": "Hall B"}, {"id": "hall-a", "label": "Hall A"}], "chose option hall-b (Hall B)"),
        (["Hall A", "Hall B"], "chose option hall-b (Hall B)"),  # plain labels: the click names the label
        ([{"id": "b", "label": "Hall B"}, {"id": "a", "label": "Hall A"}], "chose option b"),
    ],
)
def test_a_clicked_choice_is_recorded_as_the_users_decision(options: list[Any], answer: str) -> None:
    call = {"id": "q1", "name": "offer_choice", "arguments": {"question": "Which venue?", "options": options}}
    entries = [
        user("book a venue " * 100, 1),
        assistant("", 1, [call]),
        tool("offer_choice", "q1", "offered", 1),
        assistant("Pick one", 1),
        user(answer, 2),
        assistant("booked " * 200, 2),
        user("thanks", 3),
        assistant("ok " * 400, 3),
        user("and now?", 4),
        assistant("done", 4),
    ]
    record = compact(entries, budget_chars=2_000, keep_recent_turns=2).record
    assert record is not None
    assert [d["text"] for d in record["decisions"] if d["kind"] == "user_choice"] == [f"Which venue? → {answer}"]
