"""What OpenAI's Responses API does natively for an agent: compaction, the hosted shell and the hosted web search.

Native compaction answers a window of input items with a shorter one (the user's messages and one encrypted
``compaction`` item), kept and sent back as input (:func:`compacted_items`, :func:`input_items`). The hosted shell
runs the model's commands in OpenAI's container within the same response; :class:`HostedShellReport` turns its items
into text the user reads, and :func:`container_files` fetches the files they wrote within a byte budget.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from typing import Any, cast

from openai.resources.containers.files import AsyncFiles
from openai.types.containers import FileListResponse
from openai.types.responses import (
    FunctionShellToolParam,
    ResponseFunctionShellToolCall,
    ResponseFunctionShellToolCallOutput,
    ResponseInputItemParam,
    WebSearchToolParam,
)

from switchboard.core.agent.native import ContainerFile
from switchboard.core.agent.programs import cap_output

__all__ = [
    "COMMAND_CHARS",
    "REPORT_CHARS",
    "REPORT_TOTAL_CHARS",
    "HostedShellReport",
    "compacted_items",
    "container_files",
    "hosted_search_tool",
    "hosted_shell_tool",
    "input_items",
    "window_tokens",
]

REPORT_CHARS = 1_500
"""Most characters of one hosted command's output shown to the user (head and tail)."""
COMMAND_CHARS = 200
"""Most characters of one hosted command line shown to the user (one line, head and tail)."""
REPORT_TOTAL_CHARS = 12_000
"""Most characters of hosted shell reports in one response; the commands past it are counted, not shown."""
_FENCE_BREAK = re.compile(r"`{3,}")
_MESSAGE_ROLES = ("user", "assistant")


def hosted_shell_tool() -> FunctionShellToolParam:
    """The hosted shell tool: commands run in a container OpenAI creates for the request."""
    return {"type": "shell", "environment": {"type": "container_auto"}}


def hosted_search_tool() -> WebSearchToolParam:
    """The hosted web search tool: OpenAI searches within the response and cites its sources in the answer."""
    return {"type": "web_search"}


def compacted_items(output: object) -> list[dict[str, Any]]:
    """A compacted window (the JSON ``output`` of ``responses.compact``) as the items to store and send back.

    Only ``message`` items (role ``user`` or ``assistant``, text or a list of parts) and the ``compaction`` item (its
    ``id`` and ``encrypted_content``) are kept: any other item (a call with no output, say) would go before every
    later request. Anything that is not such an item is left out.
    """
    items: list[dict[str, Any]] = []
    for raw in output if isinstance(output, list) else []:
        if not isinstance(raw, dict):
            continue
        kind, content = raw.get("type"), raw.get("content")
        if kind == "message" and raw.get("role") in _MESSAGE_ROLES and isinstance(content, str | list):
            items.append({"type": "message", "role": raw["role"], "content": content})
        elif kind == "compaction" and isinstance(raw.get("encrypted_content"), str):
            compaction_id = raw.get("id") if isinstance(raw.get("id"), str) else None
            items.append({"type": "compaction", "id": compaction_id, "encrypted_content": raw["encrypted_content"]})
    return items


def input_items(items: Sequence[dict[str, Any]]) -> list[ResponseInputItemParam]:
    """Stored compacted items as Responses input (they were validated on the way in by :func:`compacted_items`)."""
    return [cast(ResponseInputItemParam, {k: v for k, v in item.items() if v is not None}) for item in items]


def window_tokens(items: Sequence[dict[str, Any]], compaction_tokens: int | None = None) -> int:
    """About what a compacted window costs (four characters a token).

    Its messages, and its compaction item: ``compaction_tokens`` (the answer's output tokens) when the provider said,
    else the length of its encrypted content.
    """
    messages = [item.get("content", "") for item in items if item.get("type") == "message"]
    encrypted = sum(len(str(item.get("encrypted_content", ""))) for item in items if item.get("type") == "compaction")
    compaction = compaction_tokens if compaction_tokens is not None else encrypted // 4
    return max(1, compaction) + sum(len(json.dumps(content, ensure_ascii=False)) for content in messages) // 4


def _inert(text: str) -> str:
    """``text`` with every run of three or more backticks broken by zero-width spaces.

    The report is a ``` fenced block: a run of backticks in container output would close it (Discord closes a block
    at ``` anywhere in a line) and what followed would render as markup (links, mentions) under the report's label.
    """
    return _FENCE_BREAK.sub(lambda found: "\u200b".join(found.group()), text)


def _field(value: object, name: str) -> object:
    """``value``'s field ``name`` (``None`` when absent): the SDK does not validate what the server streamed."""
    return value.get(name) if isinstance(value, dict) else getattr(value, name, None)


@dataclass
class HostedShellReport:
    """The hosted shell's calls of one response, reported to the user as their outputs arrive."""

    commands: dict[str, list[str]] = field(default_factory=dict)
    """Commands of each ``shell_call`` by call id."""
    shown: int = 0
    """Characters of reports given so far in this response (at most :data:`REPORT_TOTAL_CHARS`)."""

    def call(self, item: ResponseFunctionShellToolCall) -> None:
        """Remember what a ``shell_call`` ran, for its output's report."""
        commands = _field(_field(item, "action"), "commands")
        self.commands[str(item.call_id)] = [str(c) for c in commands] if isinstance(commands, list) else []

    def output(self, item: ResponseFunctionShellToolCallOutput) -> str:
        """The report of one ``shell_call_output``: each command, its outcome and its output, capped."""
        commands = self.commands.pop(str(item.call_id), [])
        chunks = item.output if isinstance(item.output, list) else []
        lines: list[str] = []
        for index, chunk in enumerate(chunks):
            section = self._section(commands[index] if index < len(commands) else "(command)", chunk)
            if self.shown + len(section) > REPORT_TOTAL_CHARS:
                lines.append(f"… {len(chunks) - index} more commands not shown")
                self.shown = REPORT_TOTAL_CHARS
                break
            self.shown += len(section)
            lines.append(section)
        body = "\n".join(lines) or "(no output)"
        return f"\n[hosted shell]\n```\n{body}\n```\n"

    @staticmethod
    def _section(command: str, chunk: object) -> str:
        """One command's lines: ``$ command  [status]`` and its output, capped and unable to end the fence."""
        outcome = _field(chunk, "outcome")
        kind = _field(outcome, "type")
        status = (
            f"exit {_field(outcome, 'exit_code')}" if kind == "exit" else "timed out" if kind == "timeout" else "ended"
        )
        shown = cap_output(" ".join(command.split()), COMMAND_CHARS)
        stdout, stderr = _field(chunk, "stdout"), _field(chunk, "stderr")
        text = (
            (stdout if isinstance(stdout, str) else "") + (f"\n{stderr}" if isinstance(stderr, str) else "")
        ).strip()
        lines = [f"$ {_inert(shown)}  [{status}]", *([_inert(cap_output(text, REPORT_CHARS))] if text else [])]
        return "\n".join(lines)


async def container_files(
    files: AsyncFiles, container_id: str, *, skip: Set[str], limit: int, max_bytes: int, deadline_s: float
) -> list[ContainerFile]:
    """Files the model's commands wrote in a hosted container (``source: assistant``), the newest ``limit``.

    Those whose id is in ``skip`` are not fetched. Together they hold at most ``max_bytes``: a file listed bigger
    than what is left is not fetched, and a download passing it is cut off (the listing's sizes are not trusted);
    either comes back without content and with the reason. Entries of the listing that are not files are skipped.
    Listing and downloads end within ``deadline_s`` (the SDK's timeout is per read: a body can trickle forever); the
    file being fetched then comes back without content, and the files after it are left in the container.

    Raises:
        TimeoutError: the listing did not come within ``deadline_s``.
    """
    found: list[ContainerFile] = []
    current: FileListResponse | None = None
    try:
        async with asyncio.timeout(deadline_s):
            page = await files.list(container_id, order="desc", limit=max(1, min(limit, 100)))
            entries = page.data if isinstance(page.data, list) else []
            left = max_bytes
            for entry in entries[:limit]:  # a server may ignore ``limit``
                current = entry if isinstance(entry, FileListResponse) else None
                left = await _fetch_one(files, container_id, entry, skip, left, max_bytes, found)
    except TimeoutError:
        if current is None or not isinstance(current.id, str) or not isinstance(current.path, str):
            raise
        found.append(ContainerFile(current.id, current.path, None, f"not fetched within {deadline_s:g} s"))
    return found


async def _fetch_one(
    files: AsyncFiles,
    container_id: str,
    entry: object,
    skip: Set[str],
    left: int,
    max_bytes: int,
    found: list[ContainerFile],
) -> int:
    """Fetch one listed file into ``found`` if it is due and fits in ``left`` bytes; the bytes left after it."""
    if not (isinstance(entry, FileListResponse) and isinstance(entry.id, str) and isinstance(entry.path, str)):
        return left
    if entry.source != "assistant" or entry.id in skip:
        return left
    too_big = ContainerFile(entry.id, entry.path, None, f"over the quota of {max_bytes} bytes for a step's files")
    if isinstance(entry.bytes, int) and entry.bytes > left:
        found.append(too_big)
        return left
    data = bytearray()
    async with files.content.with_streaming_response.retrieve(entry.id, container_id=container_id) as response:
        async for part in response.iter_bytes():
            data += part
            if len(data) > left:
                break
    if len(data) > left:
        found.append(too_big)
        return left
    found.append(ContainerFile(entry.id, entry.path, bytes(data)))
    return left - len(data)
