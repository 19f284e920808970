"""Splitting a document into passages: pieces of about :data:`PASSAGE_CHARS` on paragraph or sentence bounds.

Each passage is indexed on its own (words and a vector), so a search finds the part of a long document that matches
and shows that part rather than the document's beginning. A passage keeps its ``start`` offset in the text, so a
ranged read can continue from it.
"""

from __future__ import annotations

import re
from typing import assert_never

from switchboard.core.memory.facts import FactKind, Passage

__all__ = ["PASSAGE_CHARS", "passages", "passages_for"]

PASSAGE_CHARS = 800
"""Target length of one passage; a passage is at most this long unless one word is longer."""

_MIN_CHARS = PASSAGE_CHARS // 4
"""A cut is looked for in the last three quarters of a passage, so none is tiny."""

_PARAGRAPH = re.compile(r"\n[ \t]*\n\s*")
_SENTENCE = re.compile(r"(?<=[.!?;:])\s+|\n\s*")
_SPACE = re.compile(r"\s+")


def _cut(text: str, start: int, end: int) -> int:
    """Where a passage starting at ``start`` ends, at most ``end``: after a paragraph, a sentence or a word."""
    low = start + _MIN_CHARS
    for pattern in (_PARAGRAPH, _SENTENCE, _SPACE):
        found = [m.end() for m in pattern.finditer(text, low, end) if m.end() <= end]
        if found:
            return found[-1]
    return end


def passages(text: str, size: int = PASSAGE_CHARS) -> list[Passage]:
    """``text`` as passages of at most ``size`` characters, in order, cut on paragraph, sentence or word bounds.

    A text of at most ``size`` characters is one passage; whitespace between passages belongs to neither.
    """
    if size < 8:
        raise ValueError("a passage is at least 8 characters")
    out: list[Passage] = []
    position = 0
    length = len(text)
    while position < length:
        while position < length and text[position].isspace():
            position += 1
        if position >= length:
            break
        end = length if length - position <= size else _cut(text, position, position + size)
        piece = text[position:end].rstrip()
        if piece:
            out.append(Passage(index=len(out), start=position, text=piece))
        position = end
    if not out:
        out.append(Passage(index=0, start=0, text=text))
    return out


def passages_for(kind: FactKind, text: str) -> list[Passage]:
    """The passages a store indexes for a fact of ``kind``: a fact is one passage, a document is split."""
    if kind == "fact":
        return [Passage(index=0, start=0, text=text)]
    if kind == "document":
        return passages(text)
    assert_never(kind)
