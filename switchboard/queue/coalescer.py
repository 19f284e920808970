"""③ The ingest scripts of concurrent requests, sent to Redis in one pipeline per event-loop iteration.

Used by :class:`switchboard.queue.ingest.Ingestor`; see docs/ARCHITECTURE.md (ingest) for the script itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode
from redis.exceptions import NoScriptError, RedisError

from switchboard.queue import scripts
from switchboard.queue.connection import (
    MultiplexedConnection,
    is_cluster,
    node_connection,
    refresh_slots,
    send_on,
    stale_slots,
)
from switchboard.queue.scripts import ScriptArg

__all__ = ["Coalescer", "ReplicasUnconfirmedError"]

logger = logging.getLogger(__name__)

_pack: Callable[[tuple[ScriptArg, ...]], bytes] = hiredis.pack_command  # type: ignore[assignment]


class ReplicasUnconfirmedError(RedisError):
    """Fewer replicas than asked for confirmed an ingest batch within the ack timeout (``WAIT``)."""


class _Item(NamedTuple):
    """One submitted script call, waiting in the pipeline for its reply."""

    keys: list[str]
    args: list[ScriptArg]
    reply: asyncio.Future[Any]


class Coalescer:
    """Sends the ingest scripts of concurrent requests in one pipeline per event-loop iteration.

    Each script stays its own atomic step; only the round trip is shared. Under load this divides the client
    library's per-round-trip cost (most of the gateway's CPU per request) by the batch size, and costs an idle
    gateway at most one loop iteration of latency. The deadline is kept per batch (one timer, not one
    ``asyncio.timeout`` per request): when Redis has not confirmed a batch within ``timeout_s`` its callers get
    :class:`TimeoutError` while the round trip runs on (the scripts may still land: a platform's retry is deduplicated).

    With ``ack_replicas`` each batch is followed, on the same connection, by ``WAIT ack_replicas ack_timeout_ms``
    (``WAIT`` counts the replicas that have this connection's last write): its callers get their replies only once
    enough replicas have them, else :class:`ReplicasUnconfirmedError`. One command per batch, none when off. On a
    Redis Cluster the batch is split by the node owning each call's slot, and each node gets its calls and its own
    ``WAIT`` over one of its connections (:meth:`_on_node`): one ``WAIT`` per node per batch.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        timeout_s: float,
        *,
        ack_replicas: int = 0,
        ack_timeout_ms: int = 0,
        script: scripts.Script = scripts.INGEST,
    ) -> None:
        """Batch ``script``'s calls (the ingest script; the sender meter's takes use one of their own)."""
        self.redis = redis
        self.script = script
        self.ack_replicas = ack_replicas
        self.ack_timeout_ms = ack_timeout_ms
        self.timeout_s = timeout_s + (ack_timeout_ms / 1000 if ack_replicas else 0.0)
        self._wait: bytes = _pack(("WAIT", ack_replicas, ack_timeout_ms))
        self._mux = MultiplexedConnection(redis) if MultiplexedConnection.supports(redis) else None
        self._pending: list[_Item] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, keys: list[str], args: list[ScriptArg]) -> asyncio.Future[Any]:
        """Queue one ingest script call for this loop iteration's pipeline; the future gets its reply."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush, loop)
        self._pending.append(_Item(keys, args, future))
        return future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._pending = self._pending, []
        timer = loop.call_later(self.timeout_s, self._expire, batch)
        if self._mux is not None and self._mux.ready:
            self._write(self._mux, batch, timer)
            return
        task = loop.create_task(self._send(batch, timer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _write(self, mux: MultiplexedConnection, batch: list[_Item], timer: asyncio.TimerHandle) -> None:
        sha = self.script.sha
        futures = [item.reply for item in batch]
        try:
            commands = [_pack(("EVALSHA", sha, len(item.keys), *item.keys, *item.args)) for item in batch]
        except (TypeError, ValueError) as err:  # a bug, not an outage: fail the batch now rather than at its deadline
            timer.cancel()
            for future in futures:
                if not future.done():
                    future.set_exception(RedisError(f"could not encode the ingest script call: {err}"))
            return
        if self.ack_replicas:
            loop = futures[0].get_loop()
            replies = [loop.create_future() for _ in futures]
            waited: asyncio.Future[Any] = loop.create_future()
            mux.write([*commands, self._wait], [*replies, waited])
            waited.add_done_callback(functools.partial(self._confirmed, futures, replies))
        else:
            mux.write(commands, futures)
        futures[-1].add_done_callback(functools.partial(_batch_done, futures, timer))

    def _confirmed(
        self, futures: list[asyncio.Future[Any]], replies: list[asyncio.Future[Any]], waited: asyncio.Future[Any]
    ) -> None:
        """The batch's ``WAIT`` answered: hand each caller its script's reply if enough replicas have it."""
        error: BaseException | None = None
        if waited.cancelled():
            error = RedisError("the replicas' confirmation was cancelled")
        elif (error := waited.exception()) is None and int(waited.result()) < self.ack_replicas:
            error = ReplicasUnconfirmedError(
                f"{waited.result()} of {self.ack_replicas} replicas confirmed within {self.ack_timeout_ms} ms"
            )
        for future, reply in zip(futures, replies, strict=True):
            if future.done():
                continue
            if reply.cancelled():
                future.set_exception(RedisError("the ingest script call was cancelled"))
            elif (failed := reply.exception()) is not None:
                future.set_exception(failed)
            elif error is not None:
                future.set_exception(error)
            else:
                future.set_result(reply.result())

    async def _send(self, batch: list[_Item], timer: asyncio.TimerHandle) -> None:
        live = [item for item in batch if not item.reply.done()]
        if not live:
            timer.cancel()
            return
        if self._mux is None:
            try:
                await self._round_trip(live)
            finally:
                timer.cancel()
            return
        try:
            await self._mux.connect()
        except NotImplementedError:
            logger.warning("ingest falls back to redis-py pipelines: this redis-py cannot be multiplexed")
            self._mux = None
            try:
                await self._round_trip(live)
            finally:
                timer.cancel()
            return
        except Exception as err:
            timer.cancel()
            for item in live:
                if not item.reply.done():
                    item.reply.set_exception(err)
            return
        self._write(self._mux, live, timer)

    def _expire(self, batch: list[_Item]) -> None:
        """The batch's deadline passed: every caller still waiting gets :class:`TimeoutError`."""
        overdue = False
        for item in batch:
            if not item.reply.done():
                overdue = True
                item.reply.set_exception(TimeoutError("Redis did not confirm the ingest batch in time"))
        if overdue and self._mux is not None:
            self._mux.abandon()  # a connection that stopped answering is not trusted with the next batch

    async def _round_trip(self, live: list[_Item]) -> None:
        if self.ack_replicas and is_cluster(self.redis):
            await self._per_node(cast(aioredis.RedisCluster, self.redis), live)
            return
        try:
            if len(live) == 1 and not self.ack_replicas:
                results: list[Any] = [await self.script(self.redis, live[0].keys, live[0].args)]
            else:
                async with self.redis.pipeline(transaction=False) as pipe:
                    if self.ack_replicas:  # loaded first: WAIT must follow the writes on the same connection
                        pipe.script_load(self.script.source)
                    for item in live:
                        pipe.evalsha(self.script.sha, len(item.keys), *item.keys, *item.args)
                    if self.ack_replicas:
                        pipe.execute_command("WAIT", self.ack_replicas, self.ack_timeout_ms)
                    results = await pipe.execute(raise_on_error=False)
                if self.ack_replicas:
                    acked = results.pop()
                    results.pop(0)
                    if isinstance(acked, Exception):
                        raise acked
                    if int(acked) < self.ack_replicas:
                        raise ReplicasUnconfirmedError(
                            f"{acked} of {self.ack_replicas} replicas confirmed within {self.ack_timeout_ms} ms"
                        )
                for i, result in enumerate(results):
                    if isinstance(result, NoScriptError):  # script cache flushed: load it and run this one alone
                        results[i] = await self.script(self.redis, live[i].keys, live[i].args)
        except BaseException as err:
            for item in live:
                if not item.reply.done():
                    item.reply.set_exception(err if isinstance(err, Exception) else RedisError("ingest interrupted"))
            if not isinstance(err, Exception):
                raise
            return
        for item, result in zip(live, results, strict=True):
            if item.reply.done():
                continue
            if isinstance(result, Exception):
                item.reply.set_exception(result)
            else:
                item.reply.set_result(result)

    async def _per_node(self, cluster: aioredis.RedisCluster, live: list[_Item]) -> None:
        """Send each node its share of the batch, all nodes at once (a cluster with ``ack_replicas``)."""
        shares: dict[str, tuple[ClusterNode, list[_Item]]] = {}
        for item in live:
            try:
                node = cluster.get_node_from_key(item.keys[0])
            except RedisError as err:  # a slot no node serves (yet): the cluster is mid-failover or not set up
                item.reply.set_exception(err)
                continue
            assert node is not None
            shares.setdefault(node.name, (node, []))[1].append(item)
        await asyncio.gather(*(self._on_node(cluster, node, items) for node, items in shares.values()))

    async def _on_node(self, cluster: aioredis.RedisCluster, node: ClusterNode, items: list[_Item]) -> None:
        """The calls then ``WAIT``, in one write over one connection to the node owning their slots.

        A call refused ``NOSCRIPT`` (the node lost its script cache, or was promoted) fails its caller with
        :class:`NoScriptError`, as on one server: the ingest loads the script and submits the call again, so it
        comes back in a later batch followed by its own ``WAIT``. A call the node refuses as not its slot's
        (``MOVED``, ``ASK``, ``TRYAGAIN``: the slot is moving) did not run and fails its caller, who is answered 503
        and posted again; the cluster client's slot map is refreshed first (as after a node that cannot be reached),
        so the retry goes to the slot's new owner. The batch's deadline still bounds the wait of its callers.
        """
        commands = [
            *(("EVALSHA", self.script.sha, len(item.keys), *item.keys, *item.args) for item in items),
            ("WAIT", self.ack_replicas, self.ack_timeout_ms),
        ]
        try:
            async with node_connection(node) as conn:
                replies = await send_on(conn, commands)
        except Exception as err:
            if stale_slots(err):  # before the callers are answered, so their retries find the new map
                await refresh_slots(cluster, items[0].keys[0])
            for item in items:
                if not item.reply.done():
                    item.reply.set_exception(err)
            return
        except BaseException:
            for item in items:
                if not item.reply.done():
                    item.reply.set_exception(RedisError("ingest interrupted"))
            raise
        acked, results = replies[-1], replies[:-1]
        moved = next((i.keys[0] for i, r in zip(items, results, strict=True) if stale_slots(r)), None)
        if moved is not None:
            await refresh_slots(cluster, moved)
        error: Exception | None = acked if isinstance(acked, Exception) else None
        if error is None and int(acked) < self.ack_replicas:
            error = ReplicasUnconfirmedError(
                f"{acked} of {self.ack_replicas} replicas of {node.name} confirmed within {self.ack_timeout_ms} ms"
            )
        for item, result in zip(items, results, strict=True):
            if item.reply.done():
                continue
            if isinstance(result, Exception):
                item.reply.set_exception(result)
            elif error is not None:
                item.reply.set_exception(error)
            else:
                item.reply.set_result(result)


def _batch_done(futures: list[asyncio.Future[Any]], timer: asyncio.TimerHandle, _last: asyncio.Future[Any]) -> None:
    """The last reply of a batch is in: its deadline is no longer needed (unless a caller left early)."""
    for future in futures:
        if not future.done():
            return
    timer.cancel()
