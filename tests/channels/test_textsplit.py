"""Splitting a Markdown reply into messages within a channel's limit, in its length unit."""

from __future__ import annotations

import random

import pytest

from switchboard.channels.render.split import measure, split_head, split_reply


@pytest.mark.parametrize("unit", ["chars", "bytes", "utf16"])
def test_parts_fit_the_limit_in_its_unit_and_join_back_into_the_reply(unit: str) -> None:
    rng = random.Random(8)
    words = ["plain", "naïve", "日本語", "🙂🚀", "a" * 30, "\n", "\n\n", "word."]
    text = " ".join(rng.choice(words) for _ in range(3000))
    for limit in (7, 50, 333, 4096):
        parts = split_reply(text, limit, unit)  # type: ignore[arg-type]
        assert "".join(parts) == text
        assert all(0 < measure(part, unit) <= limit for part in parts)  # type: ignore[arg-type]


def test_cuts_prefer_paragraphs_then_lines_then_spaces() -> None:
    text = "first paragraph here\n\nsecond one is here\nwith a line"
    assert split_reply(text, 30) == ["first paragraph here\n\n", "second one is here\nwith a line"]
    assert split_reply("alpha beta gamma delta", 12) == ["alpha beta ", "gamma delta"]
    assert split_reply("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]


def test_a_code_block_cut_in_two_is_closed_and_reopened_with_its_language() -> None:
    code = "\n".join(f"print({n})" for n in range(40))
    text = f"Here:\n\n```python\n{code}\n```\n\nDone."
    parts = split_reply(text, 120)
    assert len(parts) > 2
    for part in parts:
        assert len(part) <= 120
        fences = [line for line in part.split("\n") if line.startswith("```")]
        assert len(fences) % 2 == 0  # every part renders on its own
    assert parts[1].startswith("```python\n")
    body = "".join(parts).replace("\n```\n```python\n", "\n").replace("\n``````python\n", "\n")
    assert all(f"print({n})" in body for n in range(40))


def test_a_reply_within_the_limit_is_one_part() -> None:
    assert split_reply("short", 4096) == ["short"]
    assert split_reply("", 10) == [""]


def test_the_head_is_the_first_part_and_the_rest_renders_alone() -> None:
    text = "intro words here\n\n```sh\n" + "echo line\n" * 20 + "```\nafter"
    head, rest = split_head(text, 60)
    assert head == split_reply(text, 60)[0]
    assert head.endswith("\n```") and rest.startswith("```sh\n")
    assert rest.endswith("```\nafter")
    assert split_head("short", 60) == ("short", "")


@pytest.mark.parametrize("reply", ["word " * 7 + "```py\nabc", "word " * 7 + "    ```py abc", "x" * 40 + "```py abc"])
def test_a_cut_never_makes_mid_line_backticks_open_a_code_block(reply: str) -> None:
    parts = split_reply(reply, 40)
    assert "".join(parts) == reply
    assert all(not part.lstrip(" ").startswith("```") for part in parts[1:])
