"""Scripted replies shared by the fake model-provider servers (OpenAI, Anthropic).

A fake holds a queue of :class:`Reply` and :class:`Failure` items and answers each request with the
next one, in its provider's wire format, streaming included. Every request is recorded as a
:class:`Received` so tests can assert on what the adapter sent.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import dataclass, field
from itertools import count
from typing import Any

__all__ = ["GARBLED", "Call", "Failure", "Received", "Reply", "Script", "ShellRun", "split"]

_ids = count(1)

GARBLED = '{"type": "response.output_text.delta", "delta": "cut off'
"""The ``data:`` payload :attr:`Reply.garble_after` sends: JSON cut off mid-string."""


def split(text: str, pieces: int) -> list[str]:
    """Cut ``text`` into up to ``pieces`` non-empty fragments, the way a stream delivers it."""
    if pieces <= 1 or len(text) <= 1:
        return [text]
    size = max(1, -(-len(text) // pieces))
    return [text[i : i + size] for i in range(0, len(text), size)]


@dataclass
class Call:
    """A tool call the fake model makes. ``arguments`` may be a dict or a raw (possibly broken) JSON string."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    call_id: str = field(default_factory=lambda: f"call_{next(_ids):04d}")
    fragments: int = 3
    """How many ``arguments`` deltas the JSON is streamed in."""

    @property
    def raw(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass
class ShellRun:
    """A hosted shell call the fake OpenAI model makes and its container runs (one output per command)."""

    commands: list[str]
    stdout: list[str] = field(default_factory=list)
    exit_code: int = 0
    call_id: str = field(default_factory=lambda: f"call_{next(_ids):04d}")
    files: dict[str, bytes] = field(default_factory=dict)
    """Files the commands write in the container, by path (``/mnt/data/...``)."""


@dataclass
class Failure:
    """An error answer (or, with ``mid_stream``, an error event after the stream has started)."""

    status: int
    kind: str
    """The provider's error type or code (``rate_limit_error``, ``context_length_exceeded``)."""
    message: str
    headers: dict[str, str] = field(default_factory=dict)
    mid_stream: bool = False


@dataclass
class Reply:
    """A streamed answer: text deltas, then tool calls, then usage."""

    text: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    input_tokens: int = 12
    output_tokens: int = 5
    cached_input_tokens: int = 0
    """Of ``input_tokens``, those the provider says it read from its prompt cache."""
    cache_write_tokens: int = 0
    """Of ``input_tokens``, those the provider says it wrote to its prompt cache (Anthropic)."""
    stop: str | None = None
    """Override the provider's stop/finish reason (``length``, ``max_tokens`` ...)."""
    fail_after_text: Failure | None = None
    """Stream the text, then report this error inside the stream."""
    stall_after: int | None = None
    """Send this many events, then go quiet until :meth:`Script.release` (timeouts)."""
    garble_after: int | None = None
    """Send this many events, then one whose ``data:`` line is not valid JSON, and end the stream."""
    shell: list[ShellRun] = field(default_factory=list)
    """OpenAI Responses only: hosted shell calls run in OpenAI's container, streamed before the text."""
    searches: list[str] = field(default_factory=list)
    """Hosted web searches (their queries), streamed first: OpenAI ``web_search_call`` items (Responses only),
    Anthropic ``server_tool_use`` and ``web_search_tool_result`` blocks."""


@dataclass
class Received:
    """One request the fake received."""

    path: str
    headers: dict[str, str]
    """Lower-cased names."""
    body: dict[str, Any]


class Script:
    """The queue of scripted answers plus the log of received requests."""

    def __init__(self, *, api_key: str | None = None) -> None:
        self.api_key = api_key
        """When set, a request presenting any other key gets the provider's 401 (which echoes the key)."""
        self.queue: deque[Reply | Failure] = deque()
        self.received: list[Received] = []
        self._released = asyncio.Event()

    def reply(self, *text: str, calls: list[Call] | None = None, **options: Any) -> Reply:
        """Queue a reply streaming ``text`` as separate deltas, then ``calls``."""
        item = Reply(text=list(text), calls=list(calls or []), **options)
        self.queue.append(item)
        return item

    def fail(self, status: int, kind: str, message: str, **options: Any) -> Failure:
        """Queue an error answer."""
        item = Failure(status=status, kind=kind, message=message, **options)
        self.queue.append(item)
        return item

    def next(self) -> Reply | Failure:
        if not self.queue:
            return Failure(status=400, kind="invalid_request_error", message="fake: no scripted reply left")
        return self.queue.popleft()

    def release(self) -> None:
        """Let stalled streams finish."""
        self._released.set()

    async def stall(self) -> None:
        await asyncio.wait_for(self._released.wait(), timeout=30)
