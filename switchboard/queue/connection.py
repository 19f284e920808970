"""Redis clients for the session queue: hiredis parser, health checks, socket timeouts; ``unix://`` works.

Every client of the package is built here. A ``redis+sentinel://`` URL (:mod:`switchboard.settings.sentinel`) gives
redis-py's own Sentinel clients: each connection asks the Sentinels for the current primary when it connects, so
after a failover the next connection goes to the promoted replica. A ``redis+cluster://`` URL
(:mod:`switchboard.settings.cluster`), or a ``redis://`` URL whose server answers ``cluster_enabled:1`` to the one
``INFO cluster`` sent when the process first builds a client for it, gives redis-py's own cluster clients
(:data:`AsyncClient`, :data:`SyncClient`): every command goes to the primary of its key's slot. Both kinds keep
``decode_responses`` off, as RQ requires for its own reads of the same keys.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeAlias, cast
from urllib.parse import unquote, urlsplit

import hiredis
import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.asyncio.sentinel as aiosentinel
import redis.cluster
import redis.sentinel
from redis.connection import HiredisRespSerializer
from redis.exceptions import AskError, ClusterDownError, NoScriptError, RedisError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.utils import HIREDIS_AVAILABLE

from switchboard.errors import ConfigError
from switchboard.settings.cluster import ClusterURL, is_cluster_url, parse_cluster_url
from switchboard.settings.sentinel import SentinelURL, is_sentinel_url, parse_sentinel_url

__all__ = [
    "DEFAULT_OPTIONS",
    "AsyncClient",
    "MultiplexedConnection",
    "SyncClient",
    "as_redis",
    "as_sync_redis",
    "async_client",
    "cluster_like",
    "is_cluster",
    "is_cluster_node",
    "node_connection",
    "refresh_slots",
    "send_on",
    "stale_slots",
    "sync_client",
]

logger = logging.getLogger(__name__)

AsyncClient: TypeAlias = aioredis.Redis | aioredis.RedisCluster
"""A client Switchboard talks to: one server (or a Sentinel's primary), or a Redis Cluster through redis-py's own
cluster client (commands routed by key slot, per-node pools, reads from the primaries)."""
SyncClient: TypeAlias = redis.Redis | redis.RedisCluster
"""The synchronous :data:`AsyncClient`."""

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
    node = _with_credentials({**options, "db": parsed.db}, parsed)
    sentinel = {
        "socket_timeout": options.get("socket_connect_timeout", 2.0),
        "socket_connect_timeout": options.get("socket_connect_timeout", 2.0),
    }
    if parsed.sentinel_password is not None:
        sentinel["password"] = parsed.sentinel_password
    return node, sentinel


_NODE_SCHEMES = ("redis://", "rediss://")  # the ones redis-py connects to (it refuses valkey://)
_PROBED: dict[str, bool] = {}
"""URL → whether its server is a cluster node, as found by the first probe of this process."""


def is_cluster_node(url: str, *, connect_timeout_s: float = 2.0) -> bool:
    """Whether the one server a TCP ``redis://`` URL names is a node of a Redis Cluster.

    Asks it ``INFO cluster`` once per process and URL (never for ``unix://``, the embedded default, nor per message).
    A server that cannot be reached now counts as a single server, and is asked again next time.
    """
    if not url.startswith(_NODE_SCHEMES):
        return False
    known = _PROBED.get(url)
    if known is not None:
        return known
    node = urlsplit(url)._replace(path="/0").geturl()  # a cluster node refuses SELECT of any other database
    try:
        with redis.Redis.from_url(
            node, socket_timeout=connect_timeout_s, socket_connect_timeout=connect_timeout_s
        ) as probe:
            info = probe.info("cluster")
    except (redis.RedisError, OSError):
        return False
    _PROBED[url] = enabled = str(info.get("cluster_enabled", 0)) == "1"
    return enabled


def _seeds(url: str) -> ClusterURL:
    """The cluster seed a ``redis+cluster://`` URL names, or the one node a ``redis://`` URL to a cluster names."""
    if is_cluster_url(url):
        return parse_cluster_url(url)
    parts = urlsplit(url)
    db = (parts.path or "/").strip("/") or "0"
    if db != "0":
        raise ConfigError(
            f"the server at {parts.hostname}:{parts.port or 6379} is a Redis Cluster node, and a cluster has only "
            f"database 0: drop /{db} from SWITCHBOARD_REDIS_URL",
            field="redis_url",
        )
    return ClusterURL(
        nodes=((parts.hostname or "localhost", parts.port or 6379),),
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        tls=url.startswith("rediss://"),
    )


def _cluster_options(seeds: ClusterURL, options: dict[str, Any]) -> dict[str, Any]:
    # redis-py's cluster connections take no parser_class: they use its default, hiredis when installed
    return _with_credentials({k: v for k, v in options.items() if k != "parser_class"}, seeds)


def _with_credentials(node: dict[str, Any], parsed: SentinelURL | ClusterURL) -> dict[str, Any]:
    """``node``'s options plus the URL's user, password and TLS (the data nodes', not the Sentinels')."""
    if parsed.username is not None:
        node["username"] = parsed.username
    if parsed.password is not None:
        node["password"] = parsed.password
    if parsed.tls:
        node["ssl"] = True
    return node


def _async_cluster(url: str, options: dict[str, Any]) -> aioredis.RedisCluster:
    seeds = _seeds(url)
    client = aioredis.RedisCluster(
        startup_nodes=[aiocluster.ClusterNode(host, port) for host, port in seeds.nodes],
        **_cluster_options(seeds, options),
    )
    if HIREDIS_AVAILABLE and not seeds.tls:
        # nodes found later are built from these options; the seeds were built already
        client.connection_kwargs["connection_class"] = _TCPConnection
        for seed in client.startup_nodes:
            seed.connection_class = _TCPConnection
    return client


_CLUSTER_OPTIONS = frozenset(inspect.signature(aioredis.RedisCluster.__init__).parameters) - {
    "self",
    "host",
    "port",
    "startup_nodes",
}


def cluster_like(template: aioredis.RedisCluster, **kw: Any) -> aioredis.RedisCluster:
    """A cluster client of its own to ``template``'s cluster, with its options (``kw`` overrides them)."""
    kwargs = template.connection_kwargs
    options = {k: v for k, v in kwargs.items() if k in _CLUSTER_OPTIONS}
    if kwargs.get("connection_class") is aioredis.SSLConnection:
        options["ssl"] = True
    seeds = template.get_nodes() or template.startup_nodes  # the nodes it knows now, else its seeds
    client = aioredis.RedisCluster(
        startup_nodes=[aiocluster.ClusterNode(node.host, node.port) for node in seeds], **{**options, **kw}
    )
    if kwargs.get("connection_class") is _TCPConnection:
        client.connection_kwargs["connection_class"] = _TCPConnection
        for seed in client.startup_nodes:
            seed.connection_class = _TCPConnection
    return client


def is_cluster(client: AsyncClient | SyncClient) -> bool:
    """Whether ``client`` talks to a Redis Cluster (redis-py's cluster client)."""
    return isinstance(client, aioredis.RedisCluster | redis.RedisCluster)


@asynccontextmanager
async def node_connection(node: aiocluster.ClusterNode) -> AsyncIterator[aioredis.Connection]:
    """One connection of a cluster node's own pool, held for the block (``WAIT`` counts that connection's writes).

    The cluster client's pool, so the options, credentials and TLS are its own and ``aclose()`` closes it. A block
    that raises leaves replies unread on it: it is disconnected before going back (it reconnects when next taken).
    """
    conn = node.acquire_connection()
    try:
        await node.disconnect_if_needed(conn)  # one the pool marked for reconnecting (as redis-py's own pipeline does)
        yield conn
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        node.release(conn)


async def send_on(conn: aioredis.Connection, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """Write ``commands`` in one go on ``conn`` and read their replies in order (an error reply as its exception).

    Raises:
        RedisError: the connection failed (some commands may have run).
    """
    await conn.send_packed_command(conn.pack_commands(commands))
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(await conn.read_response())
        except ResponseError as err:
            replies.append(err)
    return replies


def stale_slots(error: BaseException) -> bool:
    """Whether ``error``, from a node chosen by the cluster client's slot map, says that map may be out of date.

    ``MOVED``/``ASK`` (the slot moves or moved), ``TRYAGAIN`` (mid-move), ``CLUSTERDOWN``, or the node unreachable.
    """
    return isinstance(error, AskError | TryAgainError | ClusterDownError | RedisConnectionError | RedisTimeoutError)


async def refresh_slots(cluster: aioredis.RedisCluster, key: str) -> None:
    """Have the cluster client route one read of ``key`` itself, which updates its slot map on the way.

    It follows a redirect or a dead node, so the next call sent to
    :meth:`~redis.asyncio.RedisCluster.get_node_from_key` goes to the slot's new owner. Best effort: a failure here
    leaves the next call to try again.
    """
    try:
        await cluster.exists(key)
    except (RedisError, OSError) as err:
        logger.info("the cluster's slot map was not refreshed: %s", type(err).__name__)


def as_redis(client: AsyncClient) -> aioredis.Redis:
    """``client`` typed as the single-server client most of the queue's helpers are still annotated with.

    A stop-gap of the Redis Cluster work (issue #26): those annotations move to :data:`AsyncClient` in a sweep of
    their own, and not every helper works on a cluster yet (``docs/pending/cluster-plan.md`` §7). Until then each
    entry point passes its client through here, so the sweep finds them all.
    """
    return cast(aioredis.Redis, client)


def as_sync_redis(client: SyncClient) -> redis.Redis:
    """The synchronous :func:`as_redis`."""
    return cast(redis.Redis, client)


def async_client(url: str, **kw: Any) -> AsyncClient:
    """An asyncio client (connection pool) for ``url``: redis-py's cluster client for a Redis Cluster.

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
    if is_cluster_url(url) or is_cluster_node(url, connect_timeout_s=kw.get("socket_connect_timeout", 2.0)):
        return _async_cluster(url, _options(url, kw))
    client = aioredis.Redis.from_url(url, **_options(url, kw))
    pool = client.connection_pool
    if HIREDIS_AVAILABLE and pool.connection_class is aioredis.Connection:
        pool.connection_class = _TCPConnection
    elif HIREDIS_AVAILABLE and pool.connection_class is aioredis.UnixDomainSocketConnection:
        pool.connection_class = _UnixConnection
    return client


def sync_client(url: str, **kw: Any) -> SyncClient:
    """A synchronous client for ``url`` (RQ's registries and maintenance use it, from a thread).

    For a Redis Cluster, redis-py's cluster client (its connections do not run health checks: redis-py drops the
    option there).
    """
    if HIREDIS_AVAILABLE and "parser_class" not in kw:
        from redis._parsers import _HiredisParser

        kw["parser_class"] = _HiredisParser
    if is_sentinel_url(url):
        parsed = parse_sentinel_url(url)
        node, sentinel = _sentinel_options(parsed, _options(url, kw))
        manager = redis.sentinel.Sentinel(parsed.sentinels, sentinel_kwargs=sentinel, **node)
        primary: redis.Redis = manager.master_for(parsed.service)
        return primary
    if is_cluster_url(url) or is_cluster_node(url, connect_timeout_s=kw.get("socket_connect_timeout", 2.0)):
        seeds = _seeds(url)
        return redis.RedisCluster(
            startup_nodes=[redis.cluster.ClusterNode(host, port) for host, port in seeds.nodes],  # type: ignore[no-untyped-call]
            **_cluster_options(seeds, _options(url, kw)),
        )
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
    def supports(client: AsyncClient) -> bool:
        """Whether ``client``'s connections can be multiplexed (RESP2 over TCP or a unix socket, hiredis present).

        Never a cluster's: its commands go to the node of their key's slot, each over its node's pool.
        """
        if isinstance(client, aioredis.RedisCluster):
            return False
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
