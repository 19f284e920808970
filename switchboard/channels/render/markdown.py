"""Reading the agent's Markdown: one walk over markdown-it's syntax tree, and code fences line by line.

Dialects that rewrite Markdown (Telegram HTML, Slack mrkdwn, plain text) subclass :class:`Walker`, which knows the
shared structure and asks only for what differs; raw HTML is never parsed. Dialects that pass Markdown through
(Discord, WhatsApp) use :func:`fenced_lines` to leave code blocks alone.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Literal

from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode

__all__ = ["FENCE", "HR", "LineRole", "Walker", "closes_fence", "fenced_lines", "link_target", "parser"]

HR = "——————"
"""A thematic break (``---``), in every dialect: none of them has a rule of its own in a message."""

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
"""A code fence line: its marker and its info string."""

_SPANS = {"strong": "b", "em": "i", "s": "s", "spoiler": "spoiler"}
"""markdown-it's span tokens and the names :meth:`Walker.emphasis` gets them by."""

LineRole = Literal["open", "close", "code", "text"]
"""A fence that opens or closes a code block, a line inside one, or a line of text outside any."""


def parser() -> MarkdownIt:
    """CommonMark with strike-through and tables, raw HTML off (shown as text)."""
    return MarkdownIt("commonmark", {"html": False}).enable(["strikethrough", "table"])


def link_target(node: SyntaxTreeNode) -> str:
    """A link's ``href`` or an image's ``src``."""
    return str(node.attrs.get("href" if node.type == "link" else "src", ""))


def fenced_lines(markdown: str) -> Iterator[tuple[str, LineRole]]:
    """Each line of ``markdown`` (CRLF read as LF) with its role around fenced code blocks.

    A block closes at a fence of the same character, at least as long, with no info string; anything else inside
    it is code.
    """
    fence: str | None = None
    for line in markdown.replace("\r\n", "\n").split("\n"):
        match = FENCE.match(line)
        if match is None or (fence is not None and not closes_fence(match, fence)):
            yield line, "text" if fence is None else "code"
        elif fence is None:
            fence = match.group(1)
            yield line, "open"
        else:
            fence = None
            yield line, "close"


def closes_fence(match: re.Match[str], fence: str) -> bool:
    """Whether a :data:`FENCE` line closes the code block ``fence`` opened."""
    marker = match.group(1)
    return marker[0] == fence[0] and len(marker) >= len(fence) and not match.group(2).strip()


class Walker(ABC):
    """Walks markdown-it's syntax tree and writes one dialect; the subclass says how each piece is written.

    ``quoted`` is true inside a block quote; ``ctx`` names the spans (``b``, ``i``, ``s``, ``spoiler``, ``a`` for
    a link) an inline node is inside, plus whatever :meth:`context` adds for the block it is in.
    """

    md: MarkdownIt = parser()
    quote_separator = "\n"
    """What joins the blocks inside a quote."""

    def render(self, markdown: str) -> str:
        """``markdown`` in the dialect; escaped text if it nests deeper than markdown-it keeps."""
        tokens = self.md.parse(markdown)
        if any(t.nesting == 1 and t.level >= self.md.options.maxNesting - 1 for t in tokens):
            return self.escape(markdown).strip()  # markdown-it drops what is nested deeper than that: show it all
        return self.blocks(SyntaxTreeNode(tokens).children, "\n\n", quoted=False).strip()

    @abstractmethod
    def escape(self, text: str) -> str:
        """Text shown as text."""

    @abstractmethod
    def emphasis(self, name: str, inner: str, ctx: frozenset[str]) -> str:
        """A span ``name`` (``b`` also for headings and table headers) around rendered ``inner``."""

    @abstractmethod
    def code_span(self, content: str, ctx: frozenset[str]) -> str:
        """Inline code."""

    @abstractmethod
    def code_block(self, node: SyntaxTreeNode, quoted: bool) -> str:
        """A fenced or indented code block (``""`` drops it)."""

    @abstractmethod
    def quote(self, inner: str, quoted: bool) -> str:
        """A block quote around its rendered blocks (``quoted``: this one is inside another)."""

    @abstractmethod
    def link(self, node: SyntaxTreeNode, ctx: frozenset[str]) -> str:
        """A link or an image."""

    def context(self, quoted: bool) -> frozenset[str]:
        """The context a block's inline content starts in."""
        return frozenset()

    def item(self, body: str) -> str:
        """A list item's rendered blocks, before its marker goes in front."""
        return body

    def block(self, node: SyntaxTreeNode, quoted: bool) -> str:
        """One block node."""
        kind = node.type
        if kind in ("paragraph", "inline"):
            return self.inline(node.children, self.context(quoted))
        if kind == "heading":
            ctx = self.context(quoted)
            return self.emphasis("b", self.inline(node.children, ctx | {"b"}), ctx)
        if kind == "blockquote":
            return self.quote(self.blocks(node.children, self.quote_separator, quoted=True), quoted)
        if kind in ("bullet_list", "ordered_list"):
            return self.items(node, quoted)
        if kind in ("fence", "code_block"):
            return self.code_block(node, quoted)
        if kind == "hr":
            return HR
        if kind == "table":
            return self.table(node, quoted)
        if node.children:
            return self.blocks(node.children, "\n", quoted=quoted)
        return self.escape(node.content)

    def blocks(self, nodes: list[SyntaxTreeNode], sep: str, *, quoted: bool) -> str:
        """Blocks joined by ``sep``, the empty ones left out."""
        return sep.join(part for part in (self.block(n, quoted) for n in nodes) if part)

    def items(self, node: SyntaxTreeNode, quoted: bool) -> str:
        """A list: ``•`` or numbered lines, an item's further lines indented under its text."""
        start = str(node.attrs.get("start", 1))
        number = int(start) if start.isdigit() else 1
        lines: list[str] = []
        for offset, item in enumerate(node.children):
            marker = f"{number + offset}. " if node.type == "ordered_list" else "• "
            body = self.item(self.blocks(item.children, "\n", quoted=quoted))
            lines.append(marker + body.replace("\n", "\n" + " " * len(marker)))
        return "\n".join(lines)

    def table(self, node: SyntaxTreeNode, quoted: bool) -> str:
        """A table: a line a row, cells joined by `` | ``, the header row bold."""
        ctx = self.context(quoted)
        rows: list[str] = []
        for section in node.children:
            for row in section.children:
                line = " | ".join(self.inline(cell.children, ctx) for cell in row.children)
                rows.append(self.emphasis("b", line, ctx) if section.type == "thead" else line)
        return "\n".join(rows)

    def inline(self, nodes: list[SyntaxTreeNode], ctx: frozenset[str]) -> str:
        """Inline nodes, concatenated."""
        return "".join(self.inline(n.children, ctx) if n.type == "inline" else self.span(n, ctx) for n in nodes)

    def span(self, node: SyntaxTreeNode, ctx: frozenset[str]) -> str:
        """One inline node."""
        kind = node.type
        if kind in ("text", "html_inline"):
            return self.escape(node.content)
        if kind in ("softbreak", "hardbreak"):
            return "\n"
        name = _SPANS.get(kind)
        if name is not None:
            return self.emphasis(name, self.inline(node.children, ctx | {name}), ctx)
        if kind == "code_inline":
            return self.code_span(node.content, ctx)
        if kind in ("link", "image"):
            return self.link(node, ctx)
        return self.escape(node.content) + self.inline(node.children, ctx)
