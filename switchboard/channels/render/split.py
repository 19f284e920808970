"""Splitting a reply into messages within a channel's length limit.

:func:`split_reply` cuts Markdown, :func:`split_marks` rendered markup given as :class:`Mark` tokens; both keep every
part balanced on its own. Lengths are measured in the channel's unit: characters, UTF-8 bytes or UTF-16 code units.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = ["RENDER_HEADROOM", "Mark", "Unit", "measure", "split_head", "split_marks", "split_reply"]

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
    """``text`` as parts of at most ``limit`` (in ``unit``) each; one part when it fits.

    It cuts *Markdown* (the streaming policy's parts, and the dialects that render after splitting or pass Markdown
    through): cuts fall at the last paragraph break, else line break, else space in the second half of the allowance,
    else at the limit itself; a part is an exact slice of the reply (joined, the parts are the reply again), except that
    a code block cut in two is closed at the end of one part and reopened (with its language) at the start of the next.
    Lengths are measured in the channel's unit: characters, UTF-8 bytes or UTF-16 code units.
    """
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


class Mark(NamedTuple):
    """One token of rendered markup: a span opening or closing, or a piece of text the splitter never cuts."""

    kind: Literal["open", "close", "text"]
    value: str
    name: str = ""
    """The span's name (``open``/``close``): a close matches the innermost open of the same name."""
    width: int = 0
    """What ``value`` counts towards the limit."""
    closer: str = ""
    """For ``open``: what closes the span at a cut."""
    closing: int = 0
    """For ``open``: what ``closer`` counts towards the limit once the part is finished."""


@dataclass(frozen=True, slots=True)
class _Cut:
    end: int
    """Index of the first token of the next part."""
    cost: int
    """Width of the part up to here, without the closers."""
    stack: tuple[Mark, ...]
    """Spans open at the cut."""


def _next_cut(tokens: list[Mark], start: int, stack: tuple[Mark, ...], limit: int) -> _Cut:
    """Where the part that starts at ``start`` (with ``stack`` reopened) ends.

    The latest blank line, else line end, else space that keeps the part at least half full; else as far as the
    limit allows (never less than one text token, so splitting ends).
    """
    current = list(stack)
    cost = sum(tok.width for tok in stack)
    closing = sum(tok.closing for tok in stack)
    best: dict[int, _Cut] = {}
    last: _Cut | None = None
    previous = ""
    for index in range(start, len(tokens)):
        tok = tokens[index]
        if tok.kind == "open":
            current.append(tok)
            closing += tok.closing
        elif tok.kind == "close" and current and current[-1].name == tok.name:
            closing -= current.pop().closing
        cost += tok.width
        if cost + closing > limit and last is not None:
            break
        if tok.kind == "text":
            last = _Cut(index + 1, cost, tuple(current))
            score = (3 if previous == "\n" else 2) if tok.value == "\n" else (1 if tok.value == " " else 0)
            for level in range(1, score + 1):
                best[level] = last
            previous = tok.value
    else:
        return _Cut(len(tokens), cost, tuple(current))
    for wanted in (3, 2, 1):
        cut = best.get(wanted)
        if cut is not None and cut.cost >= limit // 2:
            return cut
    assert last is not None
    return last


def split_marks(
    tokens: list[Mark],
    limit: int,
    *,
    finish: Callable[[str], str] = str,
    trim: bool = False,
    divide: Callable[[Mark], list[Mark]] | None = None,
) -> list[str]:
    """Rendered markup in parts of at most ``limit`` each, every part balanced; parts with no visible text dropped.

    ``finish`` turns a part into what is sent; ``trim`` drops the spaces and line ends a part would leave inside
    the spans closed at its end. A part's first text token that cannot fit even alone is handed to ``divide``
    (when given) for smaller tokens to cut between; with none (an empty list), the part holds just that token.

    It cuts *rendered* markup (Telegram HTML, Slack mrkdwn) given as :class:`Mark` tokens: only between tokens, so never
    inside a tag, an entity or a link; the spans open at a cut are closed at the end of the part and reopened at the
    start of the next one, so every part is balanced on its own.
    """
    parts: list[str] = []
    stack: tuple[Mark, ...] = ()
    index = 0
    while index < len(tokens):
        cut = _next_cut(tokens, index, stack, limit)
        if divide is not None and cut.cost + sum(tok.closing for tok in cut.stack) > limit:
            first = next((i for i in range(index, cut.end) if tokens[i].kind == "text"), None)
            smaller = divide(tokens[first]) if first is not None else []
            if first is not None and smaller:
                tokens[first : first + 1] = smaller
                continue
        end, after = cut.end, list(cut.stack)
        while end < len(tokens) and tokens[end].kind == "close" and after and after[-1].name == tokens[end].name:
            after.pop()  # a closer right at the cut costs what its forced close would: keep it in this part
            end += 1
        chunk = tokens[index:end]
        if any(tok.kind == "text" and not tok.value.isspace() for tok in chunk):
            body = "".join(tok.value for tok in stack) + "".join(tok.value for tok in chunk)
            body = body.rstrip(" \n") if trim and after else body
            parts.append(finish(body + "".join(tok.closer for tok in reversed(after))).strip())
        stack, index = tuple(after), end
    return [part for part in parts if part]
