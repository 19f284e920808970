"""What the fake Graph APIs share (WhatsApp's, Messenger's and Instagram's): serving, and waiting for calls.

Each fake is an aiohttp application with a state object (what it received, what it will answer) that wakes
waiters whenever it records a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Generic, Protocol, Self, TypeVar

from aiohttp import web

from switchboard.channels.registry import FakePlatform

__all__ = ["FakeGraphServer"]


class _State(Protocol):
    base_url: str
    _changed: asyncio.Event
    """Set (and replaced) whenever a call is recorded."""


StateT = TypeVar("StateT", bound=_State)


class FakeGraphServer(FakePlatform, Generic[StateT]):
    """Runs a fake Graph API application on a loopback port.

    Args:
        app: The fake's aiohttp application.
        state: Its state (what it received and will answer); its ``base_url`` is set once serving.
    """

    def __init__(self, app: web.Application, state: StateT) -> None:
        self.app = app
        self.state = state
        self.base_url = ""
        self._runner: web.AppRunner | None = None

    async def wait_for(self, predicate: Callable[[], bool], within_s: float = 10.0) -> None:
        """Wait until ``predicate()`` holds (re-checked as calls arrive).

        Raises:
            TimeoutError: it did not hold within ``within_s``.
        """
        deadline = time.monotonic() + within_s
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("the fake did not see what was expected in time")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.state._changed.wait(), min(0.2, deadline - time.monotonic()))

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port`` (0 picks a free port) and return the base URL."""
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        bound_host, bound_port = self._runner.addresses[0][:2]
        self.base_url = self.state.base_url = f"http://{bound_host}:{bound_port}"
        return self.base_url

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
