"""Redis clients for the session queue: hiredis parser, health checks, socket timeouts; ``unix://`` works.

Both clients keep ``decode_responses`` off, as RQ requires for its own reads of the same keys.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE

__all__ = ["DEFAULT_OPTIONS", "async_client", "sync_client"]

DEFAULT_OPTIONS: dict[str, Any] = {
    "socket_timeout": 5.0,
    "socket_connect_timeout": 2.0,
    "health_check_interval": 30,
}
"""Options every client gets unless the caller overrides them."""


def _options(url: str, kw: dict[str, Any]) -> dict[str, Any]:
    options = {**DEFAULT_OPTIONS, **kw}
    if url.startswith("unix://"):
        # keepalive options are TCP-only; the unix-socket connection class rejects them
        options.pop("socket_keepalive", None)
        options.pop("socket_keepalive_options", None)
    elif "socket_keepalive" not in kw:
        options["socket_keepalive"] = True
    return options


class _HiredisPacking:
    """Packs commands with hiredis' C packer, as redis-py's sync client already does.

    redis-py's asyncio connection packs in Python (several µs per argument); the ingest script has ~30.
    """

    _serializer = HiredisRespSerializer() if HIREDIS_AVAILABLE else None

    def pack_command(self, *args: Any) -> list[bytes]:
        assert self._serializer is not None
        packed: list[bytes] = self._serializer.pack(*args)
        return packed


class _TCPConnection(_HiredisPacking, aioredis.Connection):
    pass


class _UnixConnection(_HiredisPacking, aioredis.UnixDomainSocketConnection):
    pass


def async_client(url: str, **kw: Any) -> aioredis.Redis:
    """An asyncio client (connection pool) for ``url``.

    The C parser (``hiredis``) is used when installed, which it is as a dependency
    (``redis[hiredis]``): it is most of the client's CPU cost per round trip.
    Keyword arguments override :data:`DEFAULT_OPTIONS` (for example ``socket_timeout=None`` for a
    client that blocks in ``BLMOVE``).
    """
    if HIREDIS_AVAILABLE and "parser_class" not in kw:
        from redis._parsers import _AsyncHiredisParser

        kw["parser_class"] = _AsyncHiredisParser
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
    return redis.Redis.from_url(url, **_options(url, kw))
