"""Output capture: each stream of a command read at the pipe, head and tail kept, the middle counted and cut."""

from __future__ import annotations

import asyncio

__all__ = ["StreamCapture", "marker", "read_into"]

_CONTINUATION = bytes(range(0x80, 0xC0))
"""UTF-8 continuation bytes: a byte string holds as many characters as it has bytes outside this range."""


def marker(cut: int) -> str:
    """The line standing for ``cut`` characters left out of the middle of a stream."""
    return f"\n… {cut} characters truncated …\n"


def _chars(data: bytes | bytearray) -> int:
    return len(bytes(data).translate(None, _CONTINUATION))


class StreamCapture:
    """Keeps at most about ``4 × limit`` bytes of a stream's head and as many of its tail, whatever its length."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._cap = 4 * limit + 4  # enough bytes for ``limit`` characters of any width
        self._head = bytearray()
        self._tail = bytearray()
        self._dropped = 0
        """Characters in bytes dropped between head and tail."""

    def feed(self, chunk: bytes) -> None:
        """Take the next piece of the stream."""
        room = self._cap - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            over = len(self._tail) - self._cap
            if over > 0:
                self._dropped += _chars(self._tail[:over])
                del self._tail[:over]

    def text(self) -> str:
        """The stream within ``limit`` characters: all of it, or its head and tail around :func:`marker`."""
        head = self._head.decode("utf-8", "replace")
        tail = self._tail.decode("utf-8", "replace")
        if not self._dropped:
            head, tail = head + tail, ""
            if len(head) <= self.limit:
                return head
        total = len(head) + self._dropped + len(tail)
        keep_head = self.limit // 2
        keep_tail = self.limit - keep_head
        whole = head if not tail else None
        start = (whole or head)[:keep_head]
        end = ((whole or tail)[-keep_tail:]) if keep_tail else ""
        return start + marker(total - len(start) - len(end)) + end


async def read_into(stream: asyncio.StreamReader, capture: StreamCapture) -> None:
    """Read ``stream`` to its end into ``capture`` (memory stays bounded however much the command prints)."""
    while chunk := await stream.read(65536):
        capture.feed(chunk)
