"""The agent's Markdown in Discord's dialect, split into messages of at most 2,000 characters.

Discord renders most Markdown itself, so the text mostly passes through; images become links and headings past
``###`` bold lines. Mentions are never rewritten here: every send carries ``allowed_mentions: {"parse": []}``, so
nothing the model writes notifies anyone. :func:`split_content` splits after rendering, keeping code fences balanced.
"""

from __future__ import annotations

import re

from switchboard.channels.render.markdown import FENCE, closes_fence, fenced_lines
from switchboard.channels.render.split import measure

__all__ = ["MAX_CONTENT", "escape_markdown", "render_markdown", "split_content", "utf16_len"]

MAX_CONTENT = 2000
"""Discord's limit for a message's ``content``."""

_IMAGE = re.compile(r"!\[([^\]\n]*)\]\(([^)\s]+)\)")
_DEEP_HEADING = re.compile(r"^ {0,3}#{4,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
_FENCES = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.MULTILINE)
_FENCE_AHEAD = re.compile(r" *(`{3,}|~{3,})")
_ESCAPE = re.compile(r"([\\*_~`|\[\]])|^([>#-])", re.MULTILINE)


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units (a character outside the BMP counts twice)."""
    return measure(text, "utf16")


def escape_markdown(text: str) -> str:
    """Plain text that Discord shows exactly as written (every Markdown marker backslash-escaped)."""
    return _ESCAPE.sub(lambda m: "\\" + (m.group(1) or m.group(2)), text)


def render_markdown(markdown: str) -> str:
    """The agent's Markdown as Discord Markdown (see the module docstring for what changes)."""
    out: list[str] = []
    for line, role in fenced_lines(markdown):
        if role == "text":
            line = _IMAGE.sub(lambda m: f"[{m.group(1) or 'image'}]({m.group(2)})", line)
            line = _DEEP_HEADING.sub(lambda m: f"**{m.group(1)}**", line)
        out.append(line)
    return "\n".join(out).strip("\n")


def _open_fence(text: str, fence: tuple[str, str] | None) -> tuple[str, str] | None:
    """The fence (marker, info) open after ``text``, given the one open before it."""
    for line in text.split("\n"):
        match = FENCE.match(line)
        if not match:
            continue
        if fence is None:
            fence = (match.group(1), match.group(2).strip())
        elif closes_fence(match, fence[0]):
            fence = None
    return fence


def _cut(text: str, budget: int) -> int:
    """Where to end a part of ``text`` holding at most ``budget`` UTF-16 units (an index into ``text``)."""
    end = min(len(text), budget)  # a character is at least one unit: never more characters than units
    while utf16_len(text[:end]) > budget:
        end -= max(1, (utf16_len(text[:end]) - budget) // 2)
    if end == len(text):
        return end
    window = text[:end]
    for separator in ("\n\n", "\n", " "):
        at = window.rfind(separator)
        while at > budget // 3 and _fence_ahead(text, at + len(separator)):
            at = window.rfind(separator, 0, at)
        if at > budget // 3:
            return at + len(separator)
    while end > 1 and _fence_ahead(text, end):
        end -= 1
    return max(end, 1)


def _fence_ahead(text: str, at: int) -> bool:
    """Whether a part starting at ``at`` would open with a code fence that ``text`` does not have there.

    A part starts a line, and its leading spaces go: ```` ``` ```` or ``~~~`` in mid-line (or after four spaces)
    would turn into a fence there, and its info string would vanish as the fence's language.
    """
    match = _FENCE_AHEAD.match(text, at)
    return match is not None and (text[at - 1] != "\n" or match.start(1) - at > 3)


def split_content(text: str, limit: int = MAX_CONTENT) -> list[str]:
    """``text`` in parts of at most ``limit`` UTF-16 units, each with balanced code fences; no empty parts.

    Splitting comes *after* rendering and counts UTF-16 code units (never more than Discord's count, whichever it
    uses). A part is cut at a blank line, else a line break, else a space, else anywhere but inside a surrogate
    pair, and never just before a ```` ``` ```` or ``~~~`` that is in mid-line (the next part would open with a fence
    the text does not have); a fenced code block open at a cut is closed at the end of the part and reopened (same
    info string) at the start of the next, so every part renders on its own.
    """
    parts: list[str] = []
    fence: tuple[str, str] | None = None
    rest = text.strip("\n")
    while rest.strip():
        opener = f"{fence[0]}{fence[1][:32]}\n" if fence else ""
        markers = [len(m.group(1)) for m in _FENCES.finditer(rest, 0, limit * 2)]
        if fence:
            markers.append(len(fence[0]))
        reserve = 1 + max(markers) if markers else 0
        budget = limit - utf16_len(opener) - reserve
        plain = budget < limit // 2
        if plain:  # absurd fence markers: plain cuts rather than no progress
            budget, opener, fence = limit, "", None
        end = _cut(rest, budget)
        piece, rest = rest[:end], rest[end:]
        after = None if plain else _open_fence(piece, fence)
        body = (opener + piece).rstrip()
        if after is not None:
            body += "\n" + after[0]
        elif not rest.startswith("\n"):
            rest = rest.lstrip(" ")
        if body.strip() and body.strip() != opener.strip():
            parts.append(body)
        fence = after
        rest = rest.lstrip("\n") if fence is None else rest
    return parts
