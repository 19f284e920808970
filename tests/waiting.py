"""Waiting in tests for something another task, thread or process makes true: one polling helper for all."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

__all__ = ["wait_until"]


async def wait_until(
    check: Callable[[], bool | Awaitable[bool]],
    what: str | Callable[[], str],
    *,
    timeout: float = 30.0,
    interval: float = 0.02,
) -> float:
    """Poll ``check`` (sync or async) until it is true; returns the seconds waited.

    ``timeout`` is a bound on waiting, not a timing assertion: keep it generous. ``what`` names the condition in the
    failure; pass a callable to describe the state as it is when the wait gives up.

    Raises:
        AssertionError: ``check`` was still false after ``timeout`` seconds.
    """
    started = time.monotonic()
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            described = what() if callable(what) else what
            raise AssertionError(f"not within {timeout:g} s: {described}")
        await asyncio.sleep(interval)
