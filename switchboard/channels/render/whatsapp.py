"""The agent's Markdown in WhatsApp's formatting, split into messages of at most 4,096 characters.

WhatsApp has bold, italic, strike-through, monospace, lists and quotes but no links, headings or images
(:func:`render_whatsapp` lists each rewrite). Splitting comes after rendering, with the shared splitter
(:func:`~switchboard.channels.render.split.split_reply`).
"""

from __future__ import annotations

import re
from typing import Final

from switchboard.channels.render.markdown import LineRole, fenced_lines
from switchboard.channels.render.split import split_reply

__all__ = ["MAX_TEXT", "render_whatsapp", "split_text"]

MAX_TEXT: Final = 4096
"""WhatsApp's limit for ``text.body``."""

_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_IMAGE = re.compile(r"!\[([^\]\n]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_LINK = re.compile(r"\[([^\]\n]+)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_AUTOLINK = re.compile(r"<(https?://[^>\s]+)>")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_ITALIC = re.compile(r"(?<![*\w])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![*\w])")
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$")
_STAR_ITEM = re.compile(r"^(\s*)[*+][ \t]+")
_BOLD_MARK = "\x00"


def _inline(text: str) -> str:
    text = _IMAGE.sub(lambda m: f"{m.group(1) or 'image'} ({m.group(2)})", text)
    text = _LINK.sub(lambda m: m.group(1) if m.group(1) == m.group(2) else f"{m.group(1)} ({m.group(2)})", text)
    text = _AUTOLINK.sub(r"\1", text)
    text = _BOLD.sub(lambda m: f"{_BOLD_MARK}{m.group(1) or m.group(2)}{_BOLD_MARK}", text)
    text = _STRIKE.sub(r"~\1~", text)
    text = _ITALIC.sub(r"_\1_", text)
    return text.replace(_BOLD_MARK, "*")


def _line(line: str) -> str:
    heading = _HEADING.match(line)
    if heading:
        title = heading.group(1).replace("**", "")
        return f"*{_plain_spans(title)}*"
    line = _STAR_ITEM.sub(r"\1- ", line)
    return _plain_spans(line)


def _plain_spans(line: str) -> str:
    """Rewrite the formatting outside inline code spans; the spans become WhatsApp monospace."""
    out: list[str] = []
    at = 0
    for span in _CODE_SPAN.finditer(line):
        out.append(_inline(line[at : span.start()].replace(_BOLD_MARK, "")))
        out.append(f"```{span.group(2).strip()}```")
        at = span.end()
    out.append(_inline(line[at:].replace(_BOLD_MARK, "")))
    return "".join(out)


def render_whatsapp(markdown: str) -> str:
    """The agent's Markdown as WhatsApp-formatted text (see the module docstring).

    - ``**bold**`` / ``__bold__`` → ``*bold*``; ``*italic*`` → ``_italic_``; ``~~strike~~`` → ``~strike~``;
    - inline ```code``` → ```` ```code``` ```` (monospace every client shows);
    - headings → bold lines; ``* item`` lists → ``- item`` (a leading ``*`` would start bold);
    - ``[text](url)`` → ``text (url)``, images ``![alt](url)`` → ``alt (url)``;
    - fenced code blocks keep their fences but lose the info string (WhatsApp would show ``python`` as text); nothing
      inside them is rewritten.
    """
    out: list[str] = []
    role: LineRole = "text"
    for line, role in fenced_lines(markdown):
        if role in ("open", "close"):
            out.append("```")  # without the info string: WhatsApp would show the language as text
        else:
            out.append(line if role == "code" else _line(line))
    if role in ("open", "code"):
        out.append("```")
    return "\n".join(out).strip("\n")


def split_text(markdown: str, limit: int = MAX_TEXT) -> list[str]:
    """``markdown`` rendered for WhatsApp, in parts of at most ``limit`` characters; no empty parts."""
    rendered = render_whatsapp(markdown)
    return [part for part in split_reply(rendered, limit, "chars") if part.strip()]
