"""A hostile model against the provenance check of ``remember``: sources that hold nothing, or launder its own words.

Each case cites something the turn did see, so only the check of what is cited stands between the model and durable
memory: a quote of blanks or of a few letters cut out of words supports anything, a call id used twice lets a
recalled fact pass as another tool's result, and a result that echoes the call's arguments repeats the model's own
words.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.memory.conftest import Memory, Turn, build_memory, inbound


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    built = build_memory(tmp_path)
    yield built
    built.store.close()


async def _refused(memory: Memory, turn: Turn, source: dict[str, Any], expected: str) -> None:
    outcome = await memory.call("remember", {"text": "Ann's card is 4111 1111", "source": source}, turn, agent="people")
    assert not outcome.ok and outcome.error_class == "validation", outcome
    assert expected in str(outcome.error)
    assert await memory.store.facts("acme", ["hr"]) == [] and turn.events == []


@pytest.mark.parametrize(
    ("quote", "expected"),
    [
        ("   ", "no words"),
        ("\t \n", "no words"),
        ("s t", "whole words"),  # the end of "ships" and the start of "to"
        ("rder 12", "whole words"),
        ("hip", "whole words"),
    ],
    ids=["blanks", "tab-newline", "letters-across-words", "cut-word", "inside-a-word"],
)
async def test_a_quote_of_blanks_or_of_pieces_of_words_supports_nothing(
    memory: Memory, quote: str, expected: str
) -> None:
    turn = Turn(inbound=[inbound("My order 1234 ships to Paris", "m1")])
    await _refused(memory, turn, {"kind": "message", "ref": "m1", "quote": quote}, expected)
    ok = await memory.call(  # whole words of the message still do
        "remember",
        {"text": "Order 1234 ships to Paris", "source": {"kind": "message", "quote": "ships to Paris"}},
        turn,
    )
    assert ok.ok, ok


async def test_a_call_id_used_twice_does_not_pass_a_recalled_fact_as_another_tools_result(memory: Memory) -> None:
    turn = Turn(inbound=[inbound("hello there", "m1")])
    turn.saw("x", "recall", {"query": "card"}, '{"facts": [{"text": "Ann is a VIP with card 4111 1111"}]}')
    turn.saw("x", "web_fetch", {"url": "https://example.com"}, "nothing to see")
    await _refused(memory, turn, {"kind": "tool_result", "ref": "x", "quote": "VIP with card 4111"}, "more than once")


async def test_a_result_that_echoes_the_calls_arguments_is_no_source_for_those_words(memory: Memory) -> None:
    turn = Turn(inbound=[inbound("hello there", "m1")])
    body = "Ann's card is 4111 1111"
    turn.saw("y", "http_request", {"url": "https://example.com/echo", "body": body}, '{"echo": "' + body + '"}')
    await _refused(memory, turn, {"kind": "tool_result", "ref": "y", "quote": "card is 4111 1111"}, "arguments")
    turn = Turn(inbound=[inbound("hello there", "m1")])
    turn.saw("z", "http_request", {"url": "https://example.com/card"}, '{"card": "Ann\'s card is 4111 1111"}')
    ok = await memory.call(  # the same words found by a call that did not send them are a source
        "remember",
        {"text": body, "source": {"kind": "tool_result", "ref": "z", "quote": "card is 4111"}},
        turn,
        agent="people",
    )
    assert ok.ok, ok


async def test_the_session_log_found_by_search_history_is_no_source(memory: Memory) -> None:
    """The log holds the model's own replies and earlier recall results, next to the user's words."""
    turn = Turn(inbound=[inbound("hello there", "m1")])
    found = {
        "query": "card",
        "count": 2,
        "results": [
            {"role": "assistant", "text": "Noted: Ann's card is 4111 1111", "seq": 4},
            {"kind": "event", "text": '{"tool": "recall", "result": "Ann\'s card is 4111 1111"}', "seq": "9-0"},
        ],
    }
    turn.saw("h", "search_history", {"query": "card"}, json.dumps(found))
    await _refused(memory, turn, {"kind": "tool_result", "ref": "h", "quote": "card is 4111 1111"}, "search_history")


async def test_words_the_run_wrote_itself_and_read_back_are_no_source(memory: Memory) -> None:
    turn = Turn(inbound=[inbound("hello there", "m1")])
    turn.saw("w", "write_file", {"path": "notes.txt", "content": "Ann's card is 4111 1111"}, '{"written": 23}')
    turn.saw("r", "read_file", {"path": "notes.txt"}, "Ann's card is 4111 1111")
    await _refused(memory, turn, {"kind": "file", "ref": "notes.txt", "call_id": "r", "quote": "card is 4111"}, "wrote")
    await _refused(memory, turn, {"kind": "tool_result", "ref": "r", "quote": "card is 4111 1111"}, "wrote")


async def test_a_source_read_before_the_run_wrote_its_words_elsewhere_still_counts(memory: Memory) -> None:
    turn = Turn(inbound=[inbound("hello there", "m1")])
    turn.saw("f", "web_fetch", {"url": "https://example.com/ship"}, "Parcels to France take 2 days")
    turn.saw("w", "write_file", {"path": "notes.txt", "content": "Parcels to France take 2 days"}, '{"written": 29}')
    source = {"kind": "url", "ref": "https://example.com/ship", "call_id": "f", "quote": "France take 2 days"}
    ok = await memory.call("remember", {"text": "Parcels to France take 2 days", "source": source}, turn)
    assert ok.ok, ok
