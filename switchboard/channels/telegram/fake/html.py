"""Telegram's HTML parse mode, checked strictly the way the Bot API does (for the fake Bot API and tests)."""

from __future__ import annotations

import html
from html.parser import HTMLParser

__all__ = ["check_html"]

_ALLOWED_TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "tg-spoiler", "span", "a", "code", "pre"}
_ALLOWED_TAGS |= {"blockquote", "tg-emoji"}
_NAMED_ENTITIES = {"lt", "gt", "amp", "quot"}


class _HtmlCheck(HTMLParser):
    """Telegram's HTML parse mode, strictly: allowed tags only, balanced, ``<``/``>``/``&`` escaped."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.stack: list[str] = []
        self.text: list[str] = []
        self.error: str | None = None

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in _ALLOWED_TAGS:
            self._fail(f'Unsupported start tag "{tag}"')
        elif tag == "span" and dict(attrs).get("class") != "tg-spoiler":
            self._fail('Unsupported start tag "span"')
        elif "code" in self.stack or ("pre" in self.stack and not (tag == "code" and self.stack[-1] == "pre")):
            self._fail(f'Can\'t nest "{tag}" inside code or pre')
        elif "a" in self.stack and tag in {"a", "code", "pre"}:
            self._fail(f'Can\'t nest "{tag}" inside a link')
        elif tag == "blockquote" and "blockquote" in self.stack:
            self._fail("Blockquotes can't be nested")
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self._fail(f'Can\'t find end tag corresponding to start tag "{self.stack[-1] if self.stack else tag}"')
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        if any(c in data for c in "<>&"):
            self._fail("Unescaped <, > or & in text")
        self.text.append(data)

    def handle_entityref(self, name: str) -> None:
        if name not in _NAMED_ENTITIES:
            self._fail(f'Unsupported HTML entity "&{name};"')
        self.text.append(html.unescape(f"&{name};"))

    def handle_charref(self, name: str) -> None:
        self.text.append(html.unescape(f"&#{name};"))

    def check(self, markup: str) -> str:
        """The visible text, or raise ``ValueError`` with Telegram's kind of message."""
        self.feed(markup)
        self.close()
        if self.stack:
            self._fail(f'Can\'t find end tag corresponding to start tag "{self.stack[-1]}"')
        if self.error:
            raise ValueError(self.error)
        return "".join(self.text)


def check_html(markup: str) -> str:
    """Parse ``markup`` the way Telegram's HTML mode does; return the visible text or raise ``ValueError``."""
    return _HtmlCheck().check(markup)
