"""Splitting a Markdown reply into messages within a channel's length limit (the streaming policy's parts).

Cuts fall at the last paragraph break, else line break, else space in the second half of the allowance, else at
the limit itself; a part is an exact slice of the reply (joined, the parts are the reply again), except that a
code block cut in two is closed at the end of one part and reopened (with its language) at the start of the next.
Lengths are measured in the channel's unit: characters, UTF-8 bytes or UTF-16 code units.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["RENDER_HEADROOM", "measure", "split_head", "split_reply"]

RENDER_HEADROOM = 0.8
"""The share of ``max_text`` a Markdown part may take: rendering adds markup (tags, entities) to what is measured."""

_FENCE = "```"
_CLOSE = "\n" + _FENCE

Unit = Literal["chars", "bytes", "utf16"]


def measure(text: str, unit: Unit = "chars") -> int:
    """The length of ``text`` in ``unit``."""
    if unit == "chars":
        return len(text)
    if unit == "bytes":
        return len(text.encode("utf-8", "surrogatepass"))
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _fits(text: str, budget: int, unit: Unit) -> int:
    """The longest prefix length of ``text`` measuring at most ``budget`` (at least 1)."""
    if unit == "chars":
        return max(1, min(len(text), budget))
    low, high = 1, min(len(text), budget)
    while low < high:
        mid = (low + high + 1) // 2
        if measure(text[:mid], unit) <= budget:
            low = mid
        else:
            high = mid - 1
    return low


def _opens_fence(text: str, at: int) -> bool:
    """Whether a part starting at ``at`` would open with a code fence that ``text`` does not have there.

    Each part is a message of its own, so it starts a line: backticks in mid-line (or after four spaces) would
    become a fence there, and the words after them its language.
    """
    rest = text[at:]
    stripped = rest.lstrip(" ")
    if not stripped.startswith(_FENCE):
        return False
    return at > 0 and (text[at - 1] != "\n" or len(rest) - len(stripped) > 3)


def _cut(text: str, most: int) -> int:
    """Where to cut ``text`` within its first ``most`` characters: after a paragraph, line or word if possible."""
    if most >= len(text):
        return len(text)
    head = text[:most]
    for separator in ("\n\n", "\n", " "):
        at = head.rfind(separator)
        while at >= most // 2 and _opens_fence(text, at + len(separator)):
            at = head.rfind(separator, 0, at)
        if at >= most // 2:
            return at + len(separator)
    end = most
    while end > 1 and _opens_fence(text, end):
        end -= 1
    return end


def _fence_after(piece: str, fence: str | None) -> str | None:
    """The code fence still open after ``piece`` (``None`` if none), given the one open before it."""
    for line in piece.split("\n"):
        stripped = line.lstrip(" ")
        if len(line) - len(stripped) <= 3 and stripped.startswith(_FENCE):
            fence = None if fence is not None else stripped.rstrip()
    return fence


def _next(rest: str, fence: str | None, limit: int, unit: Unit) -> tuple[str, str, str | None]:
    """The next part of ``rest`` (a code block ``fence`` open before it), what is left, and the fence then open."""
    prefix = f"{fence}\n" if fence is not None else ""
    if measure(prefix + rest, unit) <= limit:
        return prefix + rest, "", None
    budget = max(1, limit - measure(prefix, unit))
    cut = _cut(rest, _fits(rest, budget, unit))
    if _fence_after(rest[:cut], fence) is not None:  # the part must close its code block: room for that
        cut = _cut(rest, _fits(rest, max(1, budget - len(_CLOSE)), unit))
    piece, rest = rest[:cut], rest[cut:]
    fence = _fence_after(piece, fence)
    body = prefix + piece
    if fence is not None:
        body = body.rstrip("\n") + _CLOSE
    return body, rest, fence


def split_reply(text: str, limit: int, unit: Unit = "chars") -> list[str]:
    """``text`` as parts of at most ``limit`` (in ``unit``) each; one part when it fits."""
    if measure(text, unit) <= limit:
        return [text]
    parts: list[str] = []
    rest, fence = text, None
    while rest:
        part, rest, fence = _next(rest, fence, limit, unit)
        parts.append(part)
    return parts


def split_head(text: str, limit: int, unit: Unit = "chars") -> tuple[str, str]:
    """The first part of ``text`` within ``limit``, and the rest (``""`` if none) as Markdown that renders alone.

    A code block the cut falls in is closed at the end of the first part and reopened at the start of the rest.
    """
    head, rest, fence = _next(text, None, limit, unit)
    return head, (f"{fence}\n{rest}" if fence is not None and rest else rest)
