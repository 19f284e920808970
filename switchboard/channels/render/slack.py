"""The agent's Markdown as Slack mrkdwn, split into messages that each fit Slack's limits; Slack text read back.

Model output is untrusted: every ``&``, ``<`` and ``>`` is escaped, so a mention written by the model arrives as text
and notifies nobody, and the only ``<…>`` written here are links with their specials percent-encoded. Splitting
happens after rendering, on the mrkdwn itself: private-use markers let the splitter cut only between whole escapes
and links, closing and reopening what is open at a cut (:func:`render_mrkdwn`).
"""

from __future__ import annotations

import re
from typing import NamedTuple
from urllib.parse import quote

from markdown_it.tree import SyntaxTreeNode

from switchboard.channels.render.markdown import Walker, link_target
from switchboard.channels.render.split import Mark, split_marks

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


class _Slack(Walker):
    """Marked mrkdwn: spans and code blocks as private-use markers (they become mrkdwn after splitting)."""

    def escape(self, text: str) -> str:
        return _esc(text)

    def emphasis(self, name: str, inner: str, ctx: frozenset[str]) -> str:
        return inner if name in ctx or "a" in ctx else _wrap(name, inner)

    def code_span(self, content: str, ctx: frozenset[str]) -> str:
        content = content.replace("`", "'")
        if "a" in ctx or not content.strip():
            return _esc(content)
        return f"{_SPANS['code'].opener}{_esc(content)}{_SPANS['code'].closer}"

    def code_block(self, node: SyntaxTreeNode, quoted: bool) -> str:
        content = node.content.rstrip("\n")
        if not content.strip():
            return ""
        return _esc(content) if quoted else f"{_SPANS['pre'].opener}{_esc(content)}{_SPANS['pre'].closer}"

    def quote(self, inner: str, quoted: bool) -> str:
        return inner if quoted or not inner else "\n".join("> " + line for line in inner.split("\n"))

    def item(self, body: str) -> str:
        return _QUOTE_MARK.sub("&gt; ", body)  # after the item's marker a quote's > is literal: escape it

    def link(self, node: SyntaxTreeNode, ctx: frozenset[str]) -> str:
        target = link_target(node)
        label = _PRIVATE.sub("", self.inline(node.children, ctx | {"a"})).replace("|", "¦").replace("\n", " ").strip()
        href = _safe_href(target)
        if href is None or "a" in ctx:
            return label or _esc(target)
        return f"<{href}|{label}>" if label and label != _esc(target) else f"<{href}>"


def markdown_to_mrkdwn(markdown: str) -> str:
    """Render the agent's Markdown as marked mrkdwn (span markers still in; see :func:`split_mrkdwn`)."""
    return _Slack().render(_PRIVATE.sub("\ufffd", markdown))


_TOKEN = re.compile(r"<[^<>]*>|&(?:amp|lt|gt);|[\ue001-\ue00a]|[^<>&\s\ue001-\ue00a]{1,8}|.", re.DOTALL)
"""A marker, a whole ``<link>``, one escape, a run of up to 8 non-space characters, or one space or line end."""


def _text(value: str) -> Mark:
    return Mark("text", value, width=len(value))


def _tokenize(marked: str) -> list[Mark]:
    tokens: list[Mark] = []
    for match in _TOKEN.finditer(marked):
        value = match.group()
        found = _BY_MARKER.get(value)
        if found is None:
            tokens.append(_text(value))
        else:
            name, opening = found
            span = _SPANS[name]
            width = len(span.open_text if opening else span.close_text)
            tokens.append(Mark("open" if opening else "close", value, name, width, span.closer, len(span.close_text)))
    return tokens


def _divide(token: Mark) -> list[Mark]:
    """A run of plain characters too long for a part, one token a character (never a link or an escape)."""
    run = token.value
    return [_text(ch) for ch in run] if len(run) > 1 and run[0] not in "<&" else []


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
    return split_marks(_tokenize(marked), limit, finish=_finish, trim=True, divide=_divide)


def render_mrkdwn(markdown: str, limit: int = MAX_MESSAGE_CHARS) -> list[str]:
    """Render the agent's Markdown to mrkdwn and split it into messages (an empty list for blank text).

    ``**bold**`` becomes ``*bold*``, ``_em_`` ``_em_``, ``~~strike~~`` ``~strike~``, headings bold lines, lists
    ``•``/numbered lines, fences ```` ``` ```` blocks (mrkdwn has no language tag), quotes ``>`` lines, tables
    ``a | b`` lines.

    Splitting happens *after* rendering, on the mrkdwn itself, like the Telegram renderer: the renderer marks where
    each span and code block opens and closes with private-use characters, so the splitter cuts only between
    characters or whole escapes and links, closes what is open at a cut (a code fence with ```` ``` ````, bold with
    ``*``) and reopens it at the start of the next part; the markers then become mrkdwn.
    """
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
