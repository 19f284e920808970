"""Secrets in a tool call's arguments against the card the user (and the console) sees of it.

Real secrets never reach the model (it sees ``{{secret:NAME}}`` placeholders), so a secret in arguments is one a
person pasted or a tool printed. The card withholds, as ``[redacted]``: values under secret-looking keys at any depth
and in any casing; header lists given as ``[name, value]`` pairs; and token-shaped values under any key and inside
longer strings (an ``Authorization``/``Bearer``/``Basic`` credential, well-known key prefixes, a JWT), also in the
title. Anything else shows: a card that hid every long string would hide the command being run.
"""

from __future__ import annotations

import json
import time
from typing import Any, Final

import pytest

from switchboard.core.agent.toolcards import HEAD_CHARS, arguments_preview, output_parts, started, title_of
from switchboard.core.model import ToolCall

TOKEN: Final = "sk-proj-4f9aQ2mZ7xYbT1cVw8eRuN3k"
SHAPED: Final = (
    TOKEN,
    "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
    "xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy",
    "AKIAIOSFODNN7EXAMPLE",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
)


def _card(arguments: dict[str, Any], name: str = "http_request") -> str:
    card = started(ToolCall(id="c1", name=name, arguments=arguments), "m1")
    return card.title + "\n" + card.arguments


@pytest.mark.parametrize(
    "arguments",
    [
        {"headers": {"Authorization": f"Bearer {TOKEN}"}},
        {"HEADERS": {"AUTHORIZATION": TOKEN}},
        {"config": [{"nested": {"Api-Key": TOKEN}}]},
        {"x_auth": TOKEN},
        {"auth": TOKEN},
        {"passphrase": TOKEN},
        {"aws_access_key_id": TOKEN},
        {"headers": [["Authorization", f"Bearer {TOKEN}"]]},
        {"headers": [{"name": "X-Api-Key", "value": TOKEN}]},
        {"command": f"curl -H 'Authorization: Bearer {TOKEN}' https://api.example.com"},
        {"command": f"curl -H 'authorization: basic {TOKEN}' https://api.example.com"},
        {"url": f"https://api.example.com/v1?api_key={TOKEN}&q=1"},
    ],
)
def test_a_secret_in_the_arguments_never_reaches_the_card(arguments: dict[str, Any]) -> None:
    shown = _card(arguments)
    assert TOKEN not in shown, shown
    assert "[redacted]" in shown


@pytest.mark.parametrize("value", SHAPED)
def test_a_token_shaped_value_under_an_innocuous_key_is_redacted(value: str) -> None:
    for arguments in ({"value": value}, {"text": f"my key is {value} ok"}, {"items": [value]}):
        shown = _card(arguments)
        assert value not in shown, shown


def test_what_is_not_secret_still_shows() -> None:
    arguments = {"command": "ls -la /workspace && grep -r author notes/", "path": "outbox/report.md", "limit": 5}
    shown = _card(arguments, "shell")
    assert json.loads(arguments_preview(arguments)) == arguments
    assert title_of(ToolCall(id="c", name="shell", arguments=arguments)) in shown
    assert "grep -r author" in shown
    placeholder = {"headers": {"X-Trace": "{{secret:API_TOKEN}}"}}
    assert json.loads(arguments_preview(placeholder)) == placeholder  # a placeholder is no secret


def test_a_huge_argument_is_redacted_in_linear_time() -> None:
    """A megabyte of secret-looking words (a ``write_file`` of a hostile file) costs what its preview shows."""
    for payload in ("token" * 200_000, "x-api-key" * 100_000, "Bearer " * 150_000, "a" * 1_000_000):
        call = ToolCall(id="c", name="write_file", arguments={"path": "outbox/a", "content": payload})
        started_at = time.perf_counter()
        card = started(call, "m1")
        assert time.perf_counter() - started_at < 2.0, payload[:20]  # a guard: it took minutes when quadratic
        assert len(card.arguments) <= 500 and len(card.title) <= 120


@pytest.mark.parametrize(
    "output",
    ["x" * 10_000, "a\n" + "y" * 10_000 + "\nb", "\n".join("z" * 1000 for _ in range(30))],
)
def test_an_output_cut_inside_a_line_says_so(output: str) -> None:
    """A huge line is cut to what a card holds, and the card must not pass the cut part off as the whole output."""
    head, tail, omitted = output_parts(output)
    assert len(head) <= HEAD_CHARS and len(tail) <= HEAD_CHARS
    shown = head + "\n" + tail
    assert omitted > 0 or "…" in shown, (len(head), len(tail), omitted)
    assert all(part in output for part in shown.replace("…", "\n").split("\n"))  # nothing made up
