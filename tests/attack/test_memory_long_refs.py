"""Sources with long references (a URL may be 2,000 characters): remembering one failed with a misleading "invalid
arguments: reason" error (the change's reason embedded the whole reference), and ten of them pushed a recall result
past its inline bound, so the model got a card instead of the facts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.memory.conftest import Memory, Turn, build_memory, inbound


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    built = build_memory(tmp_path)
    yield built
    built.store.close()


def _url(number: int) -> str:
    return f"https://example.com/{number}/" + "é" * 1970


async def _remember_from_url(memory: Memory, turn: Turn, number: int) -> str:
    url = _url(number)
    turn.saw(f"c{number}", "web_fetch", {"url": url}, f"Parcel {number} goes to Paris by train")
    source = {"kind": "url", "ref": url, "call_id": f"c{number}", "quote": f"Parcel {number} goes to Paris"}
    args = {"text": f"Parcel {number} goes to Paris " + "x" * 380, "source": source, "project": "shop"}
    outcome = await memory.call("remember", args, turn)
    assert outcome.ok, outcome
    return str(outcome.value["remembered"])


async def test_a_source_with_a_long_reference_is_remembered(memory: Memory) -> None:
    turn = Turn(inbound=[inbound("hello", "m1")])
    fact_id = await _remember_from_url(memory, turn, 1)
    fact = await memory.store.get("acme", fact_id, ["shop"])
    assert fact is not None and fact.source.ref == _url(1)
    (change,) = await memory.store.changes("acme", fact_id)
    assert change.reason.startswith("from url https://example.com/1/") and len(change.reason) <= 500


async def test_a_link_with_the_longest_reason_is_made(memory: Memory) -> None:
    turn = Turn(inbound=[inbound("Ann likes trains and Bob likes boats", "m1")])
    ids = []
    for text in ("Ann likes trains", "Bob likes boats"):
        kept = await memory.call("remember", {"text": text, "source": {"kind": "message", "quote": text}}, turn)
        assert kept.ok, kept
        ids.append(kept.value["remembered"])
    first, second = ids
    outcome = await memory.call("link", {"fact_id": first, "to": second, "reason": "r" * 500}, turn)
    assert outcome.ok, outcome
    fact = await memory.store.get("acme", first, ["shop"])
    assert fact is not None and fact.links == (second,)


async def test_recall_of_facts_with_long_references_stays_inline(memory: Memory) -> None:
    turn = Turn(inbound=[inbound("hello", "m1")])
    for number in range(10):
        await _remember_from_url(memory, turn, number)
    found = await memory.call("recall", {"query": "parcel paris", "limit": 10}, turn)
    assert found.ok and found.tier == "inline", found
    assert len(found.value["facts"]) == 10
    assert all(fact["source"]["ref"].startswith("https://example.com/") for fact in found.value["facts"])
