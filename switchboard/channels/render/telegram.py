"""The agent's Markdown as Telegram HTML, split into messages that each fit the platform's limit.

Model output is untrusted: raw HTML in it is escaped, only tags Telegram understands are produced, following its
nesting rules, and links keep only ``http``, ``https``, ``tg`` and ``mailto`` targets. Splitting happens after
rendering, never inside a tag or an entity, closing and reopening what is open at a cut.
"""

from __future__ import annotations

import html
import re
from typing import Literal

from markdown_it import MarkdownIt
from markdown_it.rules_inline import StateInline
from markdown_it.tree import SyntaxTreeNode

from switchboard.channels.render.markdown import Walker, link_target, parser
from switchboard.channels.render.split import Mark, split_marks

__all__ = [
    "MAX_MESSAGE_LENGTH",
    "markdown_to_html",
    "render_messages",
    "split_html",
    "visible_text",
]

MAX_MESSAGE_LENGTH = 4096
"""Telegram's limit for one message's text (``telegram.constants.MessageLimit.MAX_TEXT_LENGTH``)."""

_SAFE_SCHEMES = ("http://", "https://", "tg://", "mailto:")
_MENTION_LINK = re.compile(r"tg://(?:user|openmessage)\b", re.IGNORECASE)
"""``tg://user?id=…`` links mention (and notify) that user: model output never gets to ping anyone."""
_MENTION = re.compile(r"(?<![\w.+-])@(?=\w)")
"""An ``@`` where Telegram's clients see a ``@username`` mention (which notifies that member of a group)."""
_WORD_JOINER = "\u2060"
"""Invisible; after the ``@`` it stops the mention from being recognised while the text reads the same."""
_MAX_HREF = 1024
"""Longer link targets are shown as text: a huge opening tag repeated at every cut would starve the parts."""
_LANGUAGE = re.compile(r"[A-Za-z0-9_+#.-]{1,32}")


def _spoiler_rule(state: StateInline, silent: bool) -> bool:
    """``||hidden||`` → ``<tg-spoiler>`` (Telegram's and Discord's spoiler syntax)."""
    start = state.pos
    if not state.src.startswith("||", start):
        return False
    end = state.src.find("||", start + 2, state.posMax)
    if end <= start + 2:
        return False
    if not silent:
        old_max = state.posMax
        state.push("spoiler_open", "tg-spoiler", 1)
        state.pos, state.posMax = start + 2, end
        state.md.inline.tokenize(state)
        state.push("spoiler_close", "tg-spoiler", -1)
        state.posMax = old_max
    state.pos = end + 2
    return True


def _parser() -> MarkdownIt:
    md = parser()
    md.inline.ruler.before("emphasis", "spoiler", _spoiler_rule)
    md.inline.add_terminator_char("|")  # so the plain-text rule stops where a spoiler may start
    return md


def _esc(text: str) -> str:
    """Escape text shown as text, with every ``@username`` defused: model output never gets to ping anyone."""
    return html.escape(_MENTION.sub("@" + _WORD_JOINER, text), quote=False)


def _esc_code(text: str) -> str:
    """Escape the content of ``<code>``/``<pre>``, where Telegram recognises no mentions (kept byte for byte)."""
    return html.escape(text, quote=False)


def _safe_href(href: str) -> str | None:
    if len(href) > _MAX_HREF or not href.lower().startswith(_SAFE_SCHEMES) or _MENTION_LINK.match(href):
        return None
    return html.escape(href, quote=True)


class _Telegram(Walker):
    """Telegram HTML; ``quote`` in the context: inside a block quote, which holds no links or code."""

    md = _parser()

    def escape(self, text: str) -> str:
        return _esc(text)

    def context(self, quoted: bool) -> frozenset[str]:
        return frozenset({"quote"}) if quoted else frozenset()

    def emphasis(self, name: str, inner: str, ctx: frozenset[str]) -> str:
        tag = "tg-spoiler" if name == "spoiler" else name
        return inner if name in ctx or not inner else f"<{tag}>{inner}</{tag}>"

    def code_span(self, content: str, ctx: frozenset[str]) -> str:
        return _esc(content) if ctx & {"a", "quote"} else f"<code>{_esc_code(content)}</code>"

    def code_block(self, node: SyntaxTreeNode, quoted: bool) -> str:
        content = node.content.rstrip("\n")
        if not content:
            return ""
        if quoted:
            return _esc(content)
        info = node.info.split()[0] if node.type == "fence" and node.info.strip() else ""
        if info and _LANGUAGE.fullmatch(info):
            return f'<pre><code class="language-{info}">{_esc_code(content)}</code></pre>'
        return f"<pre>{_esc_code(content)}</pre>"

    def quote(self, inner: str, quoted: bool) -> str:
        return inner if quoted or not inner else f"<blockquote>{inner}</blockquote>"

    def link(self, node: SyntaxTreeNode, ctx: frozenset[str]) -> str:
        target = link_target(node)
        inner = self.inline(node.children, ctx | {"a"})
        href = _safe_href(target)
        if href is None:
            return inner or _esc(target)
        if "a" in ctx or "quote" in ctx:
            return f"{inner} ({_esc(target)})" if inner else _esc(target)
        return f'<a href="{href}">{inner or _esc(target)}</a>'


def markdown_to_html(markdown: str) -> str:
    """Render the agent's Markdown as Telegram HTML (``parse_mode="HTML"``).

    Headings become bold lines, lists become ``•`` or numbered lines, images become links, tables
    become ``a | b`` lines; anything else that looks like HTML is escaped.
    """
    return _Telegram().render(markdown)


_TOKEN = re.compile(r"<[^<>]*>|&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z]+);|[^<>&\s]{1,8}|.", re.DOTALL)
"""A tag, an entity, up to 8 non-space characters, or one space or line end."""
_TAG_NAME = re.compile(r"</?\s*([A-Za-z][A-Za-z0-9-]*)")


def _width(text: str) -> int:
    """Length in UTF-16 code units, the way Telegram counts."""
    if len(text) == 1:
        return 2 if ord(text) > 0xFFFF else 1
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _tokenize(markup: str) -> list[Mark]:
    tokens: list[Mark] = []
    for match in _TOKEN.finditer(markup):
        value = match.group()
        name_match = _TAG_NAME.match(value) if len(value) > 2 and value[0] == "<" else None
        if name_match is None:
            tokens.append(Mark("text", value, width=_width(value)))
        else:
            name = name_match.group(1).lower()
            closer = f"</{name}>"
            kind: Literal["open", "close"] = "close" if value.startswith("</") else "open"
            tokens.append(Mark(kind, value, name, _width(value), closer, len(closer)))
    return tokens


def split_html(markup: str, limit: int = MAX_MESSAGE_LENGTH) -> list[str]:
    """Split well-formed Telegram HTML into parts of at most ``limit`` UTF-16 code units each.

    Cuts prefer a blank line, then a line end, then a space, as long as the part stays at least half
    full. Every part is balanced on its own; parts with no visible text are dropped.
    """
    if _width(markup) <= limit:  # the common case: one message
        return [markup.strip()] if visible_text(markup).strip() else []
    return split_marks(_tokenize(markup), limit)


_PLAIN = re.compile(r"[A-Za-z](?:[A-Za-z0-9 ,.;:?!'\"()/%$-]*[A-Za-z0-9,.;:?!'\"()/%$-])?")
"""One line that Markdown renders as itself: no markup, block or entity character, no ``@``, no edge spaces."""


def render_messages(markdown: str, limit: int = MAX_MESSAGE_LENGTH) -> list[str]:
    """Render the agent's Markdown to Telegram HTML, then split it into messages (empty list for blank text)."""
    if len(markdown) <= limit and _PLAIN.fullmatch(markdown):
        return [markdown]  # what the parser would give, at a fraction of the cost (short plain replies are common)
    return split_html(markdown_to_html(markdown), limit)


def visible_text(markup: str) -> str:
    """The text a reader sees for a piece of Telegram HTML (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^<>]*>", "", markup))
