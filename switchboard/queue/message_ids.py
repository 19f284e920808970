"""③ Gateway message ids: milliseconds then OS randomness read in bulk (thread- and fork-safe)."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from typing import Final

__all__ = ["new_message_id"]

_ENTROPY_BYTES: Final = 4096
"""Random bytes read from the OS at once for message ids (512 ids per ``os.urandom`` call)."""
_entropy: tuple[bytes, Iterator[int]] = (b"", itertools.count())
"""This process's unread random bytes and the counter handing out their 8-byte slices."""


def _forget_entropy() -> None:
    """In a forked child: never hand out the parent's random bytes (the child reads fresh ones)."""
    global _entropy  # the pool is per process, replaced whole (reading the tuple is atomic)
    _entropy = (b"", itertools.count())


os.register_at_fork(after_in_child=_forget_entropy)


def _random_hex8() -> str:
    """16 hex digits from the OS's random source, read in bulk; thread- and fork-safe (no slice is handed out twice)."""
    global _entropy
    pool, counter = _entropy
    start = next(counter) * 8  # ``next`` on a count is atomic: two threads never get the same slice
    if start + 8 > len(pool):
        pool = os.urandom(_ENTROPY_BYTES)
        _entropy = (pool, itertools.count(1))  # this caller keeps slice 0 of the fresh pool
        start = 0
    return pool[start : start + 8].hex()


def new_message_id(now: float | None = None) -> str:
    """A gateway message id: 12 hex digits of milliseconds then 16 random hex digits (sortable by time).

    The random part comes from ``os.urandom``, read 4 KiB at a time (one system call per 512 ids); a forked
    process (an RQ work-horse) drops its parent's unread bytes, so ids stay unique.
    """
    ms = int((time.time() if now is None else now) * 1000)
    return f"{ms:012x}{_random_hex8()}"
