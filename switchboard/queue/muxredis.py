"""A redis-py asyncio client whose commands all share one pipelined connection (:class:`MultiplexedConnection`).

For many short commands from many concurrent callers, such as thousands of web chat streams opening at once:
redis-py's pool takes a connection per command and wakes every waiter on each release. Here every command is written
at once and its reply matched in order, through redis-py's usual response callbacks. Not for pipelines or blocking
commands; without hiredis or under RESP3 commands go through the client's own pool. On a Redis Cluster,
:func:`multiplexed_like` gives redis-py's cluster client instead (a pool per node, no multiplexing).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Final

import hiredis
import redis.asyncio as aioredis
from redis.client import EMPTY_RESPONSE, NEVER_DECODE
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from switchboard.queue.connection import AsyncClient, MultiplexedConnection, cluster_like

__all__ = ["COMMAND_TIMEOUT_S", "MultiplexedRedis", "multiplexed_like"]

COMMAND_TIMEOUT_S: Final = 5.0
"""A command whose reply has not come within this is failed, and its connection replaced."""


class MultiplexedRedis(aioredis.Redis):
    """``redis.asyncio.Redis`` sending every command over one multiplexed connection taken from its own pool."""

    def __init__(self, *args: Any, command_timeout_s: float = COMMAND_TIMEOUT_S, **kwargs: Any) -> None:
        """Create it as a ``redis.asyncio.Redis`` (give it its own ``connection_pool``)."""
        super().__init__(*args, **kwargs)
        self.command_timeout_s = command_timeout_s
        self._mux: MultiplexedConnection | None = (
            MultiplexedConnection(self) if MultiplexedConnection.supports(self) else None
        )

    @classmethod
    def like(cls, template: aioredis.Redis, *, max_connections: int = 2, **kwargs: Any) -> MultiplexedRedis:
        """A client to ``template``'s server with its options and a pool of its own (``template`` is not touched)."""
        pool = template.connection_pool
        return cls(
            connection_pool=aioredis.BlockingConnectionPool(
                connection_class=pool.connection_class,
                max_connections=max_connections,
                timeout=COMMAND_TIMEOUT_S,
                **pool.connection_kwargs,
            ),
            **kwargs,
        )

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        """Send one command over the shared connection and parse its reply as redis-py would."""
        mux = self._mux
        if mux is None:
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call, unused-ignore]
        if not mux.ready:
            try:
                await mux.connect()
            except NotImplementedError:
                self._mux = None
                return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call, unused-ignore]
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        name = args[0]
        # redis-py names some commands in two words ("SCRIPT LOAD", "CLIENT UNBLOCK"): two arguments on the wire
        words = tuple(name.split()) if isinstance(name, str) and " " in name else (name,)
        mux.write([hiredis.pack_command((*words, *args[1:]))], [future])
        try:
            async with asyncio.timeout(self.command_timeout_s):
                response = await future
        except TimeoutError:
            mux.abandon()  # a connection that stopped answering is not trusted with the next command
            raise RedisTimeoutError(f"no reply to {args[0]!r} within {self.command_timeout_s} s") from None
        except ResponseError:
            if EMPTY_RESPONSE in options:
                return options[EMPTY_RESPONSE]
            raise
        options.pop(EMPTY_RESPONSE, None)
        options.pop(NEVER_DECODE, None)
        options.pop("keys", None)
        callback = self.response_callbacks.get(name)
        if callback is None:
            return response
        value = callback(response, **options)
        return await value if inspect.isawaitable(value) else value


def multiplexed_like(template: AsyncClient, *, max_connections: int = 2) -> AsyncClient:
    """A client of its own to ``template``'s server for many short commands from many callers.

    One multiplexed connection (:class:`MultiplexedRedis`, ``max_connections`` in its pool); on a Redis Cluster,
    redis-py's cluster client with ``template``'s options: a command to a node takes a connection of that node's
    pool, so concurrent callers hold as many connections as they have commands in flight per node, and each command
    goes through redis-py's own per-command path (the CPU the multiplexed connection saves).
    """
    if isinstance(template, aioredis.RedisCluster):
        return cluster_like(template)
    return MultiplexedRedis.like(template, max_connections=max_connections)
