"""A fact is remembered only with a source the turn has seen, and the quoted words in it: nothing plausible is kept."""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.core.events import MemoryChanged
from switchboard.core.turn import HistoryEntry
from tests.memory.conftest import Memory, Turn, inbound


def _turn() -> Turn:
    turn = Turn(inbound=[inbound("My order 1234 ships to 5 Rue Lepic, Paris", "m1")])
    turn.history.append(HistoryEntry(role="user", text="I prefer email over phone calls", message_id="m0"))
    document = "Attached contract: the customer owes 5000 EUR"  # outside text in a user entry
    turn.history.append(HistoryEntry(role="user", text=document, message_id="m-1", meta={"trust": "data"}))
    turn.saw("call_a", "read_file", {"path": "notes.txt"}, "Warehouse closes at 18:00 on Fridays")
    turn.saw("call_b", "web_fetch", {"url": "https://example.com/ship"}, "Parcels to France take 2 days")
    turn.saw("call_r", "recall", {"query": "vip"}, '{"facts": [{"text": "Ann is a VIP customer"}]}')
    return turn


CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("the turn's message, by id", {"kind": "message", "ref": "m1", "quote": "ships to 5 Rue Lepic"}, None),
    ("a history message, any", {"kind": "message", "quote": "prefer  EMAIL over"}, None),
    ("a tool result of this run", {"kind": "tool_result", "ref": "call_a", "quote": "closes at 18:00"}, None),
    ("a file a call read", {"kind": "file", "ref": "notes.txt", "call_id": "call_a", "quote": "18:00 on"}, None),
    (
        "a URL a call read",
        {"kind": "url", "ref": "https://example.com/ship", "call_id": "call_b", "quote": "take 2 days"},
        None,
    ),
    ("a message not in the conversation", {"kind": "message", "ref": "m9", "quote": "ships to"}, "not in this conv"),
    ("words the message does not hold", {"kind": "message", "ref": "m1", "quote": "ships to London"}, "quote is not"),
    ("a made-up quote, any message", {"kind": "message", "quote": "Ann is a VIP"}, "quote is not"),
    ("a document in the history", {"kind": "message", "ref": "m-1", "quote": "owes 5000"}, "not in this conv"),
    ("a call of no run", {"kind": "tool_result", "ref": "call_zz", "quote": "closes at"}, "no result in this run"),
    ("words the result does not hold", {"kind": "tool_result", "ref": "call_a", "quote": "opens at 9"}, "quote is not"),
    (
        "a file the call did not read",
        {"kind": "file", "ref": "x.txt", "call_id": "call_a", "quote": "18:00"},
        "did not",
    ),
    ("a file without its call", {"kind": "file", "ref": "notes.txt", "quote": "18:00"}, "needs its ref and the call"),
    ("a URL without its call", {"kind": "url", "ref": "https://example.com/ship", "quote": "2 days"}, "call_id"),
    ("memory's own output", {"kind": "tool_result", "ref": "call_r", "quote": "VIP customer"}, "memory itself"),
    ("no quote at all", {"kind": "message", "ref": "m1"}, "quote"),
    ("an unknown kind", {"kind": "rumour", "quote": "ships to"}, "kind"),
]


@pytest.mark.parametrize(("source", "refused"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
async def test_a_fact_is_kept_only_with_a_source_the_turn_has_seen(
    memory: Memory, source: dict[str, Any], refused: str | None
) -> None:
    turn = _turn()
    outcome = await memory.call("remember", {"text": "A fact about Ann", "source": source}, turn, agent="people")
    stored = await memory.store.facts("acme", ["hr"])
    if refused is None:
        assert outcome.ok, outcome
        assert [fact.id for fact in stored] == [outcome.value["remembered"]]
        assert stored[0].source.model_dump(exclude_defaults=True) == source
        assert stored[0].run_id == "run-1" and stored[0].project == "hr" and stored[0].tenant == "acme"
        (event,) = turn.events
        assert isinstance(event, MemoryChanged) and event.op == "remembered" and event.source_kind == source["kind"]
        assert "Ann" not in event.model_dump_json()  # ids, never the fact's text
    else:
        assert not outcome.ok and outcome.error_class == "validation", outcome
        assert refused in str(outcome.error)
        assert stored == [] and await memory.store.changes("acme") == [] and turn.events == []


async def test_a_call_with_no_conversation_in_view_remembers_nothing(memory: Memory) -> None:
    source = {"kind": "message", "quote": "ships to 5 Rue Lepic"}
    outcome = await memory.call("remember", {"text": "Ships to Paris", "source": source}, None)
    assert not outcome.ok and "no conversation to cite" in str(outcome.error)
    assert await memory.store.facts("acme", ["shop"]) == []


async def test_a_correction_needs_a_source_too(memory: Memory) -> None:
    turn = _turn()
    source = {"kind": "message", "ref": "m1", "quote": "ships to 5 Rue Lepic"}
    made = await memory.call("remember", {"text": "Order 1234 ships to Paris", "source": source}, turn)
    assert made.ok, made
    fact_id = made.value["remembered"]
    bad = {"kind": "message", "ref": "m1", "quote": "ships to Lyon"}
    refused = await memory.call(
        "correct", {"fact_id": fact_id, "text": "Ships to Lyon", "source": bad, "reason": "moved"}, turn
    )
    assert not refused.ok and "quote is not" in str(refused.error)
    (fact,) = await memory.store.facts("acme", ["shop"])
    assert fact.text == "Order 1234 ships to Paris" and fact.updated_at is None
    assert [change.op for change in await memory.store.changes("acme")] == ["remembered"]
