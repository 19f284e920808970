"""Drain jobs on RQ: "drain session S" triggers in RQ's own format, written and run with the async client.

RQ is the work engine; the per-session order lives in our own structures. A drain job is an ordinary rq 3 job hash,
so RQ's tools and registries understand it, but the ingest script writes it and pushes its id atomically with the
message rather than through the synchronous ``Queue.enqueue``. Job ids start with their creation time, so the reaper
can tell a flag's age without a lookup.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Final

import redis.asyncio as aioredis

from switchboard.queue import scripts
from switchboard.queue.keys import GlobalKeys, RQKeys, SessionKeys
from switchboard.queue.lease import LeaseToken
from switchboard.types import SessionKey

__all__ = [
    "DRAIN_FUNCTION",
    "FAILURE_TTL_S",
    "JOB_TIMEOUT_S",
    "RESULT_TTL_S",
    "DrainJobs",
    "StartedJob",
    "drain_session",
    "job_age_s",
    "new_job_id",
    "rq_time",
]

logger = logging.getLogger(__name__)

_GLOBAL = GlobalKeys()

DRAIN_FUNCTION: Final = "switchboard.queue.jobs.drain_session"
"""The function named in every drain job (what ``rq info`` shows)."""
RESULT_TTL_S: Final = 0
"""A finished drain job is deleted at once: it has no result worth keeping."""
FAILURE_TTL_S: Final = 7 * 24 * 3600
"""A failed drain job (a worker bug, not a failed turn) stays in RQ's FailedJobRegistry for a week."""
JOB_TIMEOUT_S: Final = 3600
"""RQ's ``timeout`` field; turns are bounded by their own deadlines, the lease and the reaper."""


def drain_session(session: str) -> None:
    """Placeholder RQ resolves for drain jobs; they are run by :class:`~switchboard.worker.worker.SessionWorker`.

    Raises:
        RuntimeError: always; a stock ``rq worker`` must not run drain jobs (it would bypass the lease).
    """
    raise RuntimeError(f"drain jobs ({session!r}) are run by `switchboard worker`, not by a stock rq worker")


def new_job_id(now: float | None = None) -> str:
    """A fresh drain job id, sortable by creation time (RQ allows ``[A-Za-z0-9_-]``)."""
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


def rq_time(ts: float) -> str:
    """A timestamp in RQ's stored format (``utcformat``)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class DrainJobs:
    """Builds drain-job hashes for one RQ queue and decodes their payload."""

    def __init__(self, queue_name: str) -> None:
        self.queue_name = queue_name
        self.keys = RQKeys(queue_name)

    @cached_property
    def config(self) -> str:
        """The constant part of every drain job, as the JSON ``_job.lua`` expects (built once per queue)."""
        fields: list[str] = []
        for name, value in (
            ("success_callback_name", ""),
            ("failure_callback_name", ""),
            ("stopped_callback_name", ""),
            ("started_at", ""),
            ("ended_at", ""),
            ("last_heartbeat", ""),
            ("worker_name", ""),
            ("group_id", ""),
            ("origin", self.queue_name),
            ("timeout", str(JOB_TIMEOUT_S)),
            ("result_ttl", str(RESULT_TTL_S)),
            ("failure_ttl", str(FAILURE_TTL_S)),
            ("status", "queued"),
        ):
            fields += [name, value]
        return json.dumps(
            {"queue": self.keys.queue, "queues": self.keys.queues, "func": DRAIN_FUNCTION, "fields": fields}
        )

    @staticmethod
    def session_of(data: bytes) -> SessionKey:
        """The session a job's ``data`` field names.

        Raises:
            ValueError: the payload is not a drain job.
        """
        raw = data if data.startswith(b"[") else zlib.decompress(data)  # ours are uncompressed (RQ reads both)
        func, _instance, args, _kwargs = json.loads(raw)
        if func != DRAIN_FUNCTION or not args or not isinstance(args[0], str):
            raise ValueError(f"not a drain job: {func!r}")
        return SessionKey(args[0])

    async def enqueue(
        self, redis: aioredis.Redis, session: SessionKey, *, expected: str | None, front: bool = False
    ) -> str | None:
        """Push a new drain job for ``session`` and point its drain flag at it.

        Only when no lease is held and the flag still reads ``expected`` (``None``: absent), so two
        repairers never both enqueue. ``front``: at the head of the queue (a session whose drain was
        interrupted). Returns the new job id, or ``None`` when nothing was done.
        """
        return (await self.enqueue_many(redis, [(session, expected)], front=front))[0]

    async def enqueue_many(
        self, redis: aioredis.Redis, sessions: Sequence[tuple[SessionKey, str | None]], *, front: bool
    ) -> list[str | None]:
        """:meth:`enqueue` for each ``(session, expected flag)``, in one round trip; the new job ids in order."""
        ids, calls = self._pushes([(session, expected or "") for session, expected in sessions], "1" if front else "")
        done = await scripts.ENQUEUE.many(redis, calls)
        return [job_id if ok else None for job_id, ok in zip(ids, done, strict=True)]

    def _pushes(
        self, sessions: Sequence[tuple[SessionKey, str]], *extra: scripts.ScriptArg
    ) -> tuple[list[str], list[tuple[list[str], list[scripts.ScriptArg]]]]:
        """New job ids, and the keys and arguments of one job-pushing script call per ``(session, first argument)``.

        The shape ``enqueue.lua`` and ``lease_takeover.lua`` share: lease, flag, job hash, queue, queues; then the
        first argument, the job id, the session, the time, the job config and ``extra``.
        """
        now = rq_time(time.time())
        ids: list[str] = []
        calls: list[tuple[list[str], list[scripts.ScriptArg]]] = []
        for session, first in sessions:
            job_id = new_job_id()
            keys = SessionKeys(session)
            ids.append(job_id)
            calls.append(
                (
                    [keys.lease, keys.drain, self.keys.job(job_id), self.keys.queue, self.keys.queues],
                    [first, job_id, session, now, self.config, *extra],
                )
            )
        return ids, calls

    async def drop_stuck(self, redis: aioredis.Redis, job_ids: Sequence[str]) -> int:
        """Give up drain jobs stuck in RQ's intermediate list: each id dropped and its hash deleted in one step.

        Returns how many were dropped (a job some worker registered meanwhile is left alone).
        """
        done = await scripts.JOB_DROP_STUCK.many(
            redis,
            [([self.keys.intermediate, self.keys.job(j), self.keys.first_seen(j)], [j]) for j in job_ids],
        )
        return sum(1 for ok in done if ok)

    async def yield_slot(self, redis: aioredis.Redis, lease: LeaseToken, job: StartedJob | None = None) -> bool:
        """Fairness: if other drain jobs wait, free ``lease`` and push a new drain job at the back, in one step.

        Returns ``True`` when the slot was given up (the drain must end; its ``job`` is closed in the same step),
        ``False`` when nothing waits.

        Raises:
            FencedWriteError: the lease has passed to another epoch.
        """
        job_id = new_job_id()
        keys = SessionKeys(lease.session)
        done = await scripts.LEASE_YIELD(
            redis,
            [
                keys.lease,
                keys.fenced_rejections,
                keys.inbox,
                keys.drain,
                self.keys.job(job_id),
                self.keys.queue,
                self.keys.queues,
                self.keys.job(job.job_id if job is not None else "none"),
                self.keys.started,
            ],
            [lease.token, job_id, lease.session, rq_time(time.time()), self.config, job.composite if job else ""],
            session=lease.session,
            epoch=lease.epoch,
        )
        return bool(done)

    async def take_over(self, redis: aioredis.Redis, session: SessionKey, lease_value: str) -> str | None:
        """Free a dead worker's lease (only if it still reads ``lease_value``) and push a new drain job, in one step.

        The job goes to the head of the queue. Returns the new job id, or ``None`` when the lease changed meanwhile
        (nothing done).
        """
        return (await self.take_over_many(redis, [(session, lease_value)]))[0]

    async def take_over_many(
        self, redis: aioredis.Redis, sessions: Sequence[tuple[SessionKey, str]]
    ) -> list[str | None]:
        """:meth:`take_over` for each ``(session, lease value seen)``, in one round trip; the new job ids in order."""
        ids, calls = self._pushes(sessions)
        done = await scripts.LEASE_TAKEOVER.many(redis, calls)
        return [job_id if ok else None for job_id, ok in zip(ids, done, strict=True)]

    async def start(
        self, redis: aioredis.Redis, job_id: str, *, worker: str, heartbeat_ttl_s: float
    ) -> StartedJob | None:
        """Register a popped job as started (RQ's StartedJobRegistry, job status) and decode its session.

        Returns ``None`` for a job whose hash is gone or that is not a drain job (the latter is failed).
        """
        execution = secrets.token_hex(6)
        composite = f"{job_id}:{execution}"
        now = time.time()
        data = await scripts.JOB_START(
            redis,
            [self.keys.job(job_id), self.keys.started, self.keys.intermediate],
            [job_id, composite, f"{now + heartbeat_ttl_s:.3f}", rq_time(now), worker],
        )
        if data is None:
            return None
        job = StartedJob(job_id, composite, SessionKey(""))
        try:
            return StartedJob(job_id, composite, self.session_of(data))
        except (ValueError, zlib.error, TypeError) as err:
            logger.error("job %s on queue %s is not a drain job", job_id, self.queue_name)
            await self.finish(redis, job, error=f"not a drain job: {err}")
            return None

    async def finish(self, redis: aioredis.Redis, job: StartedJob, *, error: str | None = None) -> None:
        """Close the job's RQ bookkeeping: deleted on success (``RESULT_TTL_S`` 0), failed registry on error."""
        now = time.time()
        await scripts.JOB_FINISH(
            redis,
            [self.keys.job(job.job_id), self.keys.started, self.keys.failed],
            [
                job.job_id,
                job.composite,
                "finished" if error is None else "failed",
                rq_time(now),
                RESULT_TTL_S,
                FAILURE_TTL_S,
                f"{now:.3f}",
                zlib.compress(error.encode()) if error is not None else "",
            ],
        )

    async def heartbeat(self, redis: aioredis.Redis, jobs: list[StartedJob], *, ttl_s: float) -> None:
        """Push the started-registry deadlines of running jobs forward (RQ's cleanup spares them)."""
        if jobs:
            deadline = time.time() + ttl_s
            await redis.zadd(self.keys.started, {job.composite: deadline for job in jobs}, xx=True)


@dataclass(frozen=True, slots=True)
class StartedJob:
    """A drain job this worker registered as started."""

    job_id: str
    composite: str
    """``<job id>:<execution id>``: its member in RQ's StartedJobRegistry."""
    session: SessionKey
