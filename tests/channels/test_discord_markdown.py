"""Discord Markdown: what passes through, what is rewritten, and splitting at 2,000 UTF-16 units with fences kept."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from switchboard.channels.render.discord import escape_markdown, render_markdown, split_content, utf16_len
from switchboard.channels.render.markdown import FENCE as _FENCE

settings_for_hypothesis = hypothesis_settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _balanced(part: str) -> bool:
    fence: str | None = None
    for line in part.split("\n"):
        match = _FENCE.match(line)
        if match is None:
            continue
        if fence is None:
            fence = match.group(1)
        elif match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence) and not match.group(2).strip():
            fence = None
    return fence is None


# rendering ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("**bold** and ||spoiler||", "**bold** and ||spoiler||"),
        ("![a chart](https://x.test/c.png)", "[a chart](https://x.test/c.png)"),
        ("#### Deep heading", "**Deep heading**"),
        ("```\n#### not a heading\n![x](y)\n```", "```\n#### not a heading\n![x](y)\n```"),
    ],
)
def test_render_markdown(markdown: str, expected: str) -> None:
    assert render_markdown(markdown) == expected


def test_split_exactly_at_the_limit() -> None:
    assert split_content("a" * 2000) == ["a" * 2000]
    assert split_content("a" * 2001) == ["a" * 2000, "a"]
    assert split_content("🙂" * 1000) == ["🙂" * 1000]  # 2,000 UTF-16 units
    assert [utf16_len(p) for p in split_content("🙂" * 1001)] == [2000, 2]
    assert split_content("   \n\n  ") == []


def test_split_reopens_a_code_fence_with_its_language() -> None:
    text = "```python\n" + "\n".join(f"print({i})" for i in range(600)) + "\n```"
    parts = split_content(text)
    assert len(parts) > 1 and all(p.startswith("```python\n") and p.endswith("\n```") for p in parts)
    assert all(utf16_len(p) <= 2000 for p in parts)
    assert re.findall(r"print\((\d+)\)", "".join(parts)) == [str(i) for i in range(600)]


def test_escape_markdown_keeps_mentions_and_mid_line_markers() -> None:
    assert escape_markdown("**x** <@1> a > b") == "\\*\\*x\\*\\* <@1> a > b"
    assert escape_markdown("> quoted\n# heading") == "\\> quoted\n\\# heading"


_PIECES = ["word", "🙂", "**b**", "`c`", " ", " ", " ", "\n", "\n\n", "```py\n", "\n```\n", "~~~\n", "> q ", "x"]


def test_a_cut_never_turns_mid_line_backticks_into_a_fence() -> None:
    """A part starts a line: ```` ```py ```` from mid-line there would open a code block and hide ``py``."""
    assert split_content("word" * 8 + "🙂" * 4 + "```py\n", 40) == ["word" * 8 + "🙂" * 3, "🙂```py"]
    for text in ("> q " * 9 + "```py\nabc", "x" * 39 + "~~~ tilde", "a\n" + "b" * 36 + "    ```py\nz"):
        parts = split_content(text, 40)
        assert not any(_FENCE.match(line) for part in parts for line in part.split("\n")), parts
        assert "".join("".join(parts).split()) == "".join(text.split())


@settings_for_hypothesis
@given(st.lists(st.sampled_from(_PIECES), max_size=400), st.integers(min_value=40, max_value=300))
@example(["word"] * 8 + ["🙂"] * 4 + ["```py\n"], 40)  # a hard cut right before a mid-line ```py: it became a fence
def test_split_property(pieces: list[str], limit: int) -> None:
    """Every part fits, none is empty, fences stay balanced, and every character arrives once, in order."""
    text = "".join(pieces)
    parts = split_content(text, limit)
    assert all(utf16_len(p) <= limit and p.strip() for p in parts)
    if _balanced(text):
        assert all(_balanced(p) for p in parts)

    def visible(s: str) -> str:  # a word longer than a part is cut inside: compare characters, not words
        return "".join(w for line in s.split("\n") if not _FENCE.match(line) for w in line.split())

    assert visible("\n".join(parts)) == visible(text)
