"""The agent's Markdown as plain text for Messenger and Instagram, split within each platform's limit.

Neither platform renders markup, so the Markdown is written back as the text a reader would see (links as their text
followed by the URL; the apps link bare URLs themselves). Splitting comes after rendering: Messenger within 2,000
characters, Instagram within 1,000 UTF-8 bytes; quick-reply titles are cut the same way, never inside a character.
"""

from __future__ import annotations

import re

from markdown_it.tree import SyntaxTreeNode

from switchboard.channels.render.markdown import Walker, link_target
from switchboard.channels.render.split import Unit, split_reply

__all__ = ["markdown_to_plain", "render_parts", "shorten"]

_PLAIN = re.compile(r"[A-Za-z](?:[A-Za-z0-9 ,.;:?!'\"()/%@$-]*[A-Za-z0-9,.;:?!'\"()/%@$-])?")
"""One line that Markdown renders as itself (no markup character, no edge spaces): the fast path."""


class _Plain(Walker):
    """What a reader sees: the text, no markup (nothing to escape, emphasis dropped, quotes as ``> `` lines)."""

    quote_separator = "\n\n"

    def escape(self, text: str) -> str:
        return text

    def emphasis(self, name: str, inner: str, ctx: frozenset[str]) -> str:
        return inner

    def code_span(self, content: str, ctx: frozenset[str]) -> str:
        return content

    def code_block(self, node: SyntaxTreeNode, quoted: bool) -> str:
        return node.content.rstrip("\n")

    def quote(self, inner: str, quoted: bool) -> str:
        return "\n".join(f"> {line}" if line else ">" for line in inner.split("\n"))

    def link(self, node: SyntaxTreeNode, ctx: frozenset[str]) -> str:
        target = link_target(node)
        inner = (
            self.inline(node.children, ctx) if node.type == "link" else node.content or self.inline(node.children, ctx)
        )
        if not inner or inner == target or inner == target.removeprefix("mailto:"):
            return target
        return f"{inner} ({target})" if target else inner


def markdown_to_plain(markdown: str) -> str:
    """The agent's Markdown as the plain text it stands for (see the module docstring)."""
    if _PLAIN.fullmatch(markdown):
        return markdown
    return _Plain().render(markdown)


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
