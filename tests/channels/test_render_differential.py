"""The renderers of ``channels/render/`` against the modules they replace: the same output for every sample.

Samples: every string in the tests that exercise rendering, every string in the sample payloads and model
recordings, and Markdown that hypothesis builds from the constructs the renderers handle.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchboard.channels.render import discord, plain, slack, split, teams, telegram, whatsapp
from switchboard.channels.render.actions import action_markdown
from switchboard.core.actions import Choice, OfferChoice, SendFile
from tests.channels.render_before import (
    discord_markdown,
    markdown,
    messaging_text,
    mrkdwn,
    teams_markdown,
    textsplit,
    whatsapp_format,
)

TESTS = Path(__file__).resolve().parent.parent
SOURCES = [
    *TESTS.glob("channels/test_*.py"),
    *TESTS.glob("attack/test_*.py"),
    *TESTS.glob("queue/test_stream*.py"),
]


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _samples() -> list[str]:
    found: set[str] = set()
    for path in SOURCES:
        if path.name == Path(__file__).name:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    for path in (TESTS / "payloads").rglob("*.json"):
        found.update(_strings(json.loads(path.read_text(encoding="utf-8"))))
    for path in (TESTS / "recordings").glob("*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                found.update(_strings(json.loads(line)))
    return sorted(found)


SAMPLES = _samples()

# (name, old, new): each takes the Markdown and returns what the channel sends.
PAIRS: list[tuple[str, Callable[[str], object], Callable[[str], object]]] = [
    ("telegram html", markdown.markdown_to_html, telegram.markdown_to_html),
    ("telegram parts", markdown.render_messages, telegram.render_messages),
    ("telegram 60", lambda m: markdown.render_messages(m, 60), lambda m: telegram.render_messages(m, 60)),
    ("telegram 9", lambda m: markdown.render_messages(m, 9), lambda m: telegram.render_messages(m, 9)),
    ("telegram split", lambda m: markdown.split_html(m, 17), lambda m: telegram.split_html(m, 17)),
    ("slack marked", mrkdwn.markdown_to_mrkdwn, slack.markdown_to_mrkdwn),
    ("slack parts", mrkdwn.render_mrkdwn, slack.render_mrkdwn),
    ("slack 50", lambda m: mrkdwn.render_mrkdwn(m, 50), lambda m: slack.render_mrkdwn(m, 50)),
    ("slack 7", lambda m: mrkdwn.render_mrkdwn(m, 7), lambda m: slack.render_mrkdwn(m, 7)),
    ("slack plain", mrkdwn.plain_mrkdwn, slack.plain_mrkdwn),
    ("slack neutral", mrkdwn.neutralise_markdown, slack.neutralise_markdown),
    ("slack read", mrkdwn.slack_text_to_plain, slack.slack_text_to_plain),
    ("discord", discord_markdown.render_markdown, discord.render_markdown),
    ("discord escape", discord_markdown.escape_markdown, discord.escape_markdown),
    (
        "discord parts",
        lambda m: discord_markdown.split_content(discord_markdown.render_markdown(m), 40),
        lambda m: discord.split_content(discord.render_markdown(m), 40),
    ),
    ("teams", teams_markdown.render_teams, teams.render_teams),
    ("teams parts", lambda m: teams_markdown.render_parts(m, 45), lambda m: teams.render_parts(m, 45)),
    ("teams neutral", teams_markdown.neutral_text, teams.neutral_text),
    ("whatsapp", whatsapp_format.render_whatsapp, whatsapp.render_whatsapp),
    ("whatsapp parts", lambda m: whatsapp_format.split_text(m, 30), lambda m: whatsapp.split_text(m, 30)),
    ("plain", messaging_text.markdown_to_plain, plain.markdown_to_plain),
    (
        "plain bytes",
        lambda m: messaging_text.render_parts(m, 40, "bytes"),
        lambda m: plain.render_parts(m, 40, "bytes"),
    ),
    ("plain short", lambda m: messaging_text.shorten(m, 20), lambda m: plain.shorten(m, 20)),
    (
        "split",
        lambda m: [textsplit.split_reply(m, n, u) for n in (5, 33) for u in ("chars", "bytes", "utf16")],
        lambda m: [split.split_reply(m, n, u) for n in (5, 33) for u in ("chars", "bytes", "utf16")],
    ),
    ("split head", lambda m: textsplit.split_head(m, 21, "utf16"), lambda m: split.split_head(m, 21, "utf16")),
]


def _same(text: str) -> None:
    for name, old, new in PAIRS:
        assert new(text) == old(text), (name, text)


def test_the_samples_are_many_and_render_the_same() -> None:
    assert len(SAMPLES) > 1000
    for text in SAMPLES:
        _same(text)


_PIECES = [
    "word",
    "two words",
    "@alice",
    "@here",
    "<!channel>",
    "<b>x</b>",
    "&amp;",
    "a & b",
    "**",
    "*",
    "_",
    "__",
    "~~",
    "`",
    "```",
    "~~~",
    "||",
    "#",
    "####",
    "> ",
    "- ",
    "* ",
    "1. ",
    "3) ",
    "    ",
    "\n",
    "\n\n",
    "|",
    "| a | b |\n|---|---|\n| 1 | 2 |",
    "---",
    "[link](https://example.com/a?b=1&c=<2>)",
    "[x](javascript:alert(1))",
    "![alt](https://example.com/i.png)",
    "<https://example.com>",
    "mailto:a@b.c",
    "[](tg://user?id=1)",
    "```python\nprint(1)\n```",
    "🙂",
    "日本語",
    "naïve",
    "\ue001",
    "\\",
    "\r\n",
    " ",
]
MARKDOWN = st.lists(st.sampled_from(_PIECES) | st.text(max_size=6), max_size=40).map("".join)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(MARKDOWN)
def test_generated_markdown_renders_the_same(text: str) -> None:
    _same(text)


@pytest.mark.parametrize(
    "action",
    [
        OfferChoice(question="When?", options=[Choice(id="a", label="Now"), Choice(id="b", label="Later")]),
        OfferChoice(question=" ", options=[Choice(id="a", label="Now")]),
        SendFile(path="/w/report.pdf", caption="Your **report**"),
        SendFile(path="chart.png"),
    ],
)
def test_actions_read_the_same(action: OfferChoice | SendFile) -> None:
    assert action_markdown(action) == markdown.action_markdown(action)
