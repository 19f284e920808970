"""What every channel's fake platform API shares: serving on a loopback port, and waiting for what it receives.

Each fake (``channels/<platform>/fake/``) is an aiohttp application playing the platform's API, run by a
:class:`FakeServer` for tests, benchmarks and ``switchboard run`` without credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Self, TypeVar

from aiohttp import web

from switchboard.channels.registry import FakePlatform

__all__ = ["FakeServer", "found_within", "wait_for_change"]

T = TypeVar("T")


class FakeServer(FakePlatform):
    """Runs a fake's application on a loopback port; an async context manager (started on entry, stopped on exit)."""

    app: web.Application
    base_url: str = ""
    """``http://host:port`` once serving."""
    _runner: web.AppRunner | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port`` (0 picks a free port) and return the base URL."""
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        bound_host, bound_port = self._runner.addresses[0][:2]
        self.base_url = f"http://{bound_host}:{bound_port}"
        self.serving(bound_host, bound_port)
        return self.base_url

    def serving(self, host: str, port: int) -> None:
        """Called once the fake serves at ``host:port`` (a fake that hands out further URLs sets them here)."""

    async def closing(self) -> None:
        """Called before the fake stops serving (a fake with open sockets or long polls ends them here)."""

    async def stop(self) -> None:
        """Stop serving."""
        await self.closing()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def wait_for_change(predicate: Callable[[], bool], changed: Callable[[], asyncio.Event], within_s: float) -> None:
    """Wait until ``predicate()`` holds, re-checked whenever ``changed()`` (the fake's current event) is set.

    Raises:
        TimeoutError: it did not hold within ``within_s``.
    """
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the fake did not see what was expected in time")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed().wait(), min(0.2, deadline - time.monotonic()))


async def found_within(matching: Callable[[], list[T]], changed: Callable[[], asyncio.Event], wait_s: float) -> list[T]:
    """What ``matching()`` finds, waiting up to ``wait_s`` for something to find (a ``/_fake/calls`` long poll).

    ``changed()`` is the fake's current event: set, and replaced, whenever it records a call.
    """
    deadline = time.monotonic() + wait_s
    found = matching()
    while not found and time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed().wait(), deadline - time.monotonic())
        found = matching()
    return found
