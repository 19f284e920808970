"""Redis clients for the session queue: hiredis parser, health checks, socket timeouts; ``unix://`` works.

Every client of the package is built here. A ``redis+sentinel://`` URL (:mod:`switchboard.settings.sentinel`) gives
redis-py's own Sentinel clients: each connection asks the Sentinels for the current primary when it connects, so
after a failover the next connection goes to the promoted replica. Both clients keep ``decode_responses`` off, as RQ
requires for its own reads of the same keys.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import hiredis
import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.utils import HIREDIS_AVAILABLE

from switchboard.settings.sentinel import SentinelURL, is_sentinel_url, parse_sentinel_url

__all__ = ["DEFAULT_OPTIONS", "MultiplexedConnection", "async_client", "sync_client"]

DEFAULT_OPTIONS: dict[str, Any] = {
    "socket_timeout": 5.0,
    "socket_connect_timeout": 2.0,
    "health_check_interval": 30,
}
"""Options every client gets unless the caller overrides them."""


def _options(url: str, kw: dict[str, Any]) -> dict[str, Any]:
    options = {**DEFAULT_OPTIONS, **kw}
    if is_sentinel_url(url):
        options["socket_keepalive"] = kw.get("socket_keepalive", True)
    elif url.startswith("unix://"):
        # keepalive options are TCP-only; the unix-socket connection class rejects them
        options.pop("socket_keepalive", None)
        options.pop("socket_keepalive_options", None)
    elif "socket_keepalive" not in kw:
        options["socket_keepalive"] = True
    return options


class _HiredisPacking:
    """Packs commands with hiredis' C packer, as redis-py's sync client already does.

    redis-py's asyncio connection packs in Python, argument by argument, and the ingest script has many arguments.
    """

    _serializer = HiredisRespSerializer() if HIREDIS_AVAILABLE else None  # type: ignore[no-untyped-call, unused-ignore]

    def pack_command(self, *args: Any) -> list[bytes]:
        assert self._serializer is not None
        packed: list[bytes] = self._serializer.pack(*args)
        return packed


class _TCPConnection(_HiredisPacking, aioredis.Connection):
    pass


class _UnixConnection(_HiredisPacking, aioredis.UnixDomainSocketConnection):
    pass


class _SentinelConnection(_HiredisPacking, aiosentinel.SentinelManagedConnection):
    pass


_MULTIPLEXABLE = (_TCPConnection, _UnixConnection, _SentinelConnection)


def _sentinel_options(parsed: SentinelURL, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The data nodes' connection options and the Sentinels' own (short timeouts, their own password)."""
    node = {**options, "db": parsed.db}
    if parsed.username is not None:
        node["username"] = parsed.username
    if parsed.password is not None:
        node["password"] = parsed.password
    if parsed.tls:
        node["ssl"] = True
    sentinel = {
        "socket_timeout": options.get("socket_connect_timeout", 2.0),
        "socket_connect_timeout": options.get("socket_connect_timeout", 2.0),
    }
    if parsed.sentinel_password is not None:
        sentinel["password"] = parsed.sentinel_password
    return node, sentinel


def async_client(url: str, **kw: Any) -> aioredis.Redis:
    """An asyncio client (connection pool) for ``url``.

    The C parser (``hiredis``) is used when installed, which it is as a dependency
    (``redis[hiredis]``): it is most of the client's CPU cost per round trip.
    Keyword arguments override :data:`DEFAULT_OPTIONS` (for example ``socket_timeout=None`` for a
    client that blocks).
    """
    if HIREDIS_AVAILABLE and "parser_class" not in kw:
        from redis._parsers import _AsyncHiredisParser

        kw["parser_class"] = _AsyncHiredisParser
    # redis-py 8 caps a pool at 100 connections unless told otherwise, and raises (rather than waits) past the cap;
    # a worker running its full concurrency cap of turns (each with a lease heartbeat, typing and sends in flight)
    # needs more. The callers bound their own concurrency, so the pool does not cap it a second time.
    kw.setdefault("max_connections", 2**31 - 1)
    if is_sentinel_url(url):
        parsed = parse_sentinel_url(url)
        node, sentinel = _sentinel_options(parsed, _options(url, kw))
        manager = aiosentinel.Sentinel(parsed.sentinels, sentinel_kwargs=sentinel, **node)
        master: aioredis.Redis = manager.master_for(parsed.service)
        if HIREDIS_AVAILABLE and not parsed.tls:
            master.connection_pool.connection_class = _SentinelConnection
        return master
    client = aioredis.Redis.from_url(url, **_options(url, kw))
    pool = client.connection_pool
    if HIREDIS_AVAILABLE and pool.connection_class is aioredis.Connection:
        pool.connection_class = _TCPConnection
    elif HIREDIS_AVAILABLE and pool.connection_class is aioredis.UnixDomainSocketConnection:
        pool.connection_class = _UnixConnection
    return client


def sync_client(url: str, **kw: Any) -> redis.Redis:
    """A synchronous client for ``url`` (RQ's registries and maintenance use it, from a thread)."""
    if HIREDIS_AVAILABLE and "parser_class" not in kw:
        from redis._parsers import _HiredisParser

        kw["parser_class"] = _HiredisParser
    if is_sentinel_url(url):
        parsed = parse_sentinel_url(url)
        node, sentinel = _sentinel_options(parsed, _options(url, kw))
        manager = redis.sentinel.Sentinel(parsed.sentinels, sentinel_kwargs=sentinel, **node)
        primary: redis.Redis = manager.master_for(parsed.service)
        return primary
    return redis.Redis.from_url(url, **_options(url, kw))


class _Replies(asyncio.Protocol):
    """Reads the replies of a multiplexed connection and hands each to the oldest waiting caller."""

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.streams = transport.get_protocol()
        """redis-py's stream protocol this one replaces: told of the close, so its ``wait_closed`` returns."""
        self.reader = hiredis.Reader(replyError=ResponseError)
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.lost = False

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        waiting = self.waiting
        while (reply := self.reader.gets()) is not False:
            if not waiting:  # a reply nobody asked for: the stream is out of step, so stop trusting it
                self.transport.close()
                return
            future = waiting.popleft()
            if future.done():  # its caller gave up (deadline passed); the command still ran
                continue
            if isinstance(reply, ResponseError):
                future.set_exception(NoScriptError(str(reply)) if str(reply).startswith("NOSCRIPT") else reply)
                if str(reply).startswith("READONLY"):  # the server was demoted (a failover): connect anew
                    self.transport.close()
            else:
                future.set_result(reply)

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.streams.connection_lost(exc)
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(RedisConnectionError(f"connection to Redis lost: {type(exc).__name__}"))


class MultiplexedConnection:
    """One Redis connection shared by concurrent callers: commands are written as they come, replies matched in order.

    redis-py takes a pooled connection per round trip and parses each reply through several coroutine layers; on a
    hot path that is most of the gateway's CPU per request. Here a connection is taken from ``client``'s pool once
    (so redis-py does the connect, AUTH, SELECT and TLS), its transport is handed to a small protocol feeding
    hiredis' reader, and a caller costs one packed command and one future. The connection stays in the pool's
    in-use set, so ``client.aclose()`` closes it; when it is lost, the waiting callers fail at once and the next
    :meth:`send` takes a fresh one.
    """

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self._conn: aioredis.Connection | None = None
        self._replies: _Replies | None = None
        self._connecting: asyncio.Lock | None = None

    @staticmethod
    def supports(client: aioredis.Redis) -> bool:
        """Whether ``client``'s connections can be multiplexed (RESP2 over TCP or a unix socket, hiredis present)."""
        pool = client.connection_pool
        return (
            HIREDIS_AVAILABLE
            and pool.connection_class in _MULTIPLEXABLE
            and str(pool.connection_kwargs.get("protocol") or 2) == "2"
        )

    @property
    def ready(self) -> bool:
        """Whether :meth:`write` can be called now (connected and not lost)."""
        return self._replies is not None and not self._replies.lost

    def write(self, commands: list[bytes], futures: list[asyncio.Future[Any]]) -> None:
        """Write packed commands (``hiredis.pack_command``); each future gets its command's reply (needs ``ready``)."""
        replies = self._replies
        assert replies is not None and not replies.lost
        replies.waiting.extend(futures)
        transport: Any = replies.transport  # uvloop's transports do not subclass asyncio.WriteTransport
        transport.write(b"".join(commands))

    async def connect(self) -> None:
        """Take a connection from the pool (if not :attr:`ready`) and start reading its replies.

        Raises:
            NotImplementedError: the installed redis-py's connections cannot be taken over (use the pool instead).
        """
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self.ready:
                return
            await self._release()
            pool = self.client.connection_pool
            conn = await pool.get_connection()  # type: ignore[no-untyped-call, unused-ignore]
            writer = getattr(conn, "_writer", None)
            if writer is None:  # a redis-py whose connections keep their streams elsewhere
                await pool.release(conn)
                raise NotImplementedError("this redis-py's connections cannot be multiplexed")
            transport = writer.transport
            replies = _Replies(transport)
            transport.set_protocol(replies)
            self._conn, self._replies = conn, replies

    def abandon(self) -> None:
        """Close the current connection (its replies are overdue); the next :meth:`connect` takes another."""
        if self._replies is not None and not self._replies.lost:
            self._replies.transport.close()

    async def _release(self) -> None:
        conn, self._conn, self._replies = self._conn, None, None
        if conn is not None:
            await conn.disconnect()
            await self.client.connection_pool.release(conn)
