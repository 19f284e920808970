"""What the fake Graph APIs share (WhatsApp's, Messenger's and Instagram's): serving, and waiting for calls.

Each fake is an aiohttp application with a state object (what it received, what it will answer) that wakes
waiters whenever it records a call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from aiohttp import web

from switchboard.channels.fakes import FakeServer, wait_for_change

__all__ = ["FakeGraphServer"]


class _State(Protocol):
    base_url: str
    _changed: asyncio.Event
    """Set (and replaced) whenever a call is recorded."""


StateT = TypeVar("StateT", bound=_State)


class FakeGraphServer(FakeServer, Generic[StateT]):
    """Runs a fake Graph API application on a loopback port.

    Args:
        app: The fake's aiohttp application.
        state: Its state (what it received and will answer); its ``base_url`` is set once serving.
    """

    def __init__(self, app: web.Application, state: StateT) -> None:
        self.app = app
        self.state = state

    async def wait_for(self, predicate: Callable[[], bool], within_s: float = 10.0) -> None:
        """Wait until ``predicate()`` holds (re-checked as calls arrive).

        Raises:
            TimeoutError: it did not hold within ``within_s``.
        """
        await wait_for_change(predicate, lambda: self.state._changed, within_s)

    def serving(self, host: str, port: int) -> None:  # noqa: D102
        self.state.base_url = self.base_url
