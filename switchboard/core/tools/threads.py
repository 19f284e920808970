"""Threads for blocking tool work, shared fairly between sessions.

Tool bodies that block (file system work) run through :func:`run_blocking`, not ``asyncio.to_thread``: on a
process-wide pool of ``threads`` threads, each session may hold at most ``per_session`` of them at once. A
session's slot is freed when its thread really finishes, not when the awaiting call gives up (a tool timeout
cannot stop a thread), so one session's stuck work never takes the threads another session needs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, Protocol, TypeVar

from switchboard.types import SessionKey

__all__ = ["SessionThreads", "ThreadShare", "default_share", "run_blocking"]

P = ParamSpec("P")
T = TypeVar("T")


class SessionThreads(Protocol):
    """What :func:`run_blocking` reads of a call's context (a :class:`.definition.ToolContext`)."""

    @property
    def session_key(self) -> SessionKey:
        """The session whose share the work counts against."""

    @property
    def threads(self) -> ThreadShare | None:
        """The pool the gateway set; ``None``: the process default."""


class ThreadShare:
    """A thread pool where each session gets a bounded share."""

    def __init__(self, threads: int = 16, per_session: int = 2) -> None:
        """Create the pool (its threads start on demand).

        Args:
            threads: Threads in the pool, for every session of the process together.
            per_session: Most threads one session may hold at once; more calls wait for one of them to finish.
        """
        self.threads = max(1, threads)
        self.per_session = max(1, min(per_session, self.threads))
        self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="tool")
        self._lock = threading.Lock()
        self._busy: dict[str, int] = {}
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}

    def busy(self, session: str) -> int:
        """Threads ``session`` holds now."""
        with self._lock:
            return self._busy.get(session, 0)

    async def run(self, session: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` in the pool on behalf of ``session``, once the session has a free slot."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._busy.get(session, 0) < self.per_session:
                    self._busy[session] = self._busy.get(session, 0) + 1
                    break
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters.setdefault(session, []).append((loop, waiter))
            await waiter
        try:
            future = self._executor.submit(fn, *args, **kwargs)
        except BaseException:
            self._release(session)
            raise
        future.add_done_callback(lambda _done: self._release(session))
        return await asyncio.wrap_future(future)

    def _release(self, session: str) -> None:
        with self._lock:
            left = self._busy.get(session, 0) - 1
            if left > 0:
                self._busy[session] = left
            else:
                self._busy.pop(session, None)
            waiters = self._waiters.pop(session, [])
        for loop, waiter in waiters:
            try:
                loop.call_soon_threadsafe(_wake, waiter)
            except RuntimeError:  # that loop has closed; nobody waits there any more
                continue

    def shutdown(self) -> None:
        """Stop accepting work (running threads finish on their own)."""
        self._executor.shutdown(wait=False, cancel_futures=True)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


_default: ThreadShare | None = None
_default_lock = threading.Lock()


def default_share() -> ThreadShare:
    """The process's share used when a tool context carries none (tests, tools called directly)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = ThreadShare()
        return _default


async def run_blocking(ctx: SessionThreads, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run blocking tool work for the session of ``ctx``, within its share of the tool threads."""
    share = ctx.threads if ctx.threads is not None else default_share()
    return await share.run(ctx.session_key, fn, *args, **kwargs)
