"""Outbound connections for clients built on httpx2 (the MCP SDK's HTTP transport) that reach only allowed addresses.

The address is checked when the socket is opened, on the very addresses it connects to (a name that resolves to an
allowed address when checked and to a private one a moment later cannot slip through); TLS still verifies the name.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable

import httpcore2
import httpx2

from switchboard.egress.addresses import AddressGuard, AddressRefusedError

__all__ = ["GuardedBackend", "guarded_http_client"]

_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
"""The MCP SDK's own defaults: a response stream may stay open a long time."""


class GuardedBackend(httpcore2.AsyncNetworkBackend):
    """Resolves, checks every address with the guard, and connects to a checked address."""

    def __init__(self, guard: AddressGuard, inner: httpcore2.AsyncNetworkBackend | None = None) -> None:
        self.guard = guard
        self.inner = inner or httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore2's interface)
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        """Connect to ``host`` only when every address it resolves to is allowed.

        Raises:
            AddressRefusedError: one of its addresses is refused (or it has none).
        """
        try:
            async with asyncio.timeout(timeout):
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError):
            infos = []
        addresses = [str(info[4][0]) for info in infos]
        self.guard.check(host, addresses)
        return await self.inner.connect_tcp(addresses[0], port, timeout, local_address, socket_options)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore2's interface)
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        """Refused: egress goes to network addresses only."""
        raise AddressRefusedError("unix socket", "unix_socket")

    async def sleep(self, seconds: float) -> None:
        """As the inner backend sleeps."""
        await self.inner.sleep(seconds)


def guarded_http_client(guard: AddressGuard) -> httpx2.AsyncClient:
    """An httpx2 client whose every connection passes ``guard``; no proxy or settings from the environment."""
    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    # httpx2 takes no network backend: its pool is replaced by one that has ours (same TLS settings, no proxy)
    transport._pool = httpcore2.AsyncConnectionPool(
        ssl_context=httpx2.create_ssl_context(trust_env=False), network_backend=GuardedBackend(guard)
    )
    return httpx2.AsyncClient(transport=transport, trust_env=False, timeout=_TIMEOUT)
