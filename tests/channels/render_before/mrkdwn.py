"""The agent's Markdown as Slack mrkdwn, split into messages that each fit Slack's limits; Slack text read back.

Model output is untrusted: every ``&``, ``<`` and ``>`` of its text is escaped (``&amp;`` ``&lt;`` ``&gt;``, the
only escapes mrkdwn knows), so ``<!channel>``, ``<!here>``, ``<!everyone>``, ``<@U…>`` or ``<!subteam^…>`` written
by the model arrive as visible text and never notify anyone; a bare ``@channel``/``@here``/``@everyone`` gets a
word joiner after its ``@`` as well. The only ``<…>`` this module writes are links, to ``http``, ``https`` or
``mailto`` targets whose ``<``, ``>``, ``|`` and spaces are percent-encoded, so a link cannot smuggle a mention in.

``**bold**`` becomes ``*bold*``, ``_em_`` ``_em_``, ``~~strike~~`` ``~strike~``, headings bold lines, lists
``•``/numbered lines, fences ```` ``` ```` blocks (mrkdwn has no language tag), quotes ``>`` lines, tables
``a | b`` lines.

Splitting happens *after* rendering, on the mrkdwn itself, like the Telegram renderer: the renderer marks where
each span and code block opens and closes with private-use characters, so the splitter cuts only between
characters or whole escapes and links, closes what is open at a cut (a code fence with ```` ``` ````, bold with
``*``) and reopens it at the start of the next part; the markers then become mrkdwn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import quote

from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode

__all__ = [
    "MAX_MESSAGE_CHARS",
    "markdown_to_mrkdwn",
    "neutralise_markdown",
    "plain_mrkdwn",
    "render_mrkdwn",
    "slack_text_to_plain",
    "split_mrkdwn",
]

MAX_MESSAGE_CHARS = 4000
"""Longest message we send: Slack truncates ``text`` over 40,000 characters and advises keeping to 4,000."""

_SAFE_SCHEMES = ("http://", "https://", "mailto:")
_MAX_HREF = 1000
_HR = "——————"
_PRIVATE = re.compile("[\ue000-\ue0ff]")
"""Our span markers: scrubbed from the model's text before rendering, so it cannot forge one."""
_FENCE_RUN = re.compile("`{3,}")
_BROADCAST = re.compile(r"(?<![\w@])@(channel|here|everyone)\b", re.IGNORECASE)
_WORD_JOINER = "\u2060"
_AT_WORD = re.compile(r"(?<![\w@])@")
_WORDISH = re.compile(r"[\w@]")
_QUOTE_MARK = re.compile(r"^> ", re.MULTILINE)
"""A quote's marker at the start of a rendered line (the text's own ``>`` are all escaped)."""


class _Span(NamedTuple):
    opener: str
    closer: str
    open_text: str
    close_text: str


# Each span kind: the private-use markers the renderer writes, and the mrkdwn they become.
_SPANS = {
    "b": _Span("\ue001", "\ue002", "*", "*"),
    "i": _Span("\ue003", "\ue004", "_", "_"),
    "s": _Span("\ue005", "\ue006", "~", "~"),
    "code": _Span("\ue007", "\ue008", "`", "`"),
    "pre": _Span("\ue009", "\ue00a", "```\n", "\n```"),
}
_BY_MARKER = {ch: (name, ch == span.opener) for name, span in _SPANS.items() for ch in (span.opener, span.closer)}
_FINAL = str.maketrans(
    {
        ch: (span.open_text if opening else span.close_text)
        for ch, (name, opening) in _BY_MARKER.items()
        for span in [_SPANS[name]]
    }
)


def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark", {"html": False}).enable(["strikethrough", "table"])


_MD = _parser()


def _esc(text: str) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if "```" in text:  # a literal fence would open (or close) a code block: zero-width spaces keep it literal
        text = _FENCE_RUN.sub(lambda m: "\u200b".join(m.group()), text)  # every tick of a run: no ``` is left
    return _BROADCAST.sub(lambda m: "@" + _WORD_JOINER + m.group(1), text) if "@" in text else text


def _safe_href(href: str) -> str | None:
    if len(href) > _MAX_HREF or not href.lower().startswith(_SAFE_SCHEMES):
        return None
    return quote(href, safe="/:?#[]@!$&'()*+,;=%~-._").replace("&", "&amp;")


def neutralise_markdown(markdown: str, before: str = "") -> str:
    """Standard Markdown for Slack's ``markdown_text`` (native streams) with every mention defused.

    Slack reads ``<!here>``, ``<@U…>`` and friends in ``markdown_text`` too: a zero-width space after each ``<``
    keeps them visible and inert, and a word joiner after an ``@`` that does not follow a word character (as an
    e-mail address's does) defuses ``@here``-style broadcasts. Both depend on one character of context only
    (``before``: the character ahead of ``markdown``), so a reply neutralised in appended pieces equals the reply
    neutralised whole.
    """
    text = _PRIVATE.sub("\ufffd", markdown).replace("<", "<\u200b")
    if "@" not in text:
        return text
    out = _AT_WORD.sub("@" + _WORD_JOINER, text)
    if text.startswith("@") and _WORDISH.match(before[-1:]):
        out = "@" + out[2:]  # an address continuing the previous piece (``mail@`` + ``host``)
    return out


def _wrap(name: str, inner: str) -> str:
    """``inner`` inside a span, whitespace kept outside (mrkdwn needs the markers next to visible text).

    Each line is wrapped on its own: a span never holds a line break, so no span is open where a quote's ``>``
    starts a line (a split there would reopen the span in front of the ``>``, leaving it literal mid-line).
    """
    if "\n" in inner:
        return "\n".join(_wrap(name, line) for line in inner.split("\n"))
    core = inner.strip()
    if not core:
        return inner
    span = _SPANS[name]
    lead, trail = inner[: len(inner) - len(inner.lstrip())], inner[len(inner.rstrip()) :]
    return f"{lead}{span.opener}{core}{span.closer}{trail}"


class _Renderer:
    """Walks markdown-it's syntax tree and writes marked mrkdwn (markers become mrkdwn after splitting)."""

    def block(self, node: SyntaxTreeNode, quoted: bool) -> str:
        kind = node.type
        if kind in ("paragraph", "inline"):
            return self.inline(node.children, frozenset())
        if kind == "heading":
            return _wrap("b", self.inline(node.children, frozenset({"b"})))
        if kind == "blockquote":
            inner = self.blocks(node.children, "\n", quoted=True)
            return inner if quoted or not inner else "\n".join("> " + line for line in inner.split("\n"))
        if kind in ("bullet_list", "ordered_list"):
            return self.items(node, quoted)
        if kind in ("fence", "code_block"):
            content = node.content.rstrip("\n")
            if not content.strip():
                return ""
            return _esc(content) if quoted else f"{_SPANS['pre'].opener}{_esc(content)}{_SPANS['pre'].closer}"
        if kind == "hr":
            return _HR
        if kind == "table":
            return self.table(node)
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
            body = _QUOTE_MARK.sub("&gt; ", body)  # after the item's marker a quote's > is literal: escape it
            lines.append(marker + body.replace("\n", "\n" + " " * len(marker)))
        return "\n".join(lines)

    def table(self, node: SyntaxTreeNode) -> str:
        rows: list[str] = []
        for section in node.children:
            for row in section.children:
                line = " | ".join(self.inline(cell.children, frozenset()) for cell in row.children)
                rows.append(_wrap("b", line) if section.type == "thead" else line)
        return "\n".join(rows)

    def inline(self, nodes: list[SyntaxTreeNode], ctx: frozenset[str]) -> str:
        return "".join(self.inline(n.children, ctx) if n.type == "inline" else self.span(n, ctx) for n in nodes)

    def span(self, node: SyntaxTreeNode, ctx: frozenset[str]) -> str:
        kind = node.type
        if kind in ("text", "html_inline"):
            return _esc(node.content)
        if kind in ("softbreak", "hardbreak"):
            return "\n"
        tag = {"strong": "b", "em": "i", "s": "s"}.get(kind)
        if tag is not None:
            inner = self.inline(node.children, ctx | {tag})
            return inner if tag in ctx or "a" in ctx else _wrap(tag, inner)
        if kind == "code_inline":
            content = node.content.replace("`", "'")
            if "a" in ctx or not content.strip():
                return _esc(content)
            return f"{_SPANS['code'].opener}{_esc(content)}{_SPANS['code'].closer}"
        if kind in ("link", "image"):
            return self.link(node, ctx)
        return _esc(node.content) + self.inline(node.children, ctx)

    def link(self, node: SyntaxTreeNode, ctx: frozenset[str]) -> str:
        target = str(node.attrs.get("href" if node.type == "link" else "src", ""))
        label = _PRIVATE.sub("", self.inline(node.children, ctx | {"a"})).replace("|", "¦").replace("\n", " ").strip()
        href = _safe_href(target)
        if href is None or "a" in ctx:
            return label or _esc(target)
        return f"<{href}|{label}>" if label and label != _esc(target) else f"<{href}>"


def markdown_to_mrkdwn(markdown: str) -> str:
    """Render the agent's Markdown as marked mrkdwn (span markers still in; see :func:`split_mrkdwn`)."""
    markdown = _PRIVATE.sub("\ufffd", markdown)
    tokens = _MD.parse(markdown)
    if any(t.nesting == 1 and t.level >= _MD.options.maxNesting - 1 for t in tokens):
        return _esc(markdown).strip()  # markdown-it drops what is nested deeper than that: show it all as text
    return _Renderer().blocks(SyntaxTreeNode(tokens).children, "\n\n", quoted=False).strip()


class _Token(NamedTuple):
    kind: str
    """``open``, ``close`` or ``text`` (a run of up to 8 non-space characters, one space or line end, one escape,
    one whole ``<link>``)."""
    value: str
    name: str = ""


_TOKEN = re.compile(r"<[^<>]*>|&(?:amp|lt|gt);|[\ue001-\ue00a]|[^<>&\s\ue001-\ue00a]{1,8}|.", re.DOTALL)


def _tokenize(marked: str) -> list[_Token]:
    tokens: list[_Token] = []
    for match in _TOKEN.finditer(marked):
        value = match.group()
        found = _BY_MARKER.get(value)
        if found is None:
            tokens.append(_Token("text", value))
        else:
            tokens.append(_Token("open" if found[1] else "close", value, found[0]))
    return tokens


def _width(token: _Token) -> int:
    if token.kind == "text":
        return len(token.value)
    span = _SPANS[token.name]
    return len(span.open_text if token.kind == "open" else span.close_text)


def _closing_width(stack: list[str]) -> int:
    return sum(len(_SPANS[name].close_text) for name in stack)


@dataclass(frozen=True, slots=True)
class _Cut:
    end: int
    cost: int
    stack: tuple[str, ...]


def _next_cut(tokens: list[_Token], start: int, stack: tuple[str, ...], limit: int) -> _Cut:
    """Where the part starting at ``start`` (with ``stack`` reopened) ends.

    The latest blank line, else line end, else space that keeps it at least half full; else as far as the limit
    allows (never less than one token, so splitting ends).
    """
    current = list(stack)
    cost = sum(len(_SPANS[name].open_text) for name in stack)
    best: dict[int, _Cut] = {}
    last: _Cut | None = None
    previous = ""
    for index in range(start, len(tokens)):
        tok = tokens[index]
        if tok.kind == "open":
            current.append(tok.name)
        elif tok.kind == "close" and current and current[-1] == tok.name:
            current.pop()
        cost += _width(tok)
        if cost + _closing_width(current) > limit and last is not None:
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


def _finish(marked: str) -> str:
    return marked.translate(_FINAL)


def split_mrkdwn(marked: str, limit: int = MAX_MESSAGE_CHARS) -> list[str]:
    """Split marked mrkdwn into finished messages of at most ``limit`` characters each.

    Escapes and links are never cut; spans and code blocks open at a cut are closed at its end and reopened at
    the start of the next part. Parts with no visible text are dropped. A part exceeds ``limit`` only when one
    link or escape and the markup open around it (at most 8 characters) cannot fit in it: it then holds just that.
    """
    if len(marked) <= limit and len(_finish(marked)) <= limit:
        whole = _finish(marked).strip()
        return [whole] if whole else []
    tokens = _tokenize(marked)
    parts: list[str] = []
    stack: tuple[str, ...] = ()
    index = 0
    while index < len(tokens):
        cut = _next_cut(tokens, index, stack, limit)
        if cut.cost + _closing_width(list(cut.stack)) > limit:  # only possible when its first text is too long
            first = next((i for i in range(index, cut.end) if tokens[i].kind == "text"), None)
            run = tokens[first].value if first is not None else ""
            if first is not None and len(run) > 1 and run[0] not in "<&":  # plain characters, not a link or escape
                tokens[first : first + 1] = [_Token("text", ch) for ch in run]
                continue
        end, after = cut.end, list(cut.stack)
        while end < len(tokens) and tokens[end].kind == "close" and after and after[-1] == tokens[end].name:
            after.pop()  # a closer right at the cut costs what its forced close would: keep it in this part
            end += 1
        chunk = tokens[index:end]
        body = "".join(_SPANS[name].opener for name in stack) + "".join(tok.value for tok in chunk)
        if any(tok.kind == "text" and not tok.value.isspace() for tok in chunk):
            body = body.rstrip(" \n") if after else body
            closers = "".join(_SPANS[name].closer for name in reversed(after))
            parts.append(_finish(body + closers).strip())
        stack, index = tuple(after), end
    return [part for part in parts if part]


def render_mrkdwn(markdown: str, limit: int = MAX_MESSAGE_CHARS) -> list[str]:
    """Render the agent's Markdown to mrkdwn and split it into messages (an empty list for blank text)."""
    return split_mrkdwn(markdown_to_mrkdwn(markdown), limit)


def plain_mrkdwn(text: str) -> str:
    """Plain text (an error notice) as mrkdwn that shows it literally and pings no one."""
    return _esc(_PRIVATE.sub("\ufffd", text))


_SLACK_MARKUP = re.compile(r"<([^<>|]*)(?:\|([^<>]*))?>")


def _markup_to_plain(match: re.Match[str]) -> str:
    target, label = match.group(1), match.group(2)
    if target.startswith("@"):
        return f"@{label}" if label else target
    if target.startswith("#"):
        return f"#{label}" if label else target
    if target.startswith("!"):
        command = target[1:].split("^", 1)[0]
        return label or (f"@{command}" if command in ("here", "channel", "everyone") else f"<{command}>")
    if label and label != target:
        return f"{label} ({target})"
    return target


def slack_text_to_plain(text: str) -> str:
    """What the agent reads for a Slack message's ``text``: links, mentions and escapes turned into plain text."""
    if "<" in text:
        text = _SLACK_MARKUP.sub(_markup_to_plain, text)
    if "&" in text:
        text = text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    return text
