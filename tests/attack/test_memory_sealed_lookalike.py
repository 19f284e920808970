"""Text that looks sealed: a value starting ``sb1:`` was taken for a sealed value, so in memory stored without keys
(the default) one remembered fact, passage or change reason starting so made every read that met it fail ("memory is
sealed at rest"): a hostile user poisoned recall for the whole project. With keys, such text must round-trip too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from switchboard.core.memory.facts import FactChange
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.core.sealing import Keyring, new_key
from tests.memory.conftest import Memory, Turn, build_memory, inbound
from tests.memory.test_sealing import NOW, _add, _fact

LOOKALIKES = ["sb1:k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA quokka", "sbp:quokka note", "sb1:quokka"]


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    built = build_memory(tmp_path)
    yield built
    built.store.close()


async def test_a_fact_that_looks_sealed_does_not_poison_recall(memory: Memory) -> None:
    turn = Turn(inbound=[inbound("the quokka code is sb1:quokka and Ann likes quokka plush toys", "m1")])
    remembered = []
    for text in [*LOOKALIKES, "Ann likes quokka plush toys"]:
        source = {"kind": "message", "quote": "Ann likes quokka plush toys"}
        outcome = await memory.call("remember", {"text": text, "source": source, "project": "shop"}, turn)
        assert outcome.ok, outcome
        remembered.append(outcome.value["remembered"])
    filler = "Filler words about nothing. " * 20
    document = f"A note on codes.\n\n{filler}\n\nsb1:quokka starts this paragraph. {filler}"  # its second passage
    source = {"kind": "message", "quote": "the quokka code"}
    args = {"text": document, "kind": "document", "source": source, "project": "shop"}
    assert (await memory.call("remember", args, turn)).ok
    found = await memory.call("recall", {"query": "quokka", "limit": 10}, turn)
    assert found.ok, found
    texts = {fact["text"] for fact in found.value["facts"] if fact["kind"] == "fact"}
    assert texts == {*LOOKALIKES, "Ann likes quokka plush toys"}
    assert any(fact["text"].startswith("sb1:quokka starts") for fact in found.value["facts"] if fact["kind"] != "fact")
    for fact_id, text in zip(remembered, LOOKALIKES, strict=False):
        read = await memory.call("read_memory", {"id": fact_id}, turn)
        assert read.ok and read.value["text"] == text, read


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
async def test_text_and_reasons_that_look_sealed_round_trip(tmp_path: Path, sealed: bool) -> None:
    store = SQLiteMemoryStore(tmp_path, Keyring.parse(new_key("k1")) if sealed else None)
    try:
        for number, text in enumerate(LOOKALIKES):
            await _add(store, _fact(f"f_0{number}", text), reason=text)
        assert [fact.text for fact in await store.facts("acme", ["shop"])] == LOOKALIKES
        assert [change.reason for change in await store.changes("acme")] == LOOKALIKES
        hits = await store.search("acme", ["shop"], "quokka", 5, NOW)
        assert sorted(hit.fact.text for hit in hits) == sorted(LOOKALIKES)
        change = FactChange(fact_id="f_00", project="shop", op="forgotten", actor="web:ann", reason="asked")
        await store.forget("acme", "f_00", change)
        assert await store.erase("acme", actor="web:ann") == 2
    finally:
        store.close()


async def test_plain_text_that_looks_sealed_survives_rotation_into_sealing(tmp_path: Path) -> None:
    plain = SQLiteMemoryStore(tmp_path)
    for number, text in enumerate(LOOKALIKES):
        await _add(plain, _fact(f"f_0{number}", text), reason=text)
    plain.close()
    store = SQLiteMemoryStore(tmp_path, Keyring.parse(new_key("k1")))
    try:
        assert await store.rotate("acme") == len(LOOKALIKES)
        assert [fact.text for fact in await store.facts("acme", ["shop"])] == LOOKALIKES
        assert [change.reason for change in await store.changes("acme")] == LOOKALIKES
        assert {hit.fact.text for hit in await store.search("acme", ["shop"], "quokka", 5, NOW)} == set(LOOKALIKES)
    finally:
        store.close()
