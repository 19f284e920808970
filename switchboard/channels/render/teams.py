"""The agent's Markdown as Teams shows it (``textFormat: markdown``), split into messages within Teams' limit.

Teams renders a Markdown subset in bot messages: bold, italic, strikethrough, headings, ordered and unordered lists,
block quotes, inline code, code blocks and links. It does not render tables in text messages, and it interprets
some HTML: so tables become code blocks (their columns stay aligned), and ``<``, ``>`` and ``&`` outside code are
written as entities — model output never becomes markup, an ``<at>`` mention that pings, or an image. Splitting is
done on the Markdown (``channels/render/split.py``: code blocks cut in two are closed and reopened) with room left for
what rendering adds, then each part is rendered.
"""

from __future__ import annotations

import re
from typing import Final

from switchboard.channels.render.markdown import parser
from switchboard.channels.render.split import RENDER_HEADROOM, measure, split_reply

__all__ = ["MAX_TEXT", "neutral_text", "render_parts", "render_teams"]

MAX_TEXT: Final = 16_000
"""The longest text of one message, in UTF-16 code units: well inside Teams' ~100 KB activity limit (40 KB in its
older documentation), whatever the script."""
_FENCE: Final = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN: Final = re.compile(r"(`+)(.+?)\1")
_ESCAPES: Final = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_MARKDOWN_CHARS: Final = re.compile(r"([\\`*_~\[\]#|-])")
_parser: Final = parser()


def _escape(text: str) -> str:
    return "".join(_ESCAPES.get(c, c) for c in text)


def _escape_line(line: str) -> str:
    """Escape ``<``, ``>`` and ``&`` outside code spans; a leading ``>`` (a quote) stays."""
    quote = re.match(r"^\s{0,3}(?:>\s?)+", line)
    head, body = (line[: quote.end()], line[quote.end() :]) if quote else ("", line)
    out, last = [], 0
    for span in _CODE_SPAN.finditer(body):
        out.append(_escape(body[last : span.start()]))
        out.append(span.group(0))
        last = span.end()
    out.append(_escape(body[last:]))
    return head + "".join(out)


def _tables(lines: list[str]) -> list[tuple[int, int]]:
    """Line ranges ``[start, end)`` of the Markdown tables in ``lines``."""
    return [
        (token.map[0], token.map[1])
        for token in _parser.parse("\n".join(lines))
        if token.type == "table_open" and token.map is not None
    ]


def render_teams(markdown: str) -> str:
    """One part of the reply as Teams Markdown."""
    lines = markdown.split("\n")
    tables = {start: end for start, end in _tables(lines)}
    out: list[str] = []
    fence: str | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        if fence is None and index in tables:
            out.append("```")
            out.extend(lines[index : tables[index]])
            out.append("```")
            index = tables[index]
            continue
        marker = _FENCE.match(line)
        if marker is not None and (fence is None or marker.group(1)[0] == fence[0]):
            fence = marker.group(1) if fence is None else None
            out.append(line)
        elif fence is not None:
            out.append(line)
        else:
            out.append(_escape_line(line))
        index += 1
    return "\n".join(out)


def render_parts(markdown: str, limit: int = MAX_TEXT) -> list[str]:
    """The reply as Teams Markdown messages, each within ``limit`` UTF-16 code units (no empty parts)."""
    parts = []
    for piece in split_reply(markdown, max(1, int(limit * RENDER_HEADROOM)), "utf16"):
        rendered = render_teams(piece)
        while measure(rendered, "utf16") > limit:  # entity-dense text: cut the rendered part further, by itself
            head = split_reply(rendered, limit, "utf16")
            parts.extend(head[:-1])
            rendered = head[-1]
        if rendered.strip():
            parts.append(rendered)
    return parts


def neutral_text(text: str) -> str:
    """``text`` shown literally in a Markdown message (an error notice): markup characters escaped."""
    return _escape(_MARKDOWN_CHARS.sub(r"\\\1", text))
