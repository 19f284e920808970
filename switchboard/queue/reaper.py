"""The reaper: finds runnable sessions nobody is draining and gives them a new drain job; cleans RQ's registries.

It runs in every worker, one sweep at a time under a short Redis lock, repairs drain flags that point at no live
job, sends expired approvals into their sessions, and (:meth:`Reaper.take_over_dead_workers`) frees the leases of
workers that missed their heartbeats, seconds after a crash. Duplicate drain jobs are harmless: the lease serialises
them (``docs/ARCHITECTURE.md`` §5).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any, Final

import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard.errors import QueueUnavailableError
from switchboard.queue.expiry import ApprovalExpiry
from switchboard.queue.fanout import each_shard
from switchboard.queue.jobs import DrainJobs, job_age_s
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.settings import QueueSettings
from switchboard.types import SessionKey

__all__ = ["SWEEP_BATCH", "SWEEP_PER_SHARD", "Reaper", "live_workers", "queued_grace_s", "worker_ttl_s"]

logger = logging.getLogger(__name__)

SWEEP_BATCH: Final = 2_000
"""Sessions whose leases are read per round trip when taking over a dead worker's."""
SWEEP_PER_SHARD: Final = 8
"""Runnable sessions examined per shard and sweep (the shard's oldest): at most 8,192 a sweep over the 1,024 shards."""
RQ_CLEANUP_EVERY_S: Final = 5.0
"""How often RQ's own registry cleanup runs (it is not on the recovery path), from this long after start."""
_TERMINAL: Final = {"finished", "failed", "stopped", "canceled"}
_GLOBAL = GlobalKeys()


def worker_ttl_s(settings: QueueSettings) -> float:
    """A worker whose heartbeat is older than this is dead: the lease TTL (it heartbeats every third of it)."""
    return settings.lease_ms / 1000


def queued_grace_s(settings: QueueSettings) -> float:
    """Age after which a queued drain job is looked for in RQ's queue list (a job in no list is lost)."""
    return max(30.0, 10 * settings.lease_ms / 1000)


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
        self.jobs = DrainJobs(settings.name)
        self.expiry = ApprovalExpiry(redis, settings)
        """Approvals past their expiry are told to their sessions (:mod:`switchboard.queue.expiry`)."""
        self._last_rq_cleanup = time.monotonic()
        """RQ's cleanup first runs a period after start: a worker just started has nothing of its own in RQ's
        registries, and its first sweep (which repairs sessions) stays short."""

    async def sweep(self) -> int:
        """One sweep (if this worker wins the lock). Returns how many sessions were given a new drain job."""
        lock_ms = max(int(self.settings.reaper_interval_s * 900), 100)
        if not await self.redis.set(_GLOBAL.reaper_lock, self.worker_id, nx=True, px=lock_ms):
            return 0
        stuck = await self._stuck_intermediate()
        if stuck:  # their hashes go with them, so the runnable sweep below repairs their sessions
            dropped = await self.jobs.drop_stuck(self.redis, sorted(stuck))
            logger.warning("gave up %d drain jobs stuck in RQ's intermediate list", dropped)
        repaired = await self._sweep_runnable()
        try:
            await self.expiry.sweep()
        except (RedisError, QueueUnavailableError) as err:
            logger.warning("approval expiry sweep failed: %s", err)
        if self.sync_redis is not None and time.monotonic() - self._last_rq_cleanup >= RQ_CLEANUP_EVERY_S:
            self._last_rq_cleanup = time.monotonic()
            try:
                await asyncio.to_thread(self._clean_rq_registries)
            except RedisError as err:
                logger.warning("RQ registry cleanup failed: %s", err)
            except Exception:
                logger.exception("RQ registry cleanup crashed")
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
        oldest = await each_shard(self.redis, lambda pipe, shard: pipe.zrange(shard.runnable, 0, SWEEP_PER_SHARD - 1))
        sessions = [SessionKey(_text(s) or "") for members in oldest for s in members]
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
        flags = [f for _s, f in candidates if f is not None]
        live_since = (now - worker_ttl_s(self.settings)) * 1000
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrangebyscore(_GLOBAL.workers, live_since, "+inf")
            for flag in flags:
                pipe.hmget(self.jobs.keys.job(flag), ["status", "worker_name"])
            results = await pipe.execute()
        live = {_text(w) for w in results[0]}
        job_state = {flag: (_text(row[0]), _text(row[1])) for flag, row in zip(flags, results[1:], strict=True)}
        grace = queued_grace_s(self.settings)
        old_queued = [f for f in flags if job_state[f][0] == "queued" and (job_age_s(f, now) or 0.0) > grace]
        lost = await self._not_in_queue(old_queued)
        lost |= await self._unleased_started(
            [f for f in flags if job_state[f][0] == "started" and job_state[f][1] in live], now
        )
        todo = [
            (session, current)
            for session, current in candidates
            if current is None or self._needs_repair(job_state[current], current, live, lost)
        ]
        if not todo:
            return 0
        # at the head of the queue: these sessions were interrupted, the ones waiting behind have not started
        jobs = await self.jobs.enqueue_many(self.redis, todo, front=True)
        reasons: Counter[str] = Counter()
        for (session, current), job in zip(todo, jobs, strict=True):
            if job is None:
                continue
            status, worker = job_state[current] if current is not None else ("missing", None)
            reason = "lost" if current in lost else "gone" if status is None else str(status)
            reasons[reason] += 1
            logger.debug("re-enqueued a drain for stranded %s (flag %s: %s, %s)", session, current, reason, worker)
        if reasons:
            summary = ", ".join(f"{reason} {count}" for reason, count in sorted(reasons.items()))
            logger.info("re-enqueued drains for %d stranded sessions (their flag's job: %s)", reasons.total(), summary)
        return reasons.total()

    @staticmethod
    def _needs_repair(job: tuple[str | None, str | None], flag: str, live: set[str | None], lost: set[str]) -> bool:
        status, worker = job
        if status is None or status in _TERMINAL:
            return True
        if status == "started":
            return worker not in live or flag in lost
        if status == "queued":
            return flag in lost
        return True

    async def _unleased_started(self, job_ids: list[str], now: float) -> set[str]:
        """Started jobs of live workers whose session has stayed without a lease for a whole lease TTL.

        A running drain holds its session's lease from start to release, so such a job is not running: its
        drain died on an error the worker could not record (Redis gone mid-turn). Seen twice, a lease apart.
        """
        if not job_ids:
            return set()
        keys = self.jobs.keys
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.set(keys.unleased_since(job_id), f"{now:.3f}", nx=True, ex=3600)
                pipe.get(keys.unleased_since(job_id))
            seen = await pipe.execute()
        grace = worker_ttl_s(self.settings)
        return {job_id for i, job_id in enumerate(job_ids) if now - float(_text(seen[2 * i + 1]) or now) > grace}

    async def _not_in_queue(self, job_ids: list[str]) -> set[str]:
        """Those of ``job_ids`` in neither RQ's queue list nor its intermediate list (only checked for old ids)."""
        if not job_ids:
            return set()
        keys = self.jobs.keys
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.lpos(keys.queue, job_id)
                pipe.lpos(keys.intermediate, job_id)
            found = await pipe.execute()
        return {job_id for i, job_id in enumerate(job_ids) if found[2 * i] is None and found[2 * i + 1] is None}

    async def _stuck_intermediate(self) -> set[str]:
        """Job ids left in RQ's intermediate list by a worker that died right after ``BLMOVE``.

        Like RQ's own ``IntermediateQueue.cleanup``: the first sweep that sees an id notes when; a later
        sweep, once the lease TTL has passed, gives the job up (:meth:`DrainJobs.drop_stuck`; the runnable sweep
        then repairs its session).
        """
        keys = self.jobs.keys
        ids = [_text(i) or "" for i in await self.redis.lrange(keys.intermediate, 0, -1)]
        if not ids:
            return set()
        now = time.time()
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.set(keys.first_seen(job_id), f"{now:.3f}", nx=True, ex=3600)
                pipe.get(keys.first_seen(job_id))
            seen = await pipe.execute()
        stuck: set[str] = set()
        grace = worker_ttl_s(self.settings)
        for i, job_id in enumerate(ids):
            first = float(_text(seen[2 * i + 1]) or now)
            if now - first > grace:
                stuck.add(job_id)
        return stuck

    def _clean_rq_registries(self) -> None:
        from rq import Queue
        from rq.registry import clean_registries
        from rq.serializers import JSONSerializer

        assert self.sync_redis is not None
        clean_registries(Queue(self.settings.name, connection=self.sync_redis, serializer=JSONSerializer))
