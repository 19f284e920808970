"""What the fake Slack refuses: Block Kit limits, over-long text, and text that is not well-formed mrkdwn."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MAX_STREAM_CHUNK", "MAX_TEXT", "check_blocks", "check_mrkdwn", "pings", "text_error"]

MAX_TEXT = 40_000
MAX_STREAM_CHUNK = 12_000
_PINGS = re.compile(r"<(!channel|!here|!everyone|!subteam\^[^>|]*|@[UW][A-Z0-9]*)(?:\|[^>]*)?>")
_MARKUP = re.compile(r"<(?:https?://|mailto:|@[UW]|#C|!)[^<>\s]*>")
_ENTITY = re.compile(r"&(?:amp|lt|gt);")


def pings(text: str) -> list[str]:
    """The mentions in ``text`` that would notify someone (``<!here>``, ``<@U…>`` …)."""
    return _PINGS.findall(text)


def check_mrkdwn(text: str) -> None:
    """Refuse text that is not well-formed mrkdwn: a bare ``&`` or ``<``/``>``, an unclosed code fence.

    Raises:
        ValueError: what is wrong, and where.
    """
    stripped = _MARKUP.sub("", text)
    lines = stripped.split("\n")
    for number, line in enumerate(lines, 1):
        body = line[1:] if line.startswith(">") else line  # a quote's marker is the one literal >
        if "<" in body or ">" in body:
            raise ValueError(f"line {number}: bare < or > (escape as &lt; &gt;): {line[:60]!r}")
        if "&" in _ENTITY.sub("", body):
            raise ValueError(f"line {number}: bare & (escape as &amp;): {line[:60]!r}")
    if text.count("```") % 2:
        raise ValueError("unclosed ``` code block")


def check_blocks(blocks: Any) -> str | None:
    """Slack's error code for blocks it would refuse (``invalid_blocks``), else ``None``."""
    if not isinstance(blocks, list) or len(blocks) > 50:
        return "invalid_blocks"
    for block in blocks:
        if not isinstance(block, dict):
            return "invalid_blocks"
        if block.get("type") == "section":
            text = (block.get("text") or {}).get("text", "")
            if not isinstance(text, str) or not 0 < len(text) <= 3000:
                return "invalid_blocks"
        elif block.get("type") == "actions":
            elements = block.get("elements") or []
            ids = [e.get("action_id") for e in elements]
            if not 0 < len(elements) <= 25 or len(set(ids)) != len(ids):
                return "invalid_blocks"
            for e in elements:
                label = (e.get("text") or {}).get("text", "")
                if not 0 < len(label) <= 75 or len(e.get("value", "")) > 2000 or len(e.get("action_id", "")) > 255:
                    return "invalid_blocks"
        else:
            return "invalid_blocks"
    return None


def text_error(text: Any, *, required: bool) -> str | None:
    """Slack's error code for a ``text`` it would refuse (and ``invalid_mrkdwn`` for malformed mrkdwn)."""
    if text is None or text == "":
        return "no_text" if required else None
    if not isinstance(text, str):
        return "invalid_arguments"
    if len(text) > MAX_TEXT:
        return "msg_too_long"
    try:
        check_mrkdwn(text)
    except ValueError:
        return "invalid_mrkdwn"
    return None
