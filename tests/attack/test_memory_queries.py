"""A hostile model's recall queries and documents: FTS5 syntax, odd scripts and sizes never raise, leak or crawl.

The query's words are quoted one by one into the FTS5 expression, so operators, column filters, NUL bytes and
punctuation are only words (or nothing); a document of the largest size in a pathological shape is cut into a
bounded number of passages in linear time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchboard.core.memory.chunks import PASSAGE_CHARS, passages
from switchboard.core.memory.facts import MAX_DOCUMENT_CHARS
from tests.memory.conftest import Memory, Turn, build_memory, inbound

QUERIES = [
    '"',
    '"unbalanced',
    "NEAR(order paris, 2)",
    "order*",
    "^order",
    "text: secret",
    "terms:secret",
    "order AND",
    "OR OR OR",
    "NOT secret",
    "(((",
    "order) OR (secret",
    "\x00",
    "order\x00secret",
    "!!!",
    "-- ; DROP TABLE facts",
    "😀😀",
    "東京",
    "مرحبا",
    "_",
    "x" * 200,
    "a\u0301",
    "{secret}",
    "secret:",
]


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    built = build_memory(tmp_path)
    yield built
    built.store.close()


async def test_fts5_syntax_in_a_query_is_only_words(memory: Memory) -> None:
    turn = Turn(inbound=[inbound("My order ships to Paris and the secret word is swordfish", "m1")])
    for text, agent in (
        ("Order ships to Paris", "support"),
        ("The secret is swordfish", "people"),  # in hr, which support is not connected to
    ):
        source = {"kind": "message", "quote": text.split()[-1]}
        assert (await memory.call("remember", {"text": text, "source": source}, turn, agent=agent)).ok
    for query in QUERIES:
        started = time.perf_counter()
        outcome = await memory.call("recall", {"query": query}, turn)
        assert outcome.ok, (query, outcome)
        assert time.perf_counter() - started < 2
        assert all(fact["project"] == "shop" for fact in outcome.value["facts"]), query  # hr is not connected
    found = await memory.call("recall", {"query": "NEAR(order paris)"}, turn)
    assert [fact["text"] for fact in found.value["facts"]] == ["Order ships to Paris"]  # the words still count


@pytest.mark.parametrize(
    "text",
    [
        "x" * MAX_DOCUMENT_CHARS,
        ("word " * MAX_DOCUMENT_CHARS)[:MAX_DOCUMENT_CHARS],
        ("a. " * MAX_DOCUMENT_CHARS)[:MAX_DOCUMENT_CHARS],
        "\n" * (MAX_DOCUMENT_CHARS - 1) + "x",
        (" \n\n" * MAX_DOCUMENT_CHARS)[: MAX_DOCUMENT_CHARS - 1] + "y",
        ("one giant sentence without a stop " * 3000)[:MAX_DOCUMENT_CHARS],
    ],
    ids=["no-spaces", "words", "tiny-sentences", "newlines", "blank-paragraphs", "one-sentence"],
)
async def test_a_document_of_the_largest_size_is_cut_in_bounded_time(memory: Memory, text: str) -> None:
    started = time.perf_counter()
    pieces = passages(text)
    assert time.perf_counter() - started < 2
    assert len(pieces) <= 4 * MAX_DOCUMENT_CHARS // PASSAGE_CHARS + 1
    assert all(len(piece.text) <= PASSAGE_CHARS for piece in pieces)
    assert all(text[piece.start : piece.start + len(piece.text)] == piece.text for piece in pieces)
    turn = Turn(inbound=[inbound("keep this document please", "m1")])
    source = {"kind": "message", "quote": "keep this document"}
    started = time.perf_counter()
    outcome = await memory.call("remember", {"text": text, "kind": "document", "source": source}, turn)
    assert outcome.ok, outcome
    assert time.perf_counter() - started < 10


@pytest.mark.parametrize(("offset", "length"), [(-1, 10), (MAX_DOCUMENT_CHARS + 1, 10), (0, 0), (0, 10**9)])
async def test_read_memory_refuses_ranges_out_of_bounds(memory: Memory, offset: int, length: int) -> None:
    turn = Turn(inbound=[inbound("keep this document please", "m1")])
    source = {"kind": "message", "quote": "keep this document"}
    kept = await memory.call("remember", {"text": "Some document text.", "kind": "document", "source": source}, turn)
    outcome = await memory.call(
        "read_memory", {"id": kept.value["remembered"], "offset": offset, "length": length}, turn
    )
    assert not outcome.ok and outcome.error_class == "validation", outcome
