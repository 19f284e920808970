"""The agent's Markdown as Messenger / Instagram plain text, and splitting by characters and by UTF-8 bytes."""

from __future__ import annotations

import random

import pytest

from switchboard.channels.render.plain import markdown_to_plain, render_parts, shorten

CASES = [
    ("plain words", "plain words"),
    ("**bold** and _it_ and ~~gone~~", "bold and it and gone"),
    ("[docs](https://example.com/docs)", "docs (https://example.com/docs)"),
    ("<https://example.com>", "https://example.com"),
    ("[https://example.com](https://example.com)", "https://example.com"),
    ("![a chart](https://example.com/c.png)", "a chart (https://example.com/c.png)"),
    ("[mail me](mailto:a@example.com)", "mail me (mailto:a@example.com)"),
    ("# Title\n\ntext", "Title\n\ntext"),
    ("1. one\n2. two", "1. one\n2. two"),
    ("- a\n  - nested", "• a\n  • nested"),
    ("> quoted\n> twice", "> quoted\n> twice"),
    ("```python\nprint('**x**')\n```", "print('**x**')"),
    ("`a*b*c`", "a*b*c"),
    ("| a | b |\n|---|---|\n| 1 | 2 |", "a | b\n1 | 2"),
    ("line one  \nline two", "line one\nline two"),
    ("<b>not html</b>", "<b>not html</b>"),
    ("---", "——————"),
    ("a\n\n---\n\nb", "a\n\n——————\n\nb"),
]


@pytest.mark.parametrize(("markdown", "plain"), CASES)
def test_markdown_becomes_what_a_reader_sees(markdown: str, plain: str) -> None:
    assert markdown_to_plain(markdown) == plain


def test_absurd_nesting_is_shown_as_written() -> None:
    deep = ">" * 200 + " x"
    assert markdown_to_plain(deep) == deep


@pytest.mark.parametrize("seed", range(30))
def test_bytes_parts_fit_and_lose_nothing(seed: int) -> None:
    rng = random.Random(seed)
    words = ["é", "naïve", "🚚", "👩‍💻", "日本", "plain", "a", "Ω", "\n", "\n\n"]
    text = " ".join(rng.choice(words) for _ in range(rng.randint(50, 900))).strip()
    parts = render_parts(text, 1000, "bytes")
    assert all(len(p.encode()) <= 1000 for p in parts)
    assert "".join(parts).split() == markdown_to_plain(text).split()


@pytest.mark.parametrize("seed", range(10))
def test_character_parts_fit(seed: int) -> None:
    rng = random.Random(seed)
    text = " ".join("x" * rng.randint(1, 30) for _ in range(rng.randint(100, 900)))
    parts = render_parts(text, 2000, "chars")
    assert all(len(p) <= 2000 for p in parts) and "".join(parts).split() == text.split()


def test_a_word_longer_than_the_limit_is_cut_between_characters() -> None:
    parts = render_parts("🙂" * 600, 1000, "bytes")
    assert [len(p.encode()) for p in parts] == [1000, 1000, 400]


def test_blank_markdown_is_no_message() -> None:
    assert render_parts("   \n\n ", 2000, "chars") == []


def test_labels_are_shortened_to_twenty_characters() -> None:
    assert shorten("Short", 20) == "Short"
    assert shorten("A label that is much too long", 20) == "A label that is muc…"
    assert len(shorten("x" * 50, 20)) == 20
