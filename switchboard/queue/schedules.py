"""Scheduled jobs in Redis: stored, claimed once per occurrence, and fired into their sessions through ingest.

Every worker runs a :class:`Scheduler` loop; none is a singleton. Each tick reads, by the server's clock, the jobs
due (``GlobalKeys.schedules_due``, a ZSET of next occurrences) and claims each occurrence with one Lua script that
also moves the job to its next occurrence: two schedulers never both win an occurrence. A claimed occurrence is kept
in flight (``GlobalKeys.schedules_inflight``) until it is delivered; a scheduler that dies in between leaves it there,
and another fires it again once its deadline passes. Delivery is an ingest of a
:class:`~switchboard.core.messages.Scheduled` message whose dedup key is the job id and the occurrence time
(:func:`~switchboard.core.schedules.occurrence_key`), so a second fire of one occurrence is a duplicate and the
session runs it once, under its lease, with the fencing and outbound limits of any reply.

An occurrence found later than its grace is run once or skipped by the job's ``misfire`` policy. WhatsApp's and
Messenger's 24-hour windows are checked before delivery (the time of the user's last message, from the session's
event log): outside it a WhatsApp job sends its template, and a job without one is not delivered; the reason is
recorded on the job and as a ``schedule_skipped`` fact in the session's log.

The functions :func:`create_job`, :func:`remove_job`, :func:`get_job`, :func:`list_jobs` and :func:`run_now` are
the API the CLI, the console and the agent's tools use.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard.core.access import ROLE_META
from switchboard.core.events import EventAdapter, ScheduleSkipped
from switchboard.core.messages import ConversationRef, InboundMessage, Scheduled, Sender, session_key
from switchboard.core.schedules import ScheduleSpec, next_after, occurrence_key
from switchboard.errors import QueueUnavailableError
from switchboard.queue import scripts
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.operators import session_conversation
from switchboard.settings import QueueSettings
from switchboard.types import SessionKey

__all__ = [
    "CONFIG_CREATOR",
    "DUE_BATCH",
    "SESSION_WINDOW_S",
    "JobExistsError",
    "JobLimitError",
    "JobView",
    "Scheduler",
    "create_job",
    "get_job",
    "job_session",
    "last_user_message_at",
    "list_jobs",
    "remove_job",
    "run_now",
    "sync_config_jobs",
]

logger = logging.getLogger(__name__)

DUE_BATCH: Final = 1000
"""Occurrences claimed per tick (the rest are claimed by the next tick, or another worker's)."""
FIRE_CONCURRENCY: Final = 256
"""Occurrences of one tick delivered at once (their ingests share round trips through the ingest coalescer)."""
INFLIGHT_MS: Final = 30_000
"""How long a claimed occurrence may stay undelivered before another scheduler fires it again."""
SESSION_WINDOW_S: Final = 24 * 3600
"""WhatsApp's customer-service window and Messenger's standard messaging window."""
CONFIG_CREATOR: Final = "config"
"""``created_by`` of the jobs the YAML ``schedules:`` block holds (kept in step with the file at start)."""
_WINDOW_CHANNELS: Final = frozenset({"whatsapp", "messenger", "instagram"})
_GATEWAY_SENDERS: Final = ("schedule:", "console:", "api:")
_EVENT_SCAN: Final = 500
"""Newest entries of a session's log read for its user's last message (older than that: taken as outside)."""
_GLOBAL = GlobalKeys()

Outcome = Literal["delivered", "duplicate", "skipped"]


class JobExistsError(ValueError):
    """A job with that id exists already."""


class JobLimitError(ValueError):
    """The session holds its most scheduled jobs already."""


@dataclass(frozen=True, slots=True)
class JobView:
    """A stored job with its state, as operators and the agent see it."""

    spec: ScheduleSpec
    session: SessionKey
    next_at: float | None
    """The next occurrence (Unix time); ``None``: it will not run again."""
    last_due: float | None
    last_outcome: str
    """``delivered``, ``duplicate`` (another fire of it was delivered), ``skipped``, or empty (never ran)."""
    last_reason: str
    """Why the last occurrence was skipped (``misfire: ...``, ``window_closed: ...``)."""
    fired: int
    skipped: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-shaped, for the CLI, the console API and the agent's tools."""
        return {
            **self.spec.model_dump(mode="json", exclude_none=True),
            "session": self.session,
            "next_at": self.next_at,
            "last_due": self.last_due,
            "last_outcome": self.last_outcome,
            "last_reason": self.last_reason,
            "fired": self.fired,
            "skipped": self.skipped,
        }


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def _ms(at: float) -> int:
    return round(at * 1000)


def job_session(spec: ScheduleSpec) -> SessionKey:
    """The session a job's occurrences go into."""
    t = spec.target
    return session_key(spec.tenant, t.agent, t.channel, t.account, t.conversation, t.thread)


def _job_keys(spec: ScheduleSpec, session: SessionKey) -> list[str]:
    return [
        _GLOBAL.schedule(spec.id),
        _GLOBAL.schedules_due,
        _GLOBAL.schedules_of_session(session),
        _GLOBAL.schedules_of_tenant(spec.tenant),
    ]


async def create_job(
    redis: aioredis.Redis,
    spec: ScheduleSpec,
    *,
    replace: bool = False,
    per_session: int = 0,
    now: float | None = None,
) -> JobView:
    """Store ``spec`` with its first occurrence (the API every creator calls; ``spec.target.agent`` must be set).

    Args:
        redis: the gateway's Redis.
        spec: the validated job.
        replace: overwrite a job of the same id (its next occurrence is computed again).
        per_session: most jobs the target session may hold (0: no cap).
        now: Unix time the job is created at (default: now).

    Raises:
        JobExistsError: the id is taken and ``replace`` is false.
        JobLimitError: the session holds ``per_session`` jobs already.
        ValueError: the job has no agent, or its one-off time has passed.
    """
    if not spec.target.agent:
        raise ValueError(f"job {spec.id}: name the agent of its conversation (target.agent)")
    created = time.time() if now is None else now
    first = spec.first_at(created)
    if spec.at is not None and first is not None and first < created - spec.grace_s:
        raise ValueError(f"job {spec.id}: 'at' is in the past ({spec.at.isoformat()}); give a future time")
    session = job_session(spec)
    args: list[scripts.ScriptArg] = [
        spec.id,
        spec.model_dump_json(exclude_none=True),
        session,
        spec.tenant,
        "" if first is None else _ms(first),
        _ms(created),
        "1" if replace else "0",
        per_session,
    ]
    stored = await scripts.SCHEDULE_PUT(redis, _job_keys(spec, session), args)
    if stored == 0:
        raise JobExistsError(f"a job with id {spec.id!r} exists already; remove it first or pick another id")
    if stored == -1:
        raise JobLimitError(f"the session holds its most scheduled jobs ({per_session}); cancel one first")
    view = await get_job(redis, spec.id)
    assert view is not None  # just stored
    return view


async def remove_job(redis: aioredis.Redis, job_id: str) -> bool:
    """Delete a job (``False``: there was none)."""
    view = await get_job(redis, job_id)
    if view is None:
        return False
    removed = await scripts.SCHEDULE_REMOVE(redis, _job_keys(view.spec, view.session), [job_id])
    return bool(removed)


def _view(raw: dict[Any, Any]) -> JobView | None:
    fields = {_text(k): _text(v) for k, v in raw.items()}
    if "spec" not in fields:
        return None
    spec = ScheduleSpec.model_validate_json(fields["spec"])
    next_at, last_due = fields.get("next_at", ""), fields.get("last_due", "")
    return JobView(
        spec=spec,
        session=SessionKey(fields.get("session", "")),
        next_at=int(next_at) / 1000 if next_at else None,
        last_due=int(last_due) / 1000 if last_due else None,
        last_outcome=fields.get("last_outcome", ""),
        last_reason=fields.get("last_reason", ""),
        fired=int(fields.get("fired", 0) or 0),
        skipped=int(fields.get("skipped", 0) or 0),
    )


async def get_job(redis: aioredis.Redis, job_id: str) -> JobView | None:
    """One job and its state, or ``None``."""
    return _view(await redis.hgetall(_GLOBAL.schedule(job_id)))


async def list_jobs(
    redis: aioredis.Redis, *, tenant: str | None = None, session: SessionKey | None = None
) -> list[JobView]:
    """The jobs of one session, or of one tenant, or every job (by id)."""
    if session is not None:
        ids = await redis.smembers(_GLOBAL.schedules_of_session(session))
    elif tenant is not None:
        ids = await redis.smembers(_GLOBAL.schedules_of_tenant(tenant))
    else:
        ids = set()
        async for key in redis.scan_iter(match=_GLOBAL.schedule("*"), count=1000):
            ids.add(_text(key).rsplit(":job:", 1)[-1])
    names = sorted(_text(i) for i in ids)
    async with redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.hgetall(_GLOBAL.schedule(name))
        raws = await pipe.execute()
    return [view for raw in raws if (view := _view(raw)) is not None]


async def sync_config_jobs(redis: aioredis.Redis, specs: Iterable[ScheduleSpec], default_agent: str) -> int:
    """Keep Redis in step with the YAML ``schedules:`` block; returns how many jobs were stored or removed.

    A job whose spec is unchanged keeps its next occurrence (a restart neither skips nor repeats one); a changed one
    is stored again; a config job no longer in the file is removed. Every worker runs it at start (the same file
    gives the same result).
    """
    wanted: dict[str, ScheduleSpec] = {}
    for spec in specs:
        target = spec.target if spec.target.agent else spec.target.model_copy(update={"agent": default_agent})
        wanted[spec.id] = spec.model_copy(update={"target": target, "created_by": CONFIG_CREATOR})
    changed = 0
    for view in await list_jobs(redis):
        if view.spec.created_by == CONFIG_CREATOR and view.spec.id not in wanted:
            changed += await remove_job(redis, view.spec.id)
    for spec in wanted.values():
        current = await get_job(redis, spec.id)
        if current is not None and current.spec == spec:
            continue
        if current is not None and current.spec.created_by != CONFIG_CREATOR:
            logger.warning("schedules: config job %s has the id of a job made elsewhere; left that one", spec.id)
            continue
        try:
            await create_job(redis, spec, replace=True)
        except ValueError as err:
            logger.warning("schedules: config job %s not stored: %s", spec.id, err)
            continue
        changed += 1
    return changed


async def last_user_message_at(redis: aioredis.Redis, session: SessionKey) -> float | None:
    """When the session's user last wrote (from its event log), or ``None`` when no such message is in reach."""
    entries = await redis.xrevrange(SessionKeys(session).events, count=_EVENT_SCAN)
    for _, fields in entries or []:
        if fields is None:
            continue
        if _text(fields.get(b"kind", fields.get("kind"))) != "message_received":
            continue
        fact = json.loads(_text(fields.get(b"data", fields.get("data"))) or "{}")
        sender = str(fact.get("sender", ""))
        if sender == "switchboard" or sender.startswith(_GATEWAY_SENDERS):
            continue
        return float(fact.get("at", 0.0))
    return None


@dataclass(frozen=True, slots=True)
class _Claim:
    job_id: str
    due_ms: int
    member: str
    """The in-flight member (``<job id>|<due ms>``); empty for an occurrence skipped at claim time."""
    reason: str
    """Why it is skipped at claim time (empty: it is fired)."""
    spec: ScheduleSpec | None = None
    """The job as the claim read it (``None``: read it again, for an occurrence taken over from another)."""


class Scheduler:
    """Claims and fires due occurrences; one per worker, all of them at once (the claim script serialises them)."""

    def __init__(self, redis: aioredis.Redis, settings: QueueSettings) -> None:
        self.redis = redis
        self.settings = settings
        self.ingestor = Ingestor(redis, settings)
        """No abuse limits: a job's occurrences are the operator's or the agent's, not a sender's."""
        self.behind = False
        """The last tick found a full batch due: more may be waiting, so the loop ticks again at once."""

    async def tick(self) -> int:
        """Claim what is due now and deliver it; returns how many occurrences this scheduler handled."""
        now_ms, due, stale = await scripts.SCHEDULE_DUE(
            self.redis, [_GLOBAL.schedules_due, _GLOBAL.schedules_inflight], [DUE_BATCH]
        )
        self.behind = len(due) >= 2 * DUE_BATCH or len(stale) >= 2 * DUE_BATCH  # (member, score) pairs
        if not due and not stale:
            return 0
        claims = await self._claim(int(now_ms), _pairs(due))
        claims += await self._reclaim(int(now_ms), _pairs(stale))
        slots = asyncio.Semaphore(FIRE_CONCURRENCY)

        async def one(claim: _Claim) -> bool:
            async with slots:
                try:
                    await self.fire(claim)
                except (RedisError, QueueUnavailableError, OSError) as err:  # left in flight: fired again later
                    logger.warning("schedule %s: occurrence not delivered yet (%s)", claim.job_id, type(err).__name__)
                    return False
                return True

        return sum(await asyncio.gather(*(one(claim) for claim in claims)))

    async def _claim(self, now_ms: int, due: list[tuple[str, int]]) -> list[_Claim]:
        if not due:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id, _ in due:
                pipe.hget(_GLOBAL.schedule(job_id), "spec")
            raw_specs = await pipe.execute()
        calls: list[tuple[list[str], list[scripts.ScriptArg]]] = []
        planned: list[_Claim] = []
        now = now_ms / 1000
        for (job_id, due_ms), raw in zip(due, raw_specs, strict=True):
            if raw is None:  # removed between the read and now: the claim script drops nothing it cannot find
                calls.append(([_GLOBAL.schedules_due, _GLOBAL.schedules_inflight, _GLOBAL.schedule(job_id)], []))
                planned.append(_Claim(job_id, due_ms, "", "gone"))
                continue
            spec = ScheduleSpec.model_validate_json(raw)
            due_at = due_ms / 1000
            late = now - due_at
            missed = late > spec.grace_s
            # Catching up: within the grace each occurrence runs; past it, one run (or none) stands for all missed.
            following = next_after(spec, now if missed else due_at)
            reason = ""
            if missed and spec.misfire == "skip":
                reason = f"misfire: found {late:.0f} s late, past its grace of {spec.grace_s} s (misfire: skip)"
            member = "" if reason else f"{job_id}|{due_ms}"
            args: list[scripts.ScriptArg] = [
                job_id,
                due_ms,
                "" if following is None else _ms(following),
                now_ms + INFLIGHT_MS,
                "0" if reason else "1",
                now_ms,
            ]
            calls.append(([_GLOBAL.schedules_due, _GLOBAL.schedules_inflight, _GLOBAL.schedule(job_id)], args))
            planned.append(_Claim(job_id, due_ms, member, reason, spec))
        won: list[_Claim] = []
        runnable = [(c, p) for c, p in zip(calls, planned, strict=True) if p.reason != "gone"]
        gone = [p.job_id for p in planned if p.reason == "gone"]
        if gone:
            await self.redis.zrem(_GLOBAL.schedules_due, *gone)
        results = await scripts.SCHEDULE_CLAIM.many(self.redis, [c for c, _ in runnable])
        for (_, claim), result in zip(runnable, results, strict=True):
            if result == 1:
                won.append(claim)
        return won

    async def _reclaim(self, now_ms: int, stale: list[tuple[str, int]]) -> list[_Claim]:
        calls: list[tuple[list[str], list[scripts.ScriptArg]]] = [
            ([_GLOBAL.schedules_inflight], [member, deadline, now_ms + INFLIGHT_MS]) for member, deadline in stale
        ]
        results = await scripts.SCHEDULE_RECLAIM.many(self.redis, calls)
        claims = []
        for (member, _), result in zip(stale, results, strict=True):
            if result == 1:
                job_id, _, due = member.rpartition("|")
                claims.append(_Claim(job_id, int(due), member, ""))
        return claims

    async def fire(self, claim: _Claim) -> Outcome:
        """Deliver one claimed occurrence into its session (or record why not); returns what became of it."""
        spec = claim.spec
        if spec is None:
            view = await get_job(self.redis, claim.job_id)
            if view is None:  # removed while in flight
                if claim.member:
                    await self.redis.zrem(_GLOBAL.schedules_inflight, claim.member)
                return "skipped"
            spec = view.spec
        session, due_at = job_session(spec), claim.due_ms / 1000
        if claim.reason:
            await self._skip(spec, session, claim, "misfire", claim.reason)
            return "skipped"
        conversation = await session_conversation(self.redis, session)
        if conversation is None:
            await self._skip(spec, session, claim, "window_closed", f"{session} is not a session of a known channel")
            return "skipped"
        conversation, closed = await self._window(spec, session, conversation)
        if closed:
            await self._skip(spec, session, claim, "window_closed", closed)
            return "skipped"
        message = InboundMessage(
            dedup_key=occurrence_key(spec.id, due_at),
            conversation=conversation,
            sender=Sender(id=f"schedule:{spec.id}", name=spec.id),
            text=spec.text,
            event=Scheduled(job_id=spec.id, action=spec.action, due_at=due_at),
            meta={ROLE_META: spec.role} if spec.role is not None else {},
        )
        result = await self.ingestor.ingest(message)
        outcome: Outcome = "duplicate" if result.duplicate else "delivered"
        await self._done(claim, outcome, "", result.message_id)
        return outcome

    async def _window(
        self, spec: ScheduleSpec, session: SessionKey, conversation: ConversationRef
    ) -> tuple[ConversationRef, str]:
        """The conversation to deliver into, and why not (empty: deliver) under the platform's messaging window."""
        channel = conversation.channel
        if channel not in _WINDOW_CHANNELS:
            return conversation, ""
        last = await last_user_message_at(self.redis, session)
        if last is not None and time.time() - last < SESSION_WINDOW_S:
            return conversation, ""
        since = "the user never wrote" if last is None else f"the user last wrote {time.time() - last:.0f} s ago"
        if channel == "whatsapp":
            if spec.template is None:
                return conversation, (
                    f"outside WhatsApp's 24-hour window ({since}); give the job an approved template "
                    "(template: {name, language}) to reach the user"
                )
            extra = {**conversation.extra, "window_template": spec.template.spelled()}
            return conversation.model_copy(update={"extra": extra}), ""
        return conversation, (
            f"outside {channel}'s 24-hour messaging window ({since}); scheduled jobs send no message tags, so the "
            "occurrence was not delivered"
        )

    async def _skip(
        self,
        spec: ScheduleSpec,
        session: SessionKey,
        claim: _Claim,
        reason: Literal["misfire", "window_closed"],
        detail: str,
    ) -> None:
        fact = ScheduleSkipped(job_id=spec.id, due_at=claim.due_ms / 1000, reason=reason, detail=detail)
        await self.redis.xadd(
            SessionKeys(session).events,
            {"kind": fact.kind, "data": EventAdapter.dump_json(fact)},
            maxlen=self.settings.events_maxlen,
            approximate=True,
        )
        await self._done(claim, "skipped", f"{reason}: {detail}" if reason == "window_closed" else detail, "")
        logger.info("schedule %s: occurrence %d skipped (%s)", spec.id, claim.due_ms, reason)

    async def _done(self, claim: _Claim, outcome: Outcome, reason: str, message_id: str) -> None:
        now_ms = int(time.time() * 1000)
        await scripts.SCHEDULE_DONE(
            self.redis,
            [_GLOBAL.schedules_inflight, _GLOBAL.schedule(claim.job_id)],
            [claim.member, claim.due_ms, outcome, reason, now_ms, message_id],
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Tick every ``schedule_poll_s`` until ``stop`` is set (each worker runs one)."""
        while not stop.is_set():
            try:
                await self.tick()
            except (RedisError, QueueUnavailableError, OSError) as err:
                self.behind = False  # Redis is away: wait a poll interval before asking again
                logger.warning("scheduler tick failed: %s", type(err).__name__)
            except Exception:
                self.behind = False
                logger.exception("scheduler tick crashed; retrying next interval")
            if self.behind:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.schedule_poll_s)


def _pairs(flat: list[Any]) -> list[tuple[str, int]]:
    """``[member, score, member, score, ...]`` (a script's ``WITHSCORES`` reply) as pairs."""
    return [(_text(flat[i]), int(float(_text(flat[i + 1])))) for i in range(0, len(flat), 2)]


async def run_now(redis: aioredis.Redis, settings: QueueSettings, job_id: str) -> Outcome:
    """Fire one extra occurrence of a job now (its schedule is unchanged).

    Raises:
        KeyError: no such job.
    """
    if await get_job(redis, job_id) is None:
        raise KeyError(job_id)
    seconds, micros = await redis.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    member = f"{job_id}|{now_ms}"
    await redis.zadd(_GLOBAL.schedules_inflight, {member: now_ms + INFLIGHT_MS})
    return await Scheduler(redis, settings).fire(_Claim(job_id, now_ms, member, ""))
