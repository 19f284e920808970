"""The reaper: finds runnable sessions nobody is draining and gives them a new drain job; cleans the running sets.

It runs in every worker, one sweep at a time under a short Redis lock, repairs drain flags that point at no live
job, sends expired approvals into their sessions, and (:meth:`Reaper.take_over_dead_workers`) frees the leases of
workers that missed their heartbeats, seconds after a crash. Duplicate drain jobs are harmless: the lease serialises
them (``docs/ARCHITECTURE.md`` §5).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any, Final

import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard.errors import QueueUnavailableError
from switchboard.queue.expiry import ApprovalExpiry
from switchboard.queue.fanout import each_shard, lowest
from switchboard.queue.jobs import DrainJobs, entry, job_age_s
from switchboard.queue.keys import GlobalKeys, SessionKeys, ShardKeys
from switchboard.settings import QueueSettings
from switchboard.types import SessionKey

__all__ = ["SWEEP_BATCH", "Reaper", "live_workers", "queued_grace_s", "worker_ttl_s"]

logger = logging.getLogger(__name__)

SWEEP_BATCH: Final = 2_000
"""Runnable sessions examined per sweep (the oldest over every shard: one ``ZUNION`` on a single server), and whose
leases are read per round trip when taking over a dead worker's."""
WIP_CLEAN_SHARDS: Final = 4
"""Shards whose running sets each sweep cleans of long-expired entries: all 1,024 in 256 sweeps (under 9 minutes at
the default 2 s), a steady 2 commands a second rather than bursts that would blur the capacity bench's background."""
WIP_FORGET_S: Final = 3600.0
"""An entry this long past its heartbeat deadline is forgotten (its session, if still runnable, was repaired)."""
_GLOBAL = GlobalKeys()


def worker_ttl_s(settings: QueueSettings) -> float:
    """A worker whose heartbeat is older than this is dead: the lease TTL (it heartbeats every third of it)."""
    return settings.lease_ms / 1000


def queued_grace_s(settings: QueueSettings) -> float:
    """Age after which a drain job not running is looked for in its shard's drain queue (an entry in no list is lost).

    An entry is always in its queue or in its running set (``take.lua`` moves it in one step) but for the moment
    between the safety pass's ``LMPOP`` and its registration; a lease TTL covers that with room to spare.
    """
    return settings.lease_ms / 1000


async def live_workers(redis: aioredis.Redis, ttl_s: float) -> int:
    """Workers that heartbeated within ``ttl_s`` (for ``/healthz``)."""
    since = (time.time() - ttl_s) * 1000
    return int(await redis.zcount(_GLOBAL.workers, since, "+inf"))


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


class Reaper:
    """Repairs stranded sessions; one instance per worker, sweeps coordinated through a Redis lock."""

    def __init__(
        self,
        redis: aioredis.Redis,
        settings: QueueSettings,
        *,
        worker_id: str,
        sync_redis: redis.Redis | None = None,
    ) -> None:
        self.redis = redis
        self.settings = settings
        self.worker_id = worker_id
        self.sync_redis = sync_redis
        self.jobs = DrainJobs()
        self.expiry = ApprovalExpiry(redis, settings)
        """Approvals past their expiry are told to their sessions (:mod:`switchboard.queue.expiry`)."""
        self._clean_from = 0
        """The first shard of the next sweep's running-set cleanup window."""

    async def sweep(self) -> int:
        """One sweep (if this worker wins the lock). Returns how many sessions were given a new drain job."""
        lock_ms = max(int(self.settings.reaper_interval_s * 900), 100)
        if not await self.redis.set(_GLOBAL.reaper_lock, self.worker_id, nx=True, px=lock_ms):
            return 0
        repaired = await self._sweep_runnable()
        try:
            await self.expiry.sweep()
        except (RedisError, QueueUnavailableError) as err:
            logger.warning("approval expiry sweep failed: %s", err)
        try:
            await self._clean_running_sets()
        except RedisError as err:
            logger.warning("running-set cleanup failed: %s", err)
        return repaired

    async def take_over_dead_workers(self) -> int:
        """Free the leases held by workers whose liveness key is gone, each with a new drain job; returns how many.

        A dead worker is then dropped from ``GlobalKeys.workers`` (its started jobs count as orphans for the sweep;
        a frozen worker that resumes re-registers with its next beat and finds its leases fenced).
        """
        workers = [w for w in (_text(m) for m in await self.redis.zrange(_GLOBAL.workers, 0, -1)) if w]
        others = [w for w in workers if w != self.worker_id]
        if not others:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for worker in others:
                pipe.exists(_GLOBAL.worker_alive(worker))
            alive = await pipe.execute()
        dead = {worker for worker, up in zip(others, alive, strict=True) if not up}
        if not dead:
            return 0
        taken = 0
        every = await each_shard(self.redis, lambda pipe, shard: pipe.zrange(shard.runnable, 0, -1))
        runnable = [SessionKey(_text(s) or "") for members in every for s in members]
        for start in range(0, len(runnable), SWEEP_BATCH):
            sessions = runnable[start : start + SWEEP_BATCH]
            leases = await self.redis.mget([SessionKeys(s).lease for s in sessions])
            held = [
                (session, value)
                for session, value in zip(sessions, (_text(v) for v in leases), strict=True)
                if value is not None and value.split(":", 1)[-1] in dead
            ]
            taken += sum(1 for job in await self.jobs.take_over_many(self.redis, held) if job is not None)
        await self.redis.zrem(_GLOBAL.workers, *dead)
        logger.warning("took over %d sessions from dead workers %s", taken, ", ".join(sorted(dead)))
        return taken

    async def _sweep_runnable(self) -> int:
        now = time.time()
        oldest = await lowest(self.redis, lambda shard: shard.runnable, SWEEP_BATCH)
        sessions = [SessionKey(member) for member, _at in oldest]
        if not sessions:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for session in sessions:
                keys = SessionKeys(session)
                pipe.exists(keys.lease)
                pipe.get(keys.drain)
                pipe.zscore(keys.shard.deferred, session)  # put off at the model provider's request
            state = await pipe.execute()
        candidates: list[tuple[SessionKey, str | None]] = []
        for i, session in enumerate(sessions):
            leased, flag, deferred = state[3 * i : 3 * i + 3]
            if not leased and not (deferred is not None and float(deferred) > now):  # its job comes after the wait
                candidates.append((session, _text(flag)))
        if not candidates:
            return 0
        flagged: list[tuple[SessionKey, str]] = [(s, f) for s, f in candidates if f is not None]
        async with self.redis.pipeline(transaction=False) as pipe:
            for flagged_session, job_id in flagged:
                pipe.zscore(SessionKeys(flagged_session).shard.wip, entry(flagged_session, job_id))
            deadlines = dict(zip(flagged, await pipe.execute(), strict=True))
        grace = queued_grace_s(self.settings)
        lost = await self._not_in_queue(
            [(s, f) for s, f in flagged if deadlines[s, f] is None and (job_age_s(f, now) or 0.0) > grace]
        )
        unleased = await self._unleased_running([(s, f) for s, f in flagged if (deadlines[s, f] or 0.0) >= now], now)
        todo: list[tuple[SessionKey, str | None, str]] = []
        why: list[str] = []
        for session, flag in candidates:
            deadline = deadlines.get((session, flag)) if flag is not None else None
            if flag is None:
                reason = "missing"
            elif deadline is not None and deadline < now:
                reason = "expired"  # its worker stopped heartbeating it
            elif flag in unleased:
                reason = "unleased"
            elif flag in lost:
                reason = "lost"
            else:
                continue  # queued, or running
            todo.append((session, flag, entry(session, flag) if flag is not None and deadline is not None else ""))
            why.append(reason)
        if not todo:
            return 0
        # at the head of the queue: these sessions were interrupted, the ones waiting behind have not started
        jobs = await self.jobs.enqueue_many(self.redis, todo, front=True)
        done: Counter[str] = Counter()
        for (session, flag, _stale), reason, job in zip(todo, why, jobs, strict=True):
            if job is not None:
                done[reason] += 1
                logger.debug("re-enqueued a drain for stranded %s (flag %s: %s)", session, flag, reason)
        if done:
            summary = ", ".join(f"{reason} {count}" for reason, count in sorted(done.items()))
            logger.info("re-enqueued drains for %d stranded sessions (their flag's drain: %s)", done.total(), summary)
        return done.total()

    async def _unleased_running(self, running: list[tuple[SessionKey, str]], now: float) -> set[str]:
        """Job ids of running drains (heartbeated) whose session has stayed without a lease for a whole lease TTL.

        A running drain holds its session's lease from its first step to release, so such a drain is not running:
        it died on an error the worker could not record (Redis gone mid-turn). Seen twice, a lease apart.
        """
        if not running:
            return set()
        async with self.redis.pipeline(transaction=False) as pipe:
            for _session, job_id in running:
                pipe.set(_GLOBAL.unleased_since(job_id), f"{now:.3f}", nx=True, ex=3600)
                pipe.get(_GLOBAL.unleased_since(job_id))
            seen = await pipe.execute()
        grace = worker_ttl_s(self.settings)
        return {job_id for i, (_s, job_id) in enumerate(running) if now - float(_text(seen[2 * i + 1]) or now) > grace}

    async def _not_in_queue(self, queued: list[tuple[SessionKey, str]]) -> set[str]:
        """Job ids of ``queued`` whose entry is neither in its shard's drain queue nor running (old ids only).

        The queue is looked at before the running set: an entry a worker takes in between is found in the latter.
        """
        if not queued:
            return set()
        async with self.redis.pipeline(transaction=False) as pipe:
            for session, job_id in queued:
                shard = SessionKeys(session).shard
                pipe.lpos(shard.drainq, entry(session, job_id))
                pipe.zscore(shard.wip, entry(session, job_id))
            found = await pipe.execute()
        return {job_id for i, (_s, job_id) in enumerate(queued) if found[2 * i] is None and found[2 * i + 1] is None}

    async def _clean_running_sets(self) -> None:
        """Drop long-expired entries from a window of shards' running sets (what ``clean_registries`` did for RQ).

        A drain's entry leaves its running set in the step that ends it, a dead worker's in the takeover or the
        repair; what a crash leaves beyond that is removed here, :data:`WIP_CLEAN_SHARDS` shards per sweep.
        """
        every = ShardKeys.every()
        first = self._clean_from
        self._clean_from = (first + WIP_CLEAN_SHARDS) % len(every)
        before = time.time() - WIP_FORGET_S
        async with self.redis.pipeline(transaction=False) as pipe:
            for n in range(first, first + WIP_CLEAN_SHARDS):
                pipe.zremrangebyscore(every[n % len(every)].wip, "-inf", before)
            await pipe.execute()
