"""Conversation repair shared by the wire adapters: every tool call is followed by its own result.

Both OpenAI and Anthropic reject a conversation in which a tool call has no result, or a result has no
call, and Anthropic also wants each result right after the assistant turn that asked for it. History
windows, cancelled runs and hand-edited sessions can break that; :func:`paired` puts it right before a
request is built, so one bad entry does not turn every later step into an HTTP 400.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from switchboard.core.model import ChatMessage

__all__ = ["MISSING_RESULT", "arguments_json", "paired", "parse_arguments"]

logger = logging.getLogger(__name__)

MISSING_RESULT = "error: no result was recorded for this call"
"""The result stood in for a tool call whose result is missing from the history."""


def paired(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """Return the messages with each tool result placed right after the assistant turn that called it.

    A call with no result gets :data:`MISSING_RESULT`; a result whose call is not in the history is
    dropped (it would be rejected by the provider and cannot be attributed).
    """
    results: dict[str, ChatMessage] = {}
    called: set[str] = set()
    for message in messages:
        if message.role == "tool" and message.tool_call_id is not None:
            results.setdefault(message.tool_call_id, message)
        for call in message.tool_calls:
            called.add(call.id)

    out: list[ChatMessage] = []
    emitted: set[str] = set()
    dropped = 0
    for message in messages:
        if message.role == "tool":
            if message.tool_call_id not in called:
                dropped += 1
            continue
        out.append(message)
        for call in message.tool_calls:
            if call.id in emitted:
                continue
            emitted.add(call.id)
            result = results.get(call.id)
            if result is None:
                result = ChatMessage(role="tool", content=MISSING_RESULT, tool_call_id=call.id, name=call.name)
            out.append(result)
    if dropped:
        logger.warning("dropped %d tool result(s) whose call is not in the history", dropped)
    return out


def arguments_json(arguments: dict[str, Any]) -> str:
    """Encode call arguments as the JSON string the OpenAI formats carry.

    Malformed arguments (``{"_raw": ...}``) go back as that valid object: some OpenAI-compatible servers
    parse the arguments of earlier calls to render their chat template, and would fail on broken JSON.
    """
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def parse_arguments(raw: str) -> dict[str, Any]:
    """Decode streamed call arguments; anything but a JSON object comes back as ``{"_raw": raw}``.

    The runtime's tool gateway then reports a validation error the model can correct, instead of the
    whole step failing on the model's malformed JSON.
    """
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested thousands deep
        return {"_raw": raw}
    if not isinstance(value, dict):
        return {"_raw": raw}
    return value
