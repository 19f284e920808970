"""A blank text is no fact: ``remember`` and ``correct`` kept a fact (or a document) of spaces, which recall can
never find and which only crowds the project."""

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


@pytest.mark.parametrize("kind", ["fact", "document"])
@pytest.mark.parametrize("text", [" ", "\n\t \n", "\u3000\u2003"], ids=["space", "newlines-tabs", "wide-spaces"])
async def test_a_blank_text_is_neither_remembered_nor_a_correction(memory: Memory, kind: str, text: str) -> None:
    turn = Turn(inbound=[inbound("Ann prefers email over phone", "m1")])
    source = {"kind": "message", "quote": "prefers email"}
    refused = await memory.call("remember", {"text": text, "kind": kind, "source": source, "project": "shop"}, turn)
    assert not refused.ok and refused.error_class == "validation" and "blank" in str(refused.error), refused
    assert await memory.store.facts("acme", ["shop"]) == []
    kept = await memory.call("remember", {"text": "Ann prefers email", "kind": kind, "source": source}, turn)
    assert kept.ok, kept
    fact_id = kept.value["remembered"]
    args = {"fact_id": fact_id, "text": text, "source": source, "reason": "blanking it"}
    corrected = await memory.call("correct", args, turn)
    assert not corrected.ok and corrected.error_class == "validation" and "blank" in str(corrected.error), corrected
    fact = await memory.store.get("acme", fact_id, ["shop"])
    assert fact is not None and fact.text == "Ann prefers email"
