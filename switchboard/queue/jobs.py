"""Drain jobs: "drain session S" triggers on per-shard queues, in the session's own cluster slot.

A drain job is a **drain entry**, ``<session>|<job id>``, on the drain queue of the session's shard
(:attr:`~switchboard.queue.keys.ShardKeys.drainq`); the session's drain flag holds the job id, so a session has at most
one live entry. A worker takes an entry with ``take.lua`` (popped and registered in the shard's running set
:attr:`~switchboard.queue.keys.ShardKeys.wip` with a heartbeat deadline, in one step) and the drain's releasing or
yielding step removes it again. Every script that pushes an entry wakes the shard's worker (``SPUBLISH`` on
:attr:`~switchboard.queue.keys.ShardKeys.ready`). No job hash: everything a worker needs is in the entry. Job ids start
with their creation time, so the reaper can tell a flag's age without a lookup.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis.asyncio as aioredis

from switchboard.queue import scripts
from switchboard.queue.keys import SessionKeys, ShardKeys
from switchboard.queue.lease import LeaseToken
from switchboard.queue.shards import shard_of
from switchboard.types import SessionKey

__all__ = [
    "WIP_TTL_S",
    "DrainJobs",
    "StartedJob",
    "entry",
    "job_age_s",
    "new_job_id",
    "parse_entry",
]

WIP_TTL_S: Final = 60.0
"""Heartbeat deadline of a running drain in its shard's running set, pushed forward at each worker heartbeat."""


def new_job_id(now: float | None = None) -> str:
    """A fresh drain job id, sortable by creation time (letters and digits only)."""
    ms = int((time.time() if now is None else now) * 1000)
    return f"d{ms:012x}{secrets.token_hex(6)}"


def job_age_s(job_id: str, now: float | None = None) -> float | None:
    """Seconds since a drain job id was made, or ``None`` for an id not made by :func:`new_job_id`."""
    if len(job_id) != 25 or not job_id.startswith("d"):
        return None
    try:
        ms = int(job_id[1:13], 16)
    except ValueError:
        return None
    return (time.time() if now is None else now) - ms / 1000


def entry(session: SessionKey, job_id: str) -> str:
    """The drain entry of ``session``'s drain job ``job_id`` (what its shard's queue and running set hold)."""
    return f"{session}|{job_id}"


def parse_entry(raw: Any) -> tuple[SessionKey, str]:
    """The session and job id of a drain entry.

    Raises:
        ValueError: not a drain entry.
    """
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    session, sep, job_id = text.rpartition("|")
    if not sep or not session or not job_id:
        raise ValueError(f"not a drain entry: {text!r}")
    return SessionKey(session), job_id


@dataclass(frozen=True, slots=True)
class StartedJob:
    """A drain job this worker took (its entry is in its shard's running set)."""

    job_id: str
    entry: str
    """``<session>|<job id>``: its member in the shard's running set."""
    session: SessionKey

    @property
    def shard(self) -> int:
        """The session's logical shard."""
        return shard_of(self.session)


class DrainJobs:
    """Queues, takes and closes drain entries (each call in the session's shard slot)."""

    async def enqueue(
        self,
        redis: aioredis.Redis,
        session: SessionKey,
        *,
        expected: str | None,
        front: bool = False,
        stale: str = "",
    ) -> str | None:
        """Queue a new drain for ``session`` and point its drain flag at it.

        Only when no lease is held and the flag still reads ``expected`` (``None``: absent), so two
        repairers never both enqueue. ``front``: at the head of the shard's queue (a session whose drain was
        interrupted). ``stale``: an entry to drop from the running set in the same step (a repaired drain's).
        Returns the new job id, or ``None`` when nothing was done.
        """
        return (await self.enqueue_many(redis, [(session, expected, stale)], front=front))[0]

    async def enqueue_many(
        self,
        redis: aioredis.Redis,
        sessions: Sequence[tuple[SessionKey, str | None, str]],
        *,
        front: bool,
    ) -> list[str | None]:
        """:meth:`enqueue` for each ``(session, expected flag, stale entry)``, in one round trip; the new job ids."""
        ids: list[str] = []
        calls: list[tuple[list[str], list[scripts.ScriptArg]]] = []
        for session, expected, stale in sessions:
            job_id = new_job_id()
            shard = SessionKeys(session).shard
            ids.append(job_id)
            calls.append(
                (
                    [SessionKeys(session).lease, SessionKeys(session).drain, shard.drainq, shard.wip],
                    [expected or "", job_id, entry(session, job_id), shard.ready, "1" if front else "", stale],
                )
            )
        done = await scripts.ENQUEUE.many(redis, calls)
        return [job_id if ok else None for job_id, ok in zip(ids, done, strict=True)]

    async def yield_slot(
        self, redis: aioredis.Redis, lease: LeaseToken, job: StartedJob | None = None, *, elsewhere: bool = False
    ) -> bool:
        """Fairness: if other drains wait, free ``lease`` and queue a new drain entry at the back, in one step.

        Others wait when the session's shard queue is not empty, or (``elsewhere``) when the worker knows drains of
        its other shards wait. Returns ``True`` when the slot was given up (the drain must end; its ``job`` is
        closed in the same step), ``False`` when nothing waits.

        Raises:
            FencedWriteError: the lease has passed to another epoch.
        """
        job_id = new_job_id()
        keys = SessionKeys(lease.session)
        shard = keys.shard
        done = await scripts.LEASE_YIELD(
            redis,
            [keys.lease, keys.fenced_rejections, keys.inbox, keys.drain, shard.drainq, shard.wip],
            [
                lease.token,
                job_id,
                entry(lease.session, job_id),
                shard.ready,
                job.entry if job is not None else "",
                "1" if elsewhere else "",
            ],
            session=lease.session,
            epoch=lease.epoch,
        )
        return bool(done)

    async def take_over(self, redis: aioredis.Redis, session: SessionKey, lease_value: str) -> str | None:
        """Free a dead worker's lease (only if it still reads ``lease_value``) and queue a new drain, in one step.

        The entry goes to the head of the shard's queue. Returns the new job id, or ``None`` when the lease changed
        meanwhile (nothing done).
        """
        return (await self.take_over_many(redis, [(session, lease_value)]))[0]

    async def take_over_many(
        self, redis: aioredis.Redis, sessions: Sequence[tuple[SessionKey, str]]
    ) -> list[str | None]:
        """:meth:`take_over` for each ``(session, lease value seen)``, in one round trip; the new job ids in order."""
        ids: list[str] = []
        calls: list[tuple[list[str], list[scripts.ScriptArg]]] = []
        for session, seen in sessions:
            job_id = new_job_id()
            keys = SessionKeys(session)
            ids.append(job_id)
            calls.append(
                (
                    [keys.lease, keys.drain, keys.shard.drainq, keys.shard.wip],
                    [seen, job_id, entry(session, job_id), keys.shard.ready, session],
                )
            )
        done = await scripts.LEASE_TAKEOVER.many(redis, calls)
        return [job_id if ok else None for job_id, ok in zip(ids, done, strict=True)]

    async def take(
        self, redis: aioredis.Redis, shard: int, *, ttl_s: float = WIP_TTL_S
    ) -> tuple[StartedJob | None, int]:
        """Take the next drain of ``shard`` (popped and registered as running in one step).

        Returns the job (``None`` when the queue was empty, or held no drain entry) and how many entries are left.
        """
        keys = ShardKeys.every()[shard]
        raw, left = await scripts.TAKE(redis, [keys.drainq, keys.wip], [f"{time.time() + ttl_s:.3f}"])
        if raw is None:
            return None, 0
        return await self._started(redis, raw, keys), int(left)

    async def register(self, redis: aioredis.Redis, raw: Any, *, ttl_s: float = WIP_TTL_S) -> StartedJob | None:
        """Register an entry popped outside :meth:`take` (the worker's safety pass) as running."""
        try:
            session, _job_id = parse_entry(raw)
        except ValueError:
            return None
        keys = SessionKeys(session).shard
        await redis.zadd(keys.wip, {_text(raw): time.time() + ttl_s})
        return await self._started(redis, raw, keys)

    async def _started(self, redis: aioredis.Redis, raw: Any, keys: ShardKeys) -> StartedJob | None:
        text = _text(raw)
        try:
            session, job_id = parse_entry(text)
        except ValueError:
            await redis.zrem(keys.wip, text)  # not ours: dropped (nothing but the scripts writes the queue)
            return None
        return StartedJob(job_id, text, session)

    async def finish(self, redis: aioredis.Redis, job: StartedJob) -> None:
        """Close a drain whose step did not (handed over, crashed, busy): its entry leaves the running set."""
        await redis.zrem(ShardKeys.every()[job.shard].wip, job.entry)

    async def expire(self, redis: aioredis.Redis, job: StartedJob) -> None:
        """Mark a drain that crashed as no longer running: its deadline passes now.

        The reaper's next sweep repairs its session (a drain that keeps crashing is retried once a sweep, not in a
        loop).
        """
        await redis.zadd(ShardKeys.every()[job.shard].wip, {job.entry: time.time() - 1}, xx=True)

    async def heartbeat(self, redis: aioredis.Redis, jobs: Sequence[StartedJob], *, ttl_s: float = WIP_TTL_S) -> None:
        """Push the running-set deadlines of running drains forward, one ``ZADD XX`` per shard in one pipeline."""
        if not jobs:
            return
        deadline = time.time() + ttl_s
        by_shard: dict[int, dict[str, float]] = {}
        for job in jobs:
            by_shard.setdefault(job.shard, {})[job.entry] = deadline
        async with redis.pipeline(transaction=False) as pipe:
            for shard, members in by_shard.items():
                pipe.zadd(ShardKeys.every()[shard].wip, members, xx=True)
            await pipe.execute()


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)
