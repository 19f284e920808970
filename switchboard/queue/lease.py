"""The session lease with its fencing epoch: who may write for a session right now.

Taking the lease increments the session's epoch and stores ``<epoch>:<worker>`` with a TTL; that value is the fencing
token, renewed every third of the TTL, and every write for the session compares it inside Redis, so a paused or
partitioned worker whose lease passed to another epoch is refused (Kleppmann's fencing tokens).
:data:`CURRENT_LEASE` carries the token to code publishing on the drain's behalf (:func:`fenced_xadd`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard.queue import scripts
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.types import SessionKey

__all__ = ["CURRENT_LEASE", "Lease", "LeaseToken", "fenced_xadd"]

logger = logging.getLogger(__name__)

_GLOBAL = GlobalKeys()


@dataclass(frozen=True, slots=True)
class LeaseToken:
    """Proof of holding a session's lease for one epoch."""

    session: SessionKey
    epoch: int
    token: str
    """The lease value, ``<epoch>:<worker>``: what every fenced write compares."""


CURRENT_LEASE: contextvars.ContextVar[LeaseToken | None] = contextvars.ContextVar("switchboard_lease", default=None)
"""The lease the running drain holds; set around each run and its deliveries."""


async def fenced_xadd(
    redis: aioredis.Redis,
    lease: LeaseToken,
    stream_key: str,
    fields: Mapping[str, str],
    maxlen: int,
    max_bytes: int = 0,
) -> str:
    """``XADD stream_key MAXLEN ~ maxlen * fields`` only while ``lease`` still holds the session.

    With ``max_bytes`` the stream is also trimmed, oldest entries first, to stay within that many bytes.

    Returns:
        The new entry id.

    Raises:
        FencedWriteError: the lease has passed to another epoch (the refusal is counted in Redis).
    """
    args: list[str | int] = [lease.token, maxlen, max_bytes]
    for name, value in fields.items():
        args += [name, value]
    keys = SessionKeys(lease.session)
    entry = await scripts.FENCED_XADD(
        redis, [keys.lease, keys.fenced_rejections, stream_key], args, session=lease.session, epoch=lease.epoch
    )
    return entry.decode() if isinstance(entry, bytes) else str(entry)


class Lease:
    """Acquire, renew and give up session leases for one worker."""

    def __init__(self, redis: aioredis.Redis, *, worker_id: str, lease_ms: int) -> None:
        self.redis = redis
        self.worker_id = worker_id
        self.lease_ms = lease_ms

    async def acquire(self, session: SessionKey) -> LeaseToken | None:
        """Take the lease, or ``None`` when another holder has it (that holder drains the session)."""
        keys = SessionKeys(session)
        epoch = int(await scripts.LEASE_ACQUIRE(self.redis, [keys.lease, keys.epoch], [self.worker_id, self.lease_ms]))
        if epoch == 0:
            return None
        return LeaseToken(session=session, epoch=epoch, token=f"{epoch}:{self.worker_id}")

    async def renew(self, lease: LeaseToken) -> bool:
        """Extend the lease; ``False`` when it is no longer ours."""
        keys = SessionKeys(lease.session)
        return bool(await scripts.LEASE_RENEW(self.redis, [keys.lease], [lease.token, self.lease_ms]))

    async def abandon(self, lease: LeaseToken, *, return_attempt_of: str | None = None) -> bool:
        """Give the lease up without finishing (shutdown); optionally hand back the running attempt."""
        keys = SessionKeys(lease.session)
        return bool(
            await scripts.LEASE_ABANDON(self.redis, [keys.lease, keys.attempts], [lease.token, return_attempt_of or ""])
        )

    async def keep_alive(self, lease: LeaseToken, lost: asyncio.Event) -> None:
        """Renew every third of the TTL until cancelled; set ``lost`` when the lease is gone."""
        interval = self.lease_ms / 3000
        while True:
            await asyncio.sleep(interval)
            try:
                if not await self.renew(lease):
                    logger.warning("lease of %s (epoch %d) was lost", lease.session, lease.epoch)
                    lost.set()
                    return
            except RedisError as err:
                # the next fenced write decides; keep trying while the TTL may still run
                logger.warning("lease renewal for %s failed: %s", lease.session, err)
