"""The agent's Markdown as plain text for Messenger and Instagram, split within each platform's limit.

Neither platform renders any markup in a message's ``text``, so the Markdown is read (markdown-it, raw HTML off)
and written back as the text a reader would see: emphasis markers dropped, headings as their own lines, lists as
``•`` or numbered lines, quotes with ``> ``, code as it is, tables as ``a | b`` lines, and links as their text
followed by the URL (``docs (https://…)``; a bare URL once). The apps link bare URLs themselves.

Splitting comes after rendering, with :func:`switchboard.channels.textsplit.split_reply`: Messenger within 2,000
characters, Instagram within 1,000 UTF-8 bytes (an emoji is four bytes, an accented letter two). Quick-reply
titles are cut to 20 characters the same way, never inside a character.
"""

from __future__ import annotations

import re

from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode

from tests.channels.render_before.textsplit import Unit, split_reply

__all__ = ["markdown_to_plain", "render_parts", "shorten"]

_MD = MarkdownIt("commonmark", {"html": False}).enable(["strikethrough", "table"])
_HR = "——————"
_PLAIN = re.compile(r"[A-Za-z](?:[A-Za-z0-9 ,.;:?!'\"()/%@$-]*[A-Za-z0-9,.;:?!'\"()/%@$-])?")
"""One line that Markdown renders as itself (no markup character, no edge spaces): the fast path."""


class _Plain:
    """Walks markdown-it's syntax tree and writes what a reader sees."""

    def block(self, node: SyntaxTreeNode) -> str:
        kind = node.type
        if kind in ("paragraph", "heading", "inline"):
            return self.inline(node.children)
        if kind == "blockquote":
            inner = self.blocks(node.children, "\n\n")
            return "\n".join(f"> {line}" if line else ">" for line in inner.split("\n"))
        if kind in ("bullet_list", "ordered_list"):
            return self.items(node)
        if kind in ("fence", "code_block"):
            return node.content.rstrip("\n")
        if kind == "hr":
            return _HR
        if kind == "table":
            return self.table(node)
        if node.children:
            return self.blocks(node.children, "\n")
        return node.content

    def blocks(self, nodes: list[SyntaxTreeNode], sep: str) -> str:
        return sep.join(part for part in (self.block(n) for n in nodes) if part)

    def items(self, node: SyntaxTreeNode) -> str:
        start = str(node.attrs.get("start", 1))
        number = int(start) if start.isdigit() else 1
        lines: list[str] = []
        for offset, item in enumerate(node.children):
            marker = f"{number + offset}. " if node.type == "ordered_list" else "• "
            body = self.blocks(item.children, "\n")
            lines.append(marker + body.replace("\n", "\n" + " " * len(marker)))
        return "\n".join(lines)

    def table(self, node: SyntaxTreeNode) -> str:
        rows: list[str] = []
        for section in node.children:
            for row in section.children:
                rows.append(" | ".join(self.inline(cell.children) for cell in row.children))
        return "\n".join(rows)

    def inline(self, nodes: list[SyntaxTreeNode]) -> str:
        return "".join(self.span(node) for node in nodes)

    def span(self, node: SyntaxTreeNode) -> str:
        kind = node.type
        if kind == "inline":
            return self.inline(node.children)
        if kind in ("text", "code_inline", "html_inline"):
            return node.content
        if kind in ("softbreak", "hardbreak"):
            return "\n"
        if kind in ("link", "image"):
            target = str(node.attrs.get("href" if kind == "link" else "src", ""))
            inner = self.inline(node.children) if kind == "link" else node.content or self.inline(node.children)
            if not inner or inner == target or inner == target.removeprefix("mailto:"):
                return target
            return f"{inner} ({target})" if target else inner
        return node.content + self.inline(node.children)


def markdown_to_plain(markdown: str) -> str:
    """The agent's Markdown as the plain text it stands for (see the module docstring)."""
    if _PLAIN.fullmatch(markdown):
        return markdown
    tokens = _MD.parse(markdown)
    if any(t.nesting == 1 and t.level >= _MD.options.maxNesting - 1 for t in tokens):
        return markdown.strip()  # markdown-it drops what is nested deeper than that: show it all as written
    return _Plain().blocks(SyntaxTreeNode(tokens).children, "\n\n").strip()


def render_parts(markdown: str, limit: int, unit: Unit) -> list[str]:
    """Render, then split into messages of at most ``limit`` ``unit``s each (empty list for blank text)."""
    text = markdown_to_plain(markdown)
    if not text.strip():
        return []
    return [part for part in split_reply(text, limit, unit) if part.strip()]


def shorten(label: str, limit: int) -> str:
    """``label`` within ``limit`` characters, ending in ``…`` when it had to be cut."""
    label = " ".join(label.split())
    return label if len(label) <= limit else label[: limit - 1].rstrip() + "…"
