"""The egress proxy sandboxes talk to: HTTP/1.1 forward proxy on loopback TCP and on a unix socket.

``https://`` arrives as ``CONNECT`` and is terminated with a certificate from the deployment CA, so every request,
inside a tunnel too, goes through the :class:`~switchboard.egress.forward.Forwarder` to the host the ``CONNECT``
named. Clients are known by their grant token (the proxy URL's user name; 407 without a live grant), and a confined
grant is honoured only on its own socket. h11 parses HTTP strictly, so nothing is smuggled through the proxy.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import hmac
import ipaddress
import logging
import os
import shutil
import ssl
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Self, cast

import h11
from yarl import URL

from switchboard.egress.ca import DeploymentCA
from switchboard.egress.events import EgressSink
from switchboard.egress.forward import Forwarder, Outcome
from switchboard.egress.policy import EgressPolicy, Grant

if TYPE_CHECKING:
    from aiohttp.abc import AbstractResolver

    from switchboard.settings import Settings

__all__ = ["EgressProxy", "build_proxy"]

logger = logging.getLogger(__name__)

_HEAD_LIMIT = 32 * 1024
_READ = 65536


class _Malformed(Exception):
    """The client's request cannot be handled (bad target, broken framing)."""


def _authority(target: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host or not 0 < int(port) < 65536:
        raise _Malformed(target)
    return host.strip("[]").lower().rstrip("."), int(port)


class EgressProxy:
    """Serves the egress policy to sandboxes: ``async with EgressProxy(...) as proxy: proxy.environment(grant)``."""

    def __init__(
        self,
        forwarder: Forwarder,
        ca: DeploymentCA,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        socket_path: Path | None = None,
    ) -> None:
        """Build the proxy (it listens once started).

        Args:
            forwarder: the policy layer every request goes through.
            ca: signs the certificates the proxy presents inside ``CONNECT`` tunnels.
            host: the TCP listener's address; loopback only.
            port: its port; ``0`` picks a free one.
            socket_path: also listen on this unix socket (what a sandbox has bound in).
        """
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"the egress proxy listens on loopback only, not {host}")
        self.forwarder = forwarder
        self.ca = ca
        self.host = host
        self.port = port
        self.socket_path = socket_path
        self._servers: list[asyncio.Server] = []
        self._timeout = forwarder.settings.client_timeout_s
        self._max_body = forwarder.policy.max_request_bytes

    async def start(self) -> None:
        """Start listening (TCP, then the unix socket when one is configured)."""
        tcp = await asyncio.start_server(self._client, self.host, self.port, limit=_READ)
        self.port = tcp.sockets[0].getsockname()[1]
        self._servers.append(tcp)
        if self.socket_path is not None:
            self.socket_path.parent.mkdir(parents=True, exist_ok=True)
            self.socket_path.unlink(missing_ok=True)
            self._servers.append(await asyncio.start_unix_server(self._client, str(self.socket_path), limit=_READ))

    async def close(self) -> None:
        """Stop listening and close the upstream connection pool."""
        for server in self._servers:
            server.close()
        for server in self._servers:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 2)
        self._servers.clear()
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)
        await self.forwarder.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def proxy_url(self, grant: Grant, address: str | None = None) -> str:
        """The proxy URL for a client holding ``grant`` (``address``: where the client reaches the proxy)."""
        return f"http://{grant.token}:grant@{address or f'{self.host}:{self.port}'}"

    def environment(self, grant: Grant, address: str | None = None, ca_path: str | None = None) -> dict[str, str]:
        """Variables that make common tools (curl, Python, Node, git, pip) use the proxy and trust only its CA.

        Args:
            grant: whose requests these are.
            address: ``host:port`` where the client reaches the proxy (a bridge inside a sandbox), if not directly.
            ca_path: where the client sees the CA certificate (its path inside a sandbox), if not at its host path.
        """
        url = self.proxy_url(grant, address)
        ca = ca_path or str(self.ca.cert_path)
        env = {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
        env |= {"NO_PROXY": "", "no_proxy": ""}
        env |= {
            name: ca
            for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "PIP_CERT")
        }
        env["GIT_SSL_CAINFO"] = ca
        return env

    @contextlib.asynccontextmanager
    async def own_socket(self, grant: Grant) -> AsyncIterator[Path]:
        """A unix socket serving ``grant`` alone, in a fresh private directory; both are gone when the block ends.

        The directory is ``0700`` and the socket ``0600`` (the worker's user only): other local users cannot reach
        it, and a sandbox sees only the socket bound into it.
        """
        directory = Path(tempfile.mkdtemp(prefix="sb-egress-"))  # 0700
        path = directory / "proxy.sock"
        try:
            server = await asyncio.start_unix_server(
                functools.partial(self._client, only=grant.token), str(path), limit=_READ
            )
            os.chmod(path, 0o600)
            try:
                yield path
            finally:
                server.close()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(server.wait_closed(), 2)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    async def _client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, only: str | None = None
    ) -> None:
        try:
            await self._serve(reader, writer, only)
        except (ConnectionError, TimeoutError, ssl.SSLError, h11.ProtocolError, _Malformed, OSError) as err:
            logger.debug("egress: client connection ended (%s)", type(err).__name__)
        except Exception as err:  # never a traceback that could carry request data into the logs
            logger.warning("egress: client connection failed (%s)", type(err).__name__)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _next(self, conn: h11.Connection, reader: asyncio.StreamReader) -> h11.Event | type[h11.PAUSED]:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(_READ))
            else:
                return cast("h11.Event | type[h11.PAUSED]", event)

    def _grant(self, headers: list[tuple[str, str]], only: str | None) -> Grant | None:
        """The live grant the request presents, if this listener honours it (``only``: its own socket's grant)."""
        grant = self._presented(headers)
        if grant is None:
            return None
        if only is None:
            return None if grant.confined else grant
        return grant if hmac.compare_digest(grant.token.encode(), only.encode()) else None

    def _presented(self, headers: list[tuple[str, str]]) -> Grant | None:
        for name, value in headers:
            if name != "proxy-authorization":
                continue
            scheme, _, credentials = value.strip().partition(" ")
            if scheme.lower() == "basic":
                try:
                    credentials = base64.b64decode(credentials.strip(), validate=True).decode().partition(":")[0]
                except (binascii.Error, UnicodeDecodeError):
                    return None
            elif scheme.lower() != "bearer":
                return None
            return self.forwarder.policy.lookup(credentials.strip())
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, only: str | None) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_HEAD_LIMIT)
        while True:
            async with asyncio.timeout(self._timeout):
                request = await self._next(conn, reader)
            if not isinstance(request, h11.Request):
                return
            method = request.method.decode("ascii", "replace").upper()
            headers = [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in request.headers]
            target = request.target.decode("ascii", "replace")
            grant = self._grant(headers, only)
            if method == "CONNECT":
                await self._connect(conn, reader, writer, grant, target)
                return
            try:
                url = URL(target, encoded=True) if target.startswith(("http://", "https://")) else None
            except ValueError:
                url = None
            if url is None or not url.host:
                await self._answer(conn, writer, await self.forwarder.refuse(grant, method, URL(), "bad_request"))
                return
            if not await self._exchange(conn, reader, writer, grant, method, url, headers):
                return

    async def _connect(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        grant: Grant | None,
        target: str,
    ) -> None:
        async with asyncio.timeout(self._timeout):
            end = await self._next(conn, reader)
        if not isinstance(end, h11.EndOfMessage):
            raise _Malformed("CONNECT with a body")
        host, port = _authority(target)
        try:
            url = URL.build(scheme="https", host=host, port=port)
        except ValueError:
            raise _Malformed(target) from None
        refused = self.forwarder.precheck(grant, "CONNECT", host, port)
        if refused is not None or grant is None:
            await self._answer(conn, writer, await self.forwarder.refuse(grant, "CONNECT", url, refused or "no_grant"))
            return
        writer.write(conn.send(h11.Response(status_code=200, headers=[], reason=b"Connection established")))
        await writer.drain()
        if conn.trailing_data[0]:
            return  # the client did not wait for the answer: nothing it sent may be trusted as TLS
        await writer.start_tls(self.ca.server_context(host), ssl_handshake_timeout=self._timeout)
        inner = h11.Connection(h11.SERVER, max_incomplete_event_size=_HEAD_LIMIT)
        base = str(url)
        while True:
            async with asyncio.timeout(self._timeout):
                request = await self._next(inner, reader)
            if not isinstance(request, h11.Request):
                return
            method = request.method.decode("ascii", "replace").upper()
            headers = [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in request.headers]
            path = request.target.decode("ascii", "replace")
            if not path.startswith("/"):  # absolute form inside a tunnel still goes to the tunnel's host
                path = URL(path, encoded=True).raw_path_qs if path.startswith("https://") else "/"
            live = self.forwarder.policy.lookup(grant.token)  # a revoked grant stops its open tunnels too
            if not await self._exchange(inner, reader, writer, live, method, URL(base + path, encoded=True), headers):
                return

    async def _exchange(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        grant: Grant | None,
        method: str,
        url: URL,
        headers: list[tuple[str, str]],
    ) -> bool:
        """Handle one request; ``True`` when the connection can take another."""
        if conn.they_are_waiting_for_100_continue:
            writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        body = await self._body(conn, reader, headers)
        if body is None:
            await self._answer(conn, writer, await self.forwarder.refuse(grant, method, url, "request_too_large"))
            return False
        outcome = await self.forwarder.forward(grant, method, url, headers, body)
        await self._answer(conn, writer, outcome, head=method == "HEAD")
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
            return True
        return False

    async def _body(
        self, conn: h11.Connection, reader: asyncio.StreamReader, headers: list[tuple[str, str]]
    ) -> bytes | None:
        """The request body, or ``None`` when it is larger than allowed (then it is not read)."""
        declared = next((v for n, v in headers if n == "content-length"), "0")
        if declared.strip().isdigit() and int(declared) > self._max_body:
            return None
        parts: list[bytes] = []
        total = 0
        async with asyncio.timeout(self._timeout):
            while True:
                event = await self._next(conn, reader)
                if isinstance(event, h11.Data):
                    total += len(event.data)
                    if total > self._max_body:
                        return None
                    parts.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    return b"".join(parts)
                else:
                    raise _Malformed("request body ended early")

    async def _answer(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, outcome: Outcome, *, head: bool = False
    ) -> None:
        headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in outcome.headers]
        if not head and outcome.status not in (204, 304):
            headers.append((b"content-length", str(len(outcome.body)).encode()))
        if outcome.refused is not None:
            headers.append((b"connection", b"close"))
        data = conn.send(
            h11.Response(
                status_code=outcome.status, headers=headers, reason=outcome.reason.encode("latin-1", "replace")
            )
        )
        if outcome.body and not head:
            data += conn.send(h11.Data(data=outcome.body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        writer.write(data or b"")
        await writer.drain()


def build_proxy(
    settings: Settings,
    sink: EgressSink,
    *,
    resolver: AbstractResolver | None = None,
    socket_path: Path | None = None,
) -> EgressProxy:
    """The deployment's proxy: policy from the settings, CA and unix socket under ``<data dir>/egress/``.

    Start it with ``async with`` (or :meth:`EgressProxy.start`); issue grants with ``proxy.forwarder.policy.grant``.
    ``socket_path`` replaces the default ``<data dir>/egress/proxy.sock`` (each worker process has its own).
    """
    root = settings.data_path / "egress"
    forwarder = Forwarder(EgressPolicy.from_settings(settings), settings.egress, sink, resolver=resolver)
    ca = DeploymentCA.load_or_create(root / "ca")
    return EgressProxy(
        forwarder,
        ca,
        host=settings.egress.host,
        port=settings.egress.port,
        socket_path=socket_path or root / "proxy.sock",
    )
