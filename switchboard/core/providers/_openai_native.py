"""What OpenAI's Responses API does natively for an agent: compaction and the hosted shell.

Native compaction (``POST /v1/responses/compact``) answers a window of input items with a shorter one: the
user messages kept verbatim and one ``compaction`` item whose ``encrypted_content`` only OpenAI can read. The
window goes back as input, before whatever came after it; :func:`compacted_items` keeps from each output item
only what the input side accepts, and :func:`input_items` turns stored items back into input.

The hosted shell is the ``shell`` tool with a ``container_auto`` environment: OpenAI runs the model's commands
in a container it creates, inside the same streamed response. Its ``shell_call`` and ``shell_call_output``
items arrive as ``response.output_item.done`` events; :class:`HostedShellReport` turns them into the text the
user reads (what ran, its exit code, its output capped head and tail).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from openai.types.responses import (
    FunctionShellToolParam,
    ResponseFunctionShellToolCall,
    ResponseFunctionShellToolCallOutput,
    ResponseInputItemParam,
)

from switchboard.core.programs import cap_output

__all__ = [
    "REPORT_CHARS",
    "HostedShellReport",
    "compacted_items",
    "hosted_shell_tool",
    "input_items",
    "window_tokens",
]

REPORT_CHARS = 1_500
"""Most characters of one hosted command's output shown to the user (head and tail)."""


def hosted_shell_tool() -> FunctionShellToolParam:
    """The hosted shell tool: commands run in a container OpenAI creates for the request."""
    return {"type": "shell", "environment": {"type": "container_auto"}}


def compacted_items(output: object) -> list[dict[str, Any]]:
    """A compacted window (the JSON ``output`` of ``responses.compact``) as the items to store and send back.

    Messages keep their role and content; the compaction item its ``id`` and ``encrypted_content``; any other
    item goes back as it came (without its output-only ``status``). Anything that is not an item is left out.
    """
    items: list[dict[str, Any]] = []
    for raw in output if isinstance(output, list) else []:
        if not isinstance(raw, dict):
            continue
        kind = raw.get("type")
        if kind == "message":
            items.append({"type": "message", "role": raw.get("role", "user"), "content": raw.get("content", [])})
        elif kind == "compaction" and isinstance(raw.get("encrypted_content"), str):
            items.append({"type": "compaction", "id": raw.get("id"), "encrypted_content": raw["encrypted_content"]})
        elif isinstance(kind, str) and kind != "compaction":
            items.append({k: v for k, v in raw.items() if k != "status"})
    return items


def input_items(items: Sequence[dict[str, Any]]) -> list[ResponseInputItemParam]:
    """Stored compacted items as Responses input (they were validated on the way in by :func:`compacted_items`)."""
    return [cast(ResponseInputItemParam, {k: v for k, v in item.items() if v is not None}) for item in items]


def window_tokens(items: Sequence[dict[str, Any]]) -> int:
    """About what the plain messages of a compacted window cost (four characters a token)."""
    messages = [item.get("content", "") for item in items if item.get("type") == "message"]
    return sum(len(json.dumps(content, ensure_ascii=False)) for content in messages) // 4


@dataclass
class HostedShellReport:
    """The hosted shell's calls of one response, reported to the user as their outputs arrive."""

    commands: dict[str, list[str]] = field(default_factory=dict)
    """Commands of each ``shell_call`` by call id."""

    def call(self, item: ResponseFunctionShellToolCall) -> None:
        """Remember what a ``shell_call`` ran, for its output's report."""
        self.commands[item.call_id] = list(item.action.commands)

    def output(self, item: ResponseFunctionShellToolCallOutput) -> str:
        """The report of one ``shell_call_output``: each command, its outcome and its output, capped."""
        commands = self.commands.pop(item.call_id, [])
        lines: list[str] = []
        for index, chunk in enumerate(item.output):
            command = commands[index] if index < len(commands) else "(command)"
            outcome = chunk.outcome
            status = f"exit {outcome.exit_code}" if outcome.type == "exit" else "timed out"
            lines.append(f"$ {command}  [{status}]")
            text = (chunk.stdout + (("\n" + chunk.stderr) if chunk.stderr else "")).strip()
            if text:
                lines.append(cap_output(text, REPORT_CHARS))
        body = "\n".join(lines) or "(no output)"
        return f"\n[hosted shell]\n```\n{body}\n```\n"
