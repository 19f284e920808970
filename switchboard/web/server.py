"""The web tier's HTTP server: aiohttp, with bounds on slow clients and on the number of open connections.

:class:`GuardedAppRunner` adds what aiohttp lacks (``SWITCHBOARD_HTTP__*``): header and body deadlines and a
connection cap, each close counted and summarised in the log, a client's malformed request logged at DEBUG. Two
shortcuts keep the webhook hot path cheap, both in aiohttp's public API: :data:`DIRECT_ROUTES` and
:class:`FixedResponse` (``docs/ARCHITECTURE.md`` §1).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Final

from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from switchboard.settings import HttpSettings

__all__ = [
    "DIRECT_ROUTES",
    "LOG_INTERVAL_S",
    "ConnectionGuard",
    "DirectHandler",
    "FixedResponse",
    "GuardedAppRunner",
    "header_lines",
]

logger = logging.getLogger(__name__)

LOG_INTERVAL_S: Final = 10.0
"""Closed and shed connections are summed up in one log line at most this often."""
_FD_RESERVE: Final = 256
"""File descriptors kept for everything but client connections (Redis, platform APIs, files)."""


DirectHandler = Callable[[web.Application, web.BaseRequest], Awaitable[web.StreamResponse]]
DIRECT_ROUTES: Final = web.AppKey("direct_routes", dict[str, DirectHandler])
"""Exact path → handler for ``POST`` requests served without the URL dispatcher (see the module docstring)."""
_FIXED_CACHE_SIZE: Final = 256
_dated: list[Any] = [None, b""]


def _date_header() -> bytes:
    """The ``Date`` header line for now (RFC 9110 format, with its line end), formatted once per second."""
    second = int(time.time())
    if _dated[0] != second:
        _dated[0], _dated[1] = second, b"Date: %s\r\n" % formatdate(second, usegmt=True).encode()
    return _dated[1]  # type: ignore[no-any-return]


def _phrase(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:  # a status without a registered phrase: aiohttp sends an empty one too
        return b""


class FixedResponse(web.StreamResponse):
    """An answer with a fixed status, ``Content-Type`` and body, written in one transport write.

    Instances are shared (:meth:`of` caches them per answer, keep-alive and HTTP version), so nothing is set on
    them per request. The headers are what aiohttp would send for the same answer: ``Content-Type`` (none for an empty
    body without one), ``Content-Length``, ``Date``, ``Server``, and ``Connection`` where the version's default
    differs from whether the connection is kept.
    """

    _cache: dict[tuple[int, bytes, str | None, bool, int], FixedResponse] = {}

    def __init__(
        self,
        status: int,
        body: bytes,
        content_type: str | None,
        *,
        keep_alive: bool,
        minor: int,
        headers: bytes = b"",
    ) -> None:
        """The answer for a request of HTTP/1.``minor`` whose connection is kept (``keep_alive``) or closed.

        ``headers``: further header lines, each ending in ``CRLF`` (see :func:`header_lines`).
        """
        super().__init__(status=status)
        self._keep = keep_alive
        head = [b"HTTP/1.%d %d %s\r\n" % (minor, status, _phrase(status))]
        if content_type is not None:
            head.append(b"Content-Type: %s\r\n" % content_type.encode("latin-1"))
        head.append(headers)
        head.append(b"Content-Length: %d\r\nServer: %s\r\n" % (len(body), SERVER_SOFTWARE.encode()))
        if keep_alive and minor == 0:
            head.append(b"Connection: keep-alive\r\n")
        elif not keep_alive and minor == 1:
            head.append(b"Connection: close\r\n")
        self._head = b"".join(head)
        self._tail = b"\r\n" + body

    @classmethod
    def of(cls, request: web.BaseRequest, status: int, body: bytes, content_type: str | None) -> FixedResponse | None:
        """The shared response for this answer to ``request``; ``None`` where a fixed answer does not fit.

        It does not fit an answer without a body (1xx, 204, 304), a ``HEAD`` request or another HTTP than 1.x. Once
        the cache is full, a fresh response is made per call.
        """
        version = request.version
        if status < 200 or status in (204, 304) or version.major != 1 or request.method == "HEAD":
            return None
        key = (status, body, content_type, request.keep_alive, version.minor)
        found = cls._cache.get(key)
        if found is None:
            found = cls(status, body, content_type, keep_alive=key[3], minor=key[4])
            if len(cls._cache) < _FIXED_CACHE_SIZE:
                cls._cache[key] = found
        return found

    @classmethod
    def once(
        cls, request: web.BaseRequest, status: int, body: bytes, content_type: str | None, headers: bytes = b""
    ) -> FixedResponse | None:
        """A response of its own (not cached: its body differs per request), where :meth:`of` would fit one."""
        version = request.version
        if status < 200 or status in (204, 304) or version.major != 1 or request.method == "HEAD":
            return None
        return cls(status, body, content_type, keep_alive=request.keep_alive, minor=version.minor, headers=headers)

    @property
    def keep_alive(self) -> bool:
        """Whether the connection is kept after this answer (decided from the request it was made for)."""
        return self._keep

    async def prepare(self, request: web.BaseRequest) -> None:
        """Write the whole answer; the connection reports a reset when the client has gone."""
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection before the answer")
        transport.write(b"".join((self._head, _date_header(), self._tail)))

    async def write_eof(self, data: bytes = b"") -> None:
        """Nothing more to write: :meth:`prepare` wrote the answer whole."""

    def __repr__(self) -> str:
        return f"<FixedResponse {self.status} keep_alive={self._keep}>"


def header_lines(headers: dict[str, str]) -> bytes:
    """``headers`` as :class:`FixedResponse` takes them: ``Name: value`` lines, each ending in ``CRLF``.

    Raises:
        ValueError: a name or value holds a line break.
    """
    if any("\r" in k or "\n" in k or "\r" in v or "\n" in v for k, v in headers.items()):
        raise ValueError("a header name or value holds a line break")
    return b"".join(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())


def _descriptor_cap() -> int | None:
    """The most client connections the file-descriptor limit leaves room for (``None``: no limit)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    return max(soft - _FD_RESERVE, soft // 2)


class ConnectionGuard:
    """The open connections of one server, oldest first, and the counts of those closed for cause."""

    def __init__(self, http: HttpSettings) -> None:
        """Create the guard for a server configured by ``http``."""
        self.http = http
        fd_cap = _descriptor_cap()
        self.max_connections = http.max_connections if fd_cap is None else min(http.max_connections, fd_cap)
        """The cap in force: ``max_connections``, or less when the file-descriptor limit is lower."""
        if self.max_connections < http.max_connections:
            logger.info(
                "HTTP: at most %d open connections (the file-descriptor limit allows no more; raise it with "
                "ulimit -n for up to SWITCHBOARD_HTTP__MAX_CONNECTIONS=%d)",
                self.max_connections,
                http.max_connections,
            )
        self._open: dict[_GuardedHandler, None] = {}
        self._closed: Counter[str] = Counter()
        self._last_log = float("-inf")
        self._flush_handle: asyncio.TimerHandle | None = None
        self.total: Counter[str] = Counter()
        """Connections closed for cause since start, by reason (``shed``, ``slow_headers``, ``slow_body``)."""

    @property
    def open_connections(self) -> int:
        """How many connections are open now."""
        return len(self._open)

    def opened(self, handler: _GuardedHandler) -> None:
        """Track a new connection; over the cap, close the oldest idle one (or this one)."""
        self._open[handler] = None
        if len(self._open) <= self.max_connections:
            return
        victim = next((h for h in self._open if h is not handler and h.idle), handler)
        self._open.pop(victim, None)
        victim.force_close()
        self.note("shed")

    def closed(self, handler: _GuardedHandler) -> None:
        """Forget a connection that has gone."""
        self._open.pop(handler, None)

    def note(self, reason: str) -> None:
        """Count one connection closed for ``reason``; log the counts now or at the end of the interval."""
        self._closed[reason] += 1
        self.total[reason] += 1
        if self._flush_handle is not None:
            return
        loop = asyncio.get_running_loop()
        delay = self._last_log + LOG_INTERVAL_S - loop.time()
        if delay <= 0:
            self._flush()
        else:
            self._flush_handle = loop.call_later(delay, self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        if not self._closed:
            return
        self._last_log = asyncio.get_running_loop().time()
        counts = self._closed
        self._closed = Counter()
        logger.warning(
            "HTTP: closed %d connection(s) over the cap of %d (oldest idle first), %d that sent headers slower "
            "than %g s, %d that sent a body slower than %g s; %d open",
            counts["shed"],
            self.max_connections,
            counts["slow_headers"],
            self.http.header_timeout_s,
            counts["slow_body"],
            self.http.body_timeout_s,
            len(self._open),
        )

    def close(self) -> None:
        """Stop the pending log flush (the server is going away)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush()


class _GuardedHandler(RequestHandler):
    """aiohttp's connection protocol, with a deadline for each request's head and body."""

    __slots__ = ("_body_length", "_body_timer", "_guard", "_head_since", "_head_timer", "_payload", "_tail")

    def __init__(self, manager: Server, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_since: float | None = None
        """When the head being waited for began (loop time); ``None`` while no head is awaited."""
        self._body_timer: asyncio.TimerHandle | None = None
        self._payload: StreamReader | None = None
        """The body of the latest request whose head has arrived."""
        self._body_length: int | None = None
        """That body's ``Content-Length`` while it is still arriving (``None``: chunked, or complete)."""
        self._tail = b""
        """The last 3 bytes received before the latest read (a head's ``CRLF CRLF`` may span reads)."""

    @property
    def idle(self) -> bool:
        """Waiting for a request (none being handled): the connection to close first when over the cap."""
        waiter = self._waiter
        return waiter is not None and not waiter.done() and not self._messages

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_head()
        self._guard.opened(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._guard.closed(self)
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        heads = self._request_count
        payload = self._payload
        body_done = payload is None or payload.is_eof()
        had = 0 if payload is None or body_done else payload.total_bytes
        tail = self._tail
        self._tail = data[-3:] if len(data) > 2 else (tail + data)[-3:]
        super().data_received(data)
        if self._request_count != heads:  # a request head arrived (its timer, if still armed, finds none awaited)
            self._head_since = None
            message, payload = self._messages[-1] if self._messages else (None, None)
            self._payload = payload if isinstance(payload, StreamReader) else None
            if self._payload is not None and not self._payload.is_eof():
                length = message.headers.get("Content-Length") if isinstance(message, RawRequestMessage) else None
                self._body_length = int(length) if length is not None and length.isdigit() else None
                if self._body_timer is not None:
                    self._body_timer.cancel()
                self._body_timer = self._loop.call_later(self._guard.http.body_timeout_s, self._body_deadline)
            elif payload is EMPTY_PAYLOAD and not (data if len(data) > 3 else tail + data).endswith(b"\r\n\r\n"):
                self._arm_head()  # bytes after the last head (which has no body) in the same read: a further head
        elif not data or self._head_since is not None:
            # Not an empty call: aiohttp resumes its parser with no bytes whenever a handler has read a body, and an
            # idle kept-alive connection is no slow head (its keep-alive timeout closes it).
            return
        elif body_done:
            self._arm_head()  # the first bytes of a further request on this connection
        elif payload is not None and payload.is_eof():  # these bytes completed the body…
            if self._body_length is not None and had + len(data) > self._body_length:
                self._arm_head()  # …and began a further request (a connection idle after a body is no slow head)
            self._body_length = None

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        """Log a failed request as aiohttp does, except that a malformed one is one DEBUG line, no traceback."""
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError) and 400 <= exc.code < 500:
            logger.debug("refused a malformed HTTP request (%s %d)", type(exc).__name__, exc.code)
            return
        if isinstance(exc, ConnectionResetError):  # the body never came: closed for slowness, or the client left
            logger.debug("a connection was lost while its request was being read")
            return
        super().log_exception(*args, **kwargs)

    def _arm_head(self) -> None:
        """A head is awaited from now.

        Its deadline timer is not made and cancelled per request (a measurable part of a webhook's CPU): one armed
        for an earlier head stays, and when it fires it re-arms for the head awaited then.
        """
        self._head_since = self._loop.time()
        if self._head_timer is None:
            self._head_timer = self._loop.call_later(self._guard.http.header_timeout_s, self._head_deadline)

    def _head_deadline(self) -> None:
        self._head_timer = None
        since = self._head_since
        if since is None:  # no head awaited now: the next one arms a timer again
            return
        left = since + self._guard.http.header_timeout_s - self._loop.time()
        if left > 0:  # a later head than the one this timer was armed for: its own deadline is still ahead
            self._head_timer = self._loop.call_later(left, self._head_deadline)
            return
        self._head_since = None
        if not self._force_close:
            logger.debug("closing a connection whose request head did not arrive in time")
            self._guard.note("slow_headers")
            self.force_close()

    def _body_deadline(self) -> None:
        self._body_timer = None
        payload = self._payload
        if payload is not None and not payload.is_eof() and not self._force_close:
            logger.debug("closing a connection whose request body did not arrive in time")
            self._guard.note("slow_body")
            self.force_close()

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None


class _GuardedServer(Server):
    """aiohttp's low-level server, making :class:`_GuardedHandler` protocols."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard

    def __call__(self) -> RequestHandler:
        return _GuardedHandler(self, self.guard, loop=self._loop, **self._kwargs)


class GuardedAppRunner(web.AppRunner):
    """``web.AppRunner`` for ``app`` whose connections obey the timeouts and the cap of ``http``."""

    def __init__(self, app: web.Application, http: HttpSettings, **kwargs: Any) -> None:
        """Create the runner (``kwargs`` as for ``web.AppRunner``: ``access_log``, ``shutdown_timeout`` …)."""
        kwargs.setdefault("keepalive_timeout", http.keepalive_timeout_s)
        # A compressed request body is passed on as sent, never inflated on the event loop: a 500 KB gzip bomb
        # is 500 MB to inflate, and nothing served here takes compressed bodies (platforms post plain JSON).
        kwargs.setdefault("auto_decompress", False)
        super().__init__(app, **kwargs)
        self.guard = ConnectionGuard(http)

    async def _make_server(self) -> Server:
        plain = await super()._make_server()
        return _GuardedServer(
            self._direct(plain.request_handler),
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            guard=self.guard,
            **plain._kwargs,
        )

    def _direct(
        self, dispatch: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
        """``dispatch`` (the app's), with :data:`DIRECT_ROUTES` taken first while the app has no middlewares or hooks.

        The path looked up is the one the dispatcher matches (``rel_url.path_safe``), not the decoded ``path``: a
        target like ``/webhooks%2Ftelegram`` decodes to a direct path, but the dispatcher answers it 404.
        """
        app = self.app
        direct = app.get(DIRECT_ROUTES)
        if not direct or app.middlewares or app.on_response_prepare:  # hooks run only for what the dispatcher routed
            return dispatch

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            if request.method == "POST" and "Expect" not in request.headers:
                handler = direct.get(request.rel_url.path_safe)
                if handler is not None:
                    return await handler(app, request)
            return await dispatch(request)

        return handle

    async def _cleanup_server(self) -> None:
        self.guard.close()
        await super()._cleanup_server()
