"""Markdown → Slack mrkdwn: escaping, formatting, mention neutralisation, splitting exactly at the limits."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from switchboard.channels.render.slack import (
    MAX_MESSAGE_CHARS,
    markdown_to_mrkdwn,
    neutralise_markdown,
    render_mrkdwn,
    slack_text_to_plain,
    split_mrkdwn,
)
from switchboard.channels.slack.fake.platform import check_mrkdwn, pings


@pytest.mark.parametrize(
    ("markdown", "mrkdwn"),
    [
        ("**bold** and __also__", "*bold* and *also*"),
        ("*it* _it_ ~~gone~~", "_it_ _it_ ~gone~"),
        ("a & b < c > d", "a &amp; b &lt; c &gt; d"),
        ("`x < 1`", "`x &lt; 1`"),
        ("[docs](https://example.com/a?b=1&c=2)", "<https://example.com/a?b=1&amp;c=2|docs>"),
        ("[js](javascript:alert(1))", "[js](javascript:alert(1))"),
        ("[ftp](ftp://x.y/z)", "ftp"),
        ("<https://example.com>", "<https://example.com>"),
        ("[x](https://a.b/|<!here>)", "<https://a.b/%7C%3C!here%3E|x>"),
        ("# Title", "*Title*"),
        ("- one\n- two", "• one\n• two"),
        ("3. three\n4. four", "3. three\n4. four"),
        ("> quoted\n> more", "> quoted\n> more"),
        ("```py\nif a < b:\n    pass\n```", "```\nif a &lt; b:\n    pass\n```"),
        ("** spaced **", "** spaced **"),
        ("| a | b |\n|---|---|\n| 1 | 2 |", "*a | b*\n1 | 2"),
        ("\ue001forged\ue002", "\ufffdforged\ufffd"),
        ("**two\nlines**", "*two*\n*lines*"),  # a span never holds a line break (see the quote below)
        ("> *it\nspans*", "> _it_\n> _spans_"),  # cut at its line break, `_> spans_` would show a literal >
        ("- > quoted", "• &gt; quoted"),  # mid-line a > is literal anyway: escaped, so the mrkdwn is well-formed
    ],
)
def test_rendering(markdown: str, mrkdwn: str) -> None:
    assert render_mrkdwn(markdown) == [mrkdwn]
    check_mrkdwn(mrkdwn)


@pytest.mark.parametrize(
    "hostile",
    ["<!channel>", "<!here|here>", "<!everyone>", "<@U024BE7LH>", "<!subteam^SAZ94GDB8>", "<@W123|boss>", "@here now"],
)
def test_mentions_from_model_output_never_fire(hostile: str) -> None:
    (rendered,) = render_mrkdwn(f"hey {hostile} look")
    assert pings(rendered) == []
    assert pings(neutralise_markdown(hostile)) == []
    assert pings(hostile) or "@here" in hostile  # the detector itself sees the raw form


def test_broadcast_words_get_a_word_joiner_but_addresses_do_not() -> None:
    assert render_mrkdwn("@channel and mail@here.com") == ["@\u2060channel and mail@here.com"]
    assert neutralise_markdown("@here and mail@here.com") == "@\u2060here and mail@here.com"


def test_neutralising_in_pieces_equals_neutralising_whole() -> None:
    text = "a <!here> b @channel c@d <@U1> @everyone"
    for cut in range(len(text) + 1):
        pieces = neutralise_markdown(text[:cut]) + neutralise_markdown(text[cut:], before=text[:cut])
        assert pieces == neutralise_markdown(text)


def test_a_message_of_exactly_the_limit_is_one_part() -> None:
    text = "a" * MAX_MESSAGE_CHARS
    assert render_mrkdwn(text) == [text]
    assert render_mrkdwn(text + "b") == ["a" * MAX_MESSAGE_CHARS, "b"]


def test_escapes_count_at_their_rendered_length_and_are_never_cut() -> None:
    text = "&" * 1500  # renders as 7,500 characters of &amp;
    parts = render_mrkdwn(text)
    assert [len(p) for p in parts] == [4000, 3500]
    for part in parts:
        check_mrkdwn(part)


def test_a_code_block_cut_in_two_is_closed_and_reopened() -> None:
    code = "\n".join(f"line {n} < {n + 1}" for n in range(600))
    parts = render_mrkdwn(f"Intro\n\n```\n{code}\n```\n\nOutro")
    assert len(parts) >= 3
    for part in parts:
        assert len(part) <= MAX_MESSAGE_CHARS
        check_mrkdwn(part)
    assert parts[1].startswith("```\n") and parts[-1].endswith("Outro")


def test_links_are_never_cut() -> None:
    link = "[label](https://example.com/" + "p" * 900 + ")"
    parts = render_mrkdwn(" ".join([link] * 10))
    for part in parts:
        check_mrkdwn(part)
        assert part.count("<") == part.count(">")


def test_bold_across_a_cut_is_closed_and_reopened() -> None:
    parts = split_mrkdwn(markdown_to_mrkdwn("**" + ("word " * 1000).strip() + "**"), 100)
    assert all(p.startswith("*") and p.endswith("*") and len(p) <= 100 for p in parts)


@pytest.mark.parametrize("limit", [20, 50, 3000, 4000])
def test_every_part_is_within_the_limit(limit: int) -> None:
    text = "**bold** & <tag> [l](https://x.y/z) `c & d`\n\n" * 300
    parts = render_mrkdwn(text, limit)
    assert all(len(p) <= limit for p in parts)
    for part in parts:
        check_mrkdwn(part)


_MD = st.lists(
    st.sampled_from([*"ab *_~`[]()<>&!@#|\n-:/.", "https://x.y", "<!here>", "```", "**", "\ue001", "word "]),
    max_size=200,
).map("".join)


_UNCUT = re.compile(r"<[^<>]*>|&(?:amp|lt|gt);")
"""What the splitter never cuts: a link, an escape."""


@settings(max_examples=300, deadline=None)
@given(markdown=_MD, limit=st.integers(min_value=12, max_value=200))
@example(markdown="```\nhttps://x.y", limit=12)  # a run of 8 characters in a code block: cut between characters
@example(markdown="```\na```!!", limit=12)  # the same, in defused backticks
@example(markdown="aaaa\n>aaaa*a\na*", limit=12)  # italics over a quote's line break: `_> a_`, a bare > mid-line
@example(markdown=" - >  ]", limit=84)  # a quote in a list item: `• > ]`, a bare > mid-line
@example(markdown="```\n&`b", limit=12)  # `&amp;` in a code block needs 13 characters
def test_any_markdown_renders_well_formed_within_limits_and_silent(markdown: str, limit: int) -> None:
    # A link or escape is never cut, and its part also closes what is open around it (at most 8 characters: a code
    # block's ``` and ```, or bold, italics, strike and code nested). A limit below that cannot be met (`&amp;` in a
    # code block at 12); the part then holds that one unit and its markup.
    longest = max((len(m.group()) for m in _UNCUT.finditer(markdown_to_mrkdwn(markdown))), default=0)
    for part in render_mrkdwn(markdown, limit):
        assert 0 < len(part) <= max(limit, longest + 8)
        assert pings(part) == []
        check_mrkdwn(part)


@pytest.mark.parametrize(
    ("slack", "plain"),
    [
        ("a &lt;b&gt; &amp; c", "a <b> & c"),
        ("see <https://x.y|the docs> or <https://z.w>", "see the docs (https://x.y) or https://z.w"),
        ("ask <@U123> in <#C456|general>", "ask @U123 in #general"),
        ("<!here> please", "@here please"),
        ("&amp;lt;", "&lt;"),
    ],
)
def test_slack_text_is_read_back_as_plain_text(slack: str, plain: str) -> None:
    assert slack_text_to_plain(slack) == plain
