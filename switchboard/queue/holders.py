"""The listener host: each account's long-running connection, in exactly one process across all of them.

Telegram long polling, Discord's gateway and Slack Socket Mode each allow one consumer per bot, so the hosts compete
for a fenced lease per ``(channel, account)`` and a listener never runs past its lease. On Python 3.11 redis-py can
swallow a cancellation (``asyncio.wait_for``, CPython gh-86296), so the host checks ``cancelling()`` after each Redis
call and each emit. ``docs/ARCHITECTURE.md`` §2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard.channels.base import Channel, Emit, Inbound, Listener
from switchboard.queue import scripts
from switchboard.queue.keys import GlobalKeys

__all__ = ["DEFAULT_LEASE_MS", "Holding", "ListenerHost"]

logger = logging.getLogger(__name__)

DEFAULT_LEASE_MS = 15_000
"""How long a listener lease lasts without a renewal: about how long a dead holder's bot goes unheard."""


@dataclass(frozen=True, slots=True)
class Holding:
    """A listener lease this host holds."""

    channel: str
    account: str
    epoch: int
    token: str
    """The lease value, ``<epoch>:<holder>``."""


def _holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _stop_if_cancelled() -> None:
    """Raise ``CancelledError`` when this task was cancelled but a library call returned as if it had not been.

    The request stays counted (``Task.cancelling()``) even when the ``CancelledError`` it caused was swallowed
    (redis-py under ``asyncio.wait_for`` on Python 3.11): nothing the host runs takes back a cancellation.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _stopping_emit(emit: Emit) -> Emit:
    """``emit`` that stops its listener when the listener was cancelled during it (its Redis calls may swallow that).

    What the emit carried is handed over again by the platform (nothing was confirmed to it), and deduplicated.
    """

    async def emit_then_check(inbound: Inbound) -> None:
        try:
            await emit(inbound)
        except Exception:
            _stop_if_cancelled()  # the error a listener would retry after is not what stopped it
            raise
        _stop_if_cancelled()

    return emit_then_check


class ListenerHost:
    """Runs every adapter's listener while this process holds the account's lease.

    Args:
        redis: The shared Redis (async client).
        adapters: The process's channel adapters; those whose ``listener()`` is ``None`` are left alone.
        emit_for: The ingest router's ``Emit`` for an adapter.
        lease_ms: Lease TTL in milliseconds (renewed every third of it).
        holder_id: Names this host in the lease value (default: host, pid and a random suffix).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        adapters: Iterable[Channel],
        emit_for: Callable[[Channel], Emit],
        *,
        lease_ms: int = DEFAULT_LEASE_MS,
        holder_id: str | None = None,
    ) -> None:
        self.redis = redis
        self.adapters = list(adapters)
        self.emit_for = emit_for
        self.lease_ms = lease_ms
        self.holder_id = holder_id or _holder_id()
        self.held: dict[tuple[str, str], Holding] = {}
        """The leases held right now, by ``(channel, account)``."""
        self.acquired = 0
        """How many times this host took a lease (a takeover counts too)."""
        self._keys = GlobalKeys()

    async def run(self) -> None:
        """Compete for every listener's lease and run the listeners while held, until cancelled."""
        listeners = [(adapter, found) for adapter in self.adapters if (found := adapter.listener()) is not None]
        if not listeners:
            return
        async with asyncio.TaskGroup() as group:
            for adapter, listener in listeners:
                group.create_task(self._hold(adapter, listener), name=f"listener:{adapter.name}/{adapter.account}")

    async def _hold(self, adapter: Channel, listener: Listener) -> None:
        """Take the lease whenever it is free, run the listener while it holds, and start over."""
        interval = self.lease_ms / 3000
        while True:
            started = time.monotonic()
            holding = await self._acquire(adapter)
            if holding is None:
                _stop_if_cancelled()
                await asyncio.sleep(interval * random.uniform(0.5, 1.0))
                continue
            failed = False
            try:
                _stop_if_cancelled()  # cancelled while taking the lease: release it (below) rather than listen
                failed = await self._run_held(adapter, listener, holding, started)
            finally:
                self.held.pop((holding.channel, holding.account), None)
                await self._release(holding)
            if failed:
                await asyncio.sleep(interval)  # a failing listener gives another process the chance to take over

    async def _acquire(self, adapter: Channel) -> Holding | None:
        lease, epoch_key = self._lease_keys(adapter)
        try:
            epoch = int(await scripts.LEASE_ACQUIRE(self.redis, [lease, epoch_key], [self.holder_id, self.lease_ms]))
        except RedisError as err:
            logger.warning("listener lease for %s/%s: %s", adapter.name, adapter.account, type(err).__name__)
            return None
        if epoch == 0:
            return None
        holding = Holding(adapter.name, adapter.account, epoch, f"{epoch}:{self.holder_id}")
        self.held[(holding.channel, holding.account)] = holding
        self.acquired += 1
        logger.info("listener %s/%s: this process holds it (epoch %d)", adapter.name, adapter.account, epoch)
        return holding

    async def _run_held(self, adapter: Channel, listener: Listener, holding: Holding, started: float) -> bool:
        """Run the listener until it ends or the lease is lost; ``True`` when the listener failed."""
        listening = asyncio.create_task(listener.listen(_stopping_emit(self.emit_for(adapter))))
        keeping = asyncio.create_task(self._keep(adapter, holding, started))
        try:
            await asyncio.wait({listening, keeping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (listening, keeping):
                task.cancel()
            await asyncio.gather(listening, keeping, return_exceptions=True)
        if keeping.done() and not keeping.cancelled() and listening.cancelled():
            return False  # the lease was lost: the listener stopped with it
        error = None if listening.cancelled() else listening.exception()
        if error is not None:
            logger.warning("listener %s/%s failed: %s: %s", adapter.name, adapter.account, type(error).__name__, error)
        return True

    async def _keep(self, adapter: Channel, holding: Holding, started: float) -> None:
        """Renew every third of the TTL; return when the lease is lost or cannot be confirmed in time."""
        lease, _ = self._lease_keys(adapter)
        interval = self.lease_ms / 3000
        confirmed = started  # the lease runs from (at the latest) when we asked for it
        while True:
            await asyncio.sleep(interval)
            attempt = time.monotonic()
            try:
                renewed = bool(await scripts.LEASE_RENEW(self.redis, [lease], [holding.token, self.lease_ms]))
            except RedisError as err:
                _stop_if_cancelled()
                logger.warning("listener lease renewal for %s/%s: %s", adapter.name, adapter.account, err)
                if time.monotonic() - confirmed > self.lease_ms / 1000 - interval:
                    logger.warning("listener %s/%s: lease unconfirmed; stopping", adapter.name, adapter.account)
                    return
                continue
            _stop_if_cancelled()
            if not renewed:
                logger.warning("listener %s/%s: lease lost (epoch %d)", adapter.name, adapter.account, holding.epoch)
                return
            confirmed = attempt

    async def _release(self, holding: Holding) -> None:
        lease = self._keys.listener_lease(holding.channel, holding.account)
        epoch_key = self._keys.listener_epoch(holding.channel, holding.account)
        with contextlib.suppress(RedisError):
            # lease_abandon.lua deletes the lease only while it is still ours; no attempt is handed back ('')
            await scripts.LEASE_ABANDON(self.redis, [lease, epoch_key], [holding.token, ""])
        _stop_if_cancelled()

    def _lease_keys(self, adapter: Channel) -> tuple[str, str]:
        return (
            self._keys.listener_lease(adapter.name, adapter.account),
            self._keys.listener_epoch(adapter.name, adapter.account),
        )
