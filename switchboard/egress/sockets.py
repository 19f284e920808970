"""Outbound connections for clients built on httpx2 (the MCP SDK's HTTP transport) that reach only allowed addresses.

The address is checked when the socket is opened, on the very addresses it connects to (a name that resolves to an
allowed address when checked and to a private one a moment later cannot slip through); TLS still verifies the name.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterable

import httpcore2
import httpx2

from switchboard.egress.addresses import AddressGuard, AddressRefusedError

__all__ = ["MAX_RESPONSE_BYTES", "GuardedBackend", "guarded_http_client"]

_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
"""The MCP SDK's own defaults: a response stream may stay open a long time."""
MAX_RESPONSE_BYTES = 32 * 2**20
"""Most bytes one response may carry: the SDK reads a JSON answer whole into memory, whatever its size."""


class _CappedStream(httpx2.AsyncByteStream):
    """A response body that fails once it passes ``limit`` bytes (the connection is dropped with it)."""

    def __init__(self, inner: httpx2.AsyncByteStream, limit: int) -> None:
        self.inner = inner
        self.limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        async for chunk in self.inner:
            total += len(chunk)
            if total > self.limit:
                raise httpx2.ReadError(f"the response is larger than {self.limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class _CappedTransport(httpx2.AsyncHTTPTransport):
    """The transport whose every response body is capped at :data:`MAX_RESPONSE_BYTES`."""

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        if isinstance(response.stream, httpx2.AsyncByteStream):
            response.stream = _CappedStream(response.stream, MAX_RESPONSE_BYTES)
        return response


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
    transport = _CappedTransport(trust_env=False)
    # httpx2 takes no network backend: its pool is replaced by one that has ours (same TLS settings, no proxy)
    transport._pool = httpcore2.AsyncConnectionPool(
        ssl_context=httpx2.create_ssl_context(trust_env=False), network_backend=GuardedBackend(guard)
    )
    return httpx2.AsyncClient(transport=transport, trust_env=False, timeout=_TIMEOUT)
