"""The agent's Markdown as Telegram HTML, split into messages that each fit the platform's limit.

Model output is untrusted text: raw HTML in it is never passed through (markdown-it runs with ``html``
off, so ``<script>`` arrives here as text and is escaped), and only the tags Telegram's HTML mode
understands are produced. Links keep only ``http``, ``https``, ``tg`` and ``mailto`` targets.

Telegram's nesting rules (Bot API, "Formatting options") shape the output: ``pre`` and ``code`` hold
no other markup, ``a`` holds no code, blockquotes do not nest and hold no links, code or ``pre``.
Splitting happens *after* rendering, on the HTML itself: a part is cut only between characters or
entities, never inside a tag or an entity; tags open at a cut are closed at the end of the part and
reopened at the start of the next one.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import NamedTuple, assert_never

from markdown_it import MarkdownIt
from markdown_it.rules_inline import StateInline
from markdown_it.tree import SyntaxTreeNode

from switchboard.core.actions import OfferChoice, SendFile

__all__ = [
    "MAX_MESSAGE_LENGTH",
    "action_markdown",
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
_HR = "——————"


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
    md = MarkdownIt("commonmark", {"html": False}).enable(["strikethrough", "table"])
    md.inline.ruler.before("emphasis", "spoiler", _spoiler_rule)
    md.inline.add_terminator_char("|")  # so the plain-text rule stops where a spoiler may start
    return md


_MD = _parser()


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


class _Renderer:
    """Walks markdown-it's syntax tree and writes Telegram HTML."""

    def block(self, node: SyntaxTreeNode, quoted: bool) -> str:
        kind = node.type
        if kind == "paragraph":
            return self.inline(node.children, frozenset({"quote"}) if quoted else frozenset())
        if kind == "heading":
            inner = self.inline(node.children, frozenset({"b", "quote"} if quoted else {"b"}))
            return f"<b>{inner}</b>" if inner else ""
        if kind == "blockquote":
            inner = self.blocks(node.children, "\n", quoted=True)
            return inner if quoted or not inner else f"<blockquote>{inner}</blockquote>"
        if kind in ("bullet_list", "ordered_list"):
            return self.items(node, quoted)
        if kind in ("fence", "code_block"):
            return self.code(node, quoted)
        if kind == "hr":
            return _HR
        if kind == "table":
            return self.table(node, quoted)
        if kind == "inline":
            return self.inline(node.children, frozenset({"quote"}) if quoted else frozenset())
        if node.children:
            return self.blocks(node.children, "\n", quoted=quoted)
        return _esc(node.content)

    def blocks(self, nodes: list[SyntaxTreeNode], sep: str, *, quoted: bool) -> str:
        return sep.join(part for part in (self.block(n, quoted) for n in nodes) if part)

    def items(self, node: SyntaxTreeNode, quoted: bool) -> str:
        start = str(node.attrs.get("start", 1))
        number = int(start) if start.isdigit() else 1
        lines: list[str] = []
        for offset, item in enumerate(node.children):
            marker = f"{number + offset}. " if node.type == "ordered_list" else "• "
            body = self.blocks(item.children, "\n", quoted=quoted)
            lines.append(marker + body.replace("\n", "\n" + " " * len(marker)))
        return "\n".join(lines)

    def code(self, node: SyntaxTreeNode, quoted: bool) -> str:
        content = node.content.rstrip("\n")
        if not content:
            return ""
        if quoted:
            return _esc(content)
        info = node.info.split()[0] if node.type == "fence" and node.info.strip() else ""
        if info and _LANGUAGE.fullmatch(info):
            return f'<pre><code class="language-{info}">{_esc_code(content)}</code></pre>'
        return f"<pre>{_esc_code(content)}</pre>"

    def table(self, node: SyntaxTreeNode, quoted: bool) -> str:
        ctx = frozenset({"quote"}) if quoted else frozenset()
        rows: list[str] = []
        for section in node.children:
            for row in section.children:
                cells = [self.inline(cell.children, ctx) for cell in row.children]
                line = " | ".join(cells)
                rows.append(f"<b>{line}</b>" if section.type == "thead" and line else line)
        return "\n".join(rows)

    def inline(self, nodes: list[SyntaxTreeNode], ctx: frozenset[str]) -> str:
        out: list[str] = []
        for node in nodes:
            if node.type == "inline":
                out.append(self.inline(node.children, ctx))
            else:
                out.append(self.span(node, ctx))
        return "".join(out)

    def span(self, node: SyntaxTreeNode, ctx: frozenset[str]) -> str:
        kind = node.type
        if kind in ("text", "html_inline"):
            return _esc(node.content)
        if kind in ("softbreak", "hardbreak"):
            return "\n"
        tag = {"strong": "b", "em": "i", "s": "s", "spoiler": "tg-spoiler"}.get(kind)
        if tag is not None:
            inner = self.inline(node.children, ctx | {tag})
            return inner if tag in ctx or not inner else f"<{tag}>{inner}</{tag}>"
        if kind == "code_inline":
            plain = ctx & {"a", "quote"}
            return _esc(node.content) if plain else f"<code>{_esc_code(node.content)}</code>"
        if kind in ("link", "image"):
            return self.link(node, ctx)
        return _esc(node.content) + self.inline(node.children, ctx)

    def link(self, node: SyntaxTreeNode, ctx: frozenset[str]) -> str:
        target = str(node.attrs.get("href" if node.type == "link" else "src", ""))
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
    tokens = _MD.parse(markdown)
    if any(t.nesting == 1 and t.level >= _MD.options.maxNesting - 1 for t in tokens):
        return _esc(markdown).strip()  # markdown-it drops what is nested deeper than that: show it all as text
    return _Renderer().blocks(SyntaxTreeNode(tokens).children, "\n\n", quoted=False).strip()


class _Token(NamedTuple):
    kind: str
    """``open``, ``close`` or ``text``: up to 8 non-space characters, one space or line end, or one entity."""
    value: str
    name: str = ""
    width: int = 0
    """Length in UTF-16 code units, the way Telegram counts."""


_TOKEN = re.compile(r"<[^<>]*>|&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z]+);|[^<>&\s]{1,8}|.", re.DOTALL)
_TAG_NAME = re.compile(r"</?\s*([A-Za-z][A-Za-z0-9-]*)")


def _width(text: str) -> int:
    if len(text) == 1:
        return 2 if ord(text) > 0xFFFF else 1
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _tokenize(markup: str) -> list[_Token]:
    tokens: list[_Token] = []
    for match in _TOKEN.finditer(markup):
        value = match.group()
        name_match = _TAG_NAME.match(value) if len(value) > 2 and value[0] == "<" else None
        if name_match is None:
            tokens.append(_Token("text", value, width=_width(value)))
        else:
            kind = "close" if value.startswith("</") else "open"
            tokens.append(_Token(kind, value, name_match.group(1).lower(), _width(value)))
    return tokens


def _closers(stack: tuple[_Token, ...]) -> str:
    return "".join(f"</{tok.name}>" for tok in reversed(stack))


@dataclass(frozen=True, slots=True)
class _Cut:
    end: int
    """Index of the first token of the next part."""
    cost: int
    """Width of the part up to here, without the closing tags."""
    stack: tuple[_Token, ...]
    """Tags open at the cut."""


def _next_cut(tokens: list[_Token], start: int, stack: tuple[_Token, ...], limit: int) -> _Cut:
    """The best place to end the part that starts at ``start`` with ``stack`` reopened.

    The latest blank line, else line end, else space that keeps the part at least half full;
    else as far as the limit allows (always at least one character, so splitting ends).
    """
    cost = sum(tok.width for tok in stack)
    closing = sum(len(tok.name) + 3 for tok in stack)
    current = list(stack)
    snapshot = stack
    best: dict[int, _Cut] = {}
    last: _Cut | None = None
    previous = ""
    for index in range(start, len(tokens)):
        tok = tokens[index]
        if tok.kind == "open":
            current.append(tok)
            closing += len(tok.name) + 3
            snapshot = tuple(current)
        elif tok.kind == "close" and current and current[-1].name == tok.name:
            current.pop()
            closing -= len(tok.name) + 3
            snapshot = tuple(current)
        cost += tok.width
        if cost + closing > limit and last is not None:
            break
        if tok.kind == "text":
            last = _Cut(index + 1, cost, snapshot)
            value = tok.value
            score = (3 if previous == "\n" else 2) if value == "\n" else (1 if value == " " else 0)
            for level in range(1, score + 1):
                best[level] = last
            previous = value
    else:
        return _Cut(len(tokens), cost, snapshot)
    for wanted in (3, 2, 1):
        cut = best.get(wanted)
        if cut is not None and cut.cost >= limit // 2:
            return cut
    assert last is not None
    return last


def split_html(markup: str, limit: int = MAX_MESSAGE_LENGTH) -> list[str]:
    """Split well-formed Telegram HTML into parts of at most ``limit`` UTF-16 code units each.

    Cuts prefer a blank line, then a line end, then a space, as long as the part stays at least half
    full. Every part is balanced on its own; parts with no visible text are dropped.
    """
    if _width(markup) <= limit:  # the common case: one message
        return [markup.strip()] if visible_text(markup).strip() else []
    tokens = _tokenize(markup)
    parts: list[str] = []
    stack: tuple[_Token, ...] = ()
    index = 0
    while index < len(tokens):
        cut = _next_cut(tokens, index, stack, limit)
        end, after = cut.end, list(cut.stack)
        while end < len(tokens) and tokens[end].kind == "close" and after and after[-1].name == tokens[end].name:
            after.pop()  # a closing tag right at the cut costs what its closer would: keep it here
            end += 1
        body = "".join(tok.value for tok in stack) + "".join(tok.value for tok in tokens[index:end])
        if any(tok.kind == "text" and not tok.value.isspace() for tok in tokens[index:end]):
            parts.append((body + _closers(tuple(after))).strip())
        stack, index = tuple(after), end
    return parts


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


def action_markdown(action: OfferChoice | SendFile) -> str:
    """Markdown standing in for an action a channel shows as text: a choice as numbered options, a file's line.

    A :class:`SendFile` gives its caption and a ``📎 name`` line (for channels that cannot upload the file itself).
    """
    match action:
        case OfferChoice():
            options = "\n".join(f"{number}. {option.label}" for number, option in enumerate(action.options, 1))
            return f"{action.question}\n\n{options}" if action.question.strip() else options
        case SendFile():
            line = f"📎 {PurePath(action.path).name}"
            return f"{action.caption}\n\n{line}" if action.caption.strip() else line
        case _:
            assert_never(action)
