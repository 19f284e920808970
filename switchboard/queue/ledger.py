"""What a drain records for one session under one lease: every step is one fenced Lua script.

``begin``, ``fail``, ``complete``, ``dead_letter``, ``facts``, ``steer`` and ``interrupt`` each first check that the
lease still belongs to this epoch, and ``begin`` on an empty inbox ends the drain in the same step (lease, drain flag
and runnable mark removed), so nothing is ever stranded.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis.asyncio as aioredis

from switchboard.channels.base import Receipt
from switchboard.core.approvals.records import ApprovalRecord, SessionControl
from switchboard.core.events import (
    Event,
    ReplySent,
    RunCancelled,
    RunCompleted,
    RunDeadLettered,
    RunDeferred,
    RunFailed,
    SendDeadLettered,
    UsageMetered,
)
from switchboard.core.inbound import history_text, is_reset
from switchboard.core.messages import ExternalEvent, InboundMessage, OperatorActed, Scheduled
from switchboard.core.turn import HistoryEntry
from switchboard.queue import scripts
from switchboard.queue.approvals import ApprovalsDelegate, RedisApprovals
from switchboard.queue.cancellation import STOP_COMMANDS
from switchboard.queue.eventlog import encode_event
from switchboard.queue.jobs import DrainJobs, StartedJob, entry, new_job_id
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import LeaseToken
from switchboard.queue.sealed import seal_dead_messages
from switchboard.queue.stats import QUEUE_WAIT_BUCKETS, RUN_DURATION_BUCKETS, bucket_field
from switchboard.queue.store import RedisSessionStore, parse_history, stored_history
from switchboard.settings import QueueSettings
from switchboard.types import BusyPolicy, SessionKey

__all__ = [
    "DEAD_LETTER_CAP",
    "MAX_COLLECT",
    "MAX_INTERRUPTS",
    "SHARD_DEAD_LETTER_CAP",
    "Attempt",
    "AttemptStore",
    "Ledger",
    "encode_facts",
]

MAX_COLLECT: Final = 50
"""Most waiting messages folded into one turn under the ``collect``, ``interrupt`` and ``steer`` policies."""
MAX_INTERRUPTS: Final = 3
"""Times a turn restarts for newer messages (``interrupt`` policy) before it runs to the end regardless."""
_POLICIES: Final[dict[str, BusyPolicy]] = {
    "sequential": "sequential",
    "collect": "collect",
    "interrupt": "interrupt",
    "steer": "steer",
}
DEAD_LETTER_CAP: Final = 100
"""Dead-letter records kept per session."""
SHARD_DEAD_LETTER_CAP: Final = 64
"""Length of each shard's stream of dead letters for operators (trimmed exactly: at most 65,536 over the 1,024 shards;
a session keeps its own last :data:`DEAD_LETTER_CAP` besides)."""
"""Not in :data:`scripts.ALL` (loaded on its first ``NOSCRIPT``)."""


def encode_facts(events: Sequence[Event], segments: Sequence[tuple[str, str, bool]] = ()) -> str:
    """Held events as ``facts.lua`` and ``outbox_claim.lua`` read them.

    Each event becomes ``[kind, data]``; the ``usage_metered`` ones are also summed as ``usage`` (added to
    the deployment-wide totals). ``segments`` are increments of the segmented metrics
    (:meth:`~switchboard.queue.segments.TurnTally.increments`), written in the same step.
    """
    facts: dict[str, Any] = {"events": [[event.kind, encode_event(event)] for event in events]}
    if segments:
        facts["segments"] = [[name, amount, 1 if is_float else 0] for name, amount, is_float in segments]
    metered = [event for event in events if isinstance(event, UsageMetered)]
    if metered:
        facts["usage"] = [
            repr(float(sum(m.credits for m in metered))),
            str(sum(int(m.input_tokens) for m in metered)),
            str(sum(int(m.output_tokens) for m in metered)),
        ]
    return json.dumps(facts, separators=(",", ":"))


def _conversation_of(messages: Sequence[InboundMessage]) -> str:
    """The conversation of the last message a channel delivered (JSON), or ``""`` (an operator's own messages)."""
    for message in reversed(messages):
        if not isinstance(
            message.event, OperatorActed | ExternalEvent | Scheduled
        ):  # built by the API: no platform routing data
            return message.conversation.model_dump_json()
    return ""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt at the inbox head, as ``begin`` counted it."""

    attempt: int
    """Attempts started for the head message, this one included."""
    dead: bool
    """Past ``max_attempts``: dead-letter it instead of running."""
    last_error: str
    ids: list[str]
    """The message ids the turn handles (one, or everything waiting under a policy other than ``sequential``)."""
    bodies: list[str]
    """Their stored JSON (empty when a record is missing)."""
    policy: BusyPolicy = "sequential"
    """The session's busy policy as ``begin`` read it."""
    interrupts: int = 0
    """How often the head's turn was interrupted by newer messages so far."""
    took: int = 0
    """Inbox entries the head's last run took in all, steered messages included (0 when it steered none)."""
    history: list[bytes] | None = None
    """The session's last history entries (JSON) as ``begin`` read them, when it did (a run, not a dead letter)."""
    slots: dict[str, bytes] | None = None
    """The session-state slots (JSON values) as ``begin`` read them, when it did."""
    history_read: int = 0
    """How many history entries ``begin`` asked for (fewer came back when the history is shorter)."""
    idle_ttl: str = ""
    """The session's idle TTL as ``begin`` read it (``""``: none; see ``_retention.lua``)."""
    control: bytes | None = None
    """The operator control record as ``begin`` read it (``b""``: none), when it read the history."""
    approvals_pending: int = 0
    """The session's pending approvals as ``begin`` counted them, when it read the history."""


class Start(enum.Enum):
    """How a drain's first :meth:`Ledger.take` ended when it started no attempt."""

    BUSY = "busy"
    """Another worker holds the session's lease (it drains the session)."""
    EMPTY = "empty"
    """The inbox was empty: the drain ended in the same step, without taking the lease."""


@dataclass(frozen=True, slots=True)
class Taken:
    """A drain's first step: the lease taken and an attempt started, in one round trip."""

    ledger: Ledger
    attempt: Attempt


class Ledger:
    """Fenced records of one drain.

    With ``job``, the drain job is closed by whichever step releases the drain (its begin or its last complete).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        lease: LeaseToken,
        settings: QueueSettings,
        *,
        worker_id: str,
        job: StartedJob | None = None,
        jobs: DrainJobs | None = None,
    ) -> None:
        self.redis = redis
        self.lease = lease
        self.settings = settings
        self.worker_id = worker_id
        self.keys = SessionKeys(lease.session)
        self.job = job
        self.jobs = jobs if jobs is not None else DrainJobs()
        self.released = False
        """Set when a step ended the drain (lease released, drain job closed)."""
        self.yielded = False
        """Set when a completion gave the slot up to waiting sessions (a new drain job queued, this one closed)."""
        self.next_attempt: Attempt | None = None
        """The attempt a completion started at the next inbox head (:meth:`complete`'s ``next_history``)."""

    @classmethod
    async def take(
        cls,
        redis: aioredis.Redis,
        session: SessionKey,
        settings: QueueSettings,
        *,
        worker_id: str,
        job: StartedJob | None = None,
        jobs: DrainJobs | None = None,
        read_history: int = 0,
    ) -> Taken | Start:
        """Take the session's lease and start an attempt at its inbox head, in one step (see :meth:`begin`)."""
        unheld = LeaseToken(session=session, epoch=0, token="")
        reply = await _begin(redis, unheld, settings, worker_id, job, read_history=read_history, taking=True)
        if not reply:
            return Start.EMPTY
        if int(reply[0]) == 0:
            return Start.BUSY
        epoch = int(reply[6])
        lease = LeaseToken(session=session, epoch=epoch, token=f"{epoch}:{worker_id}")
        ledger = cls(redis, lease, settings, worker_id=worker_id, job=job, jobs=jobs)
        return Taken(ledger, _attempt(reply, read_history))

    async def _run(self, script: scripts.Script, keys: list[str], args: list[scripts.ScriptArg]) -> Any:
        return await script(
            self.redis,
            [self.keys.lease, self.keys.fenced_rejections, *keys],
            [self.lease.token, *args],
            session=self.lease.session,
            epoch=self.lease.epoch,
        )

    async def begin(self, *, read_history: int = 0) -> Attempt | None:
        """Count an attempt at the inbox head and log ``run_started``.

        With ``read_history``, an attempt that runs also carries that many of the last history entries and
        the slots (read in the same step; only this lease's holder writes them).

        Returns ``None`` when the inbox is empty, in which case the drain has been released in the same
        atomic step (lease, drain flag and runnable mark removed, the drain job closed).
        """
        reply = await _begin(
            self.redis, self.lease, self.settings, self.worker_id, self.job, read_history=read_history, taking=False
        )
        if not reply:
            self.released = True
            return None
        return _attempt(reply, read_history)

    async def steer(self, head: str, taken: int) -> tuple[list[str], list[str]]:
        """The ids and stored JSON of the messages behind the ``taken`` inbox entries the running turn has.

        Plain messages only, up to the first that is not (a command, a stop, a click, an edit, a deletion, a message
        with attachments): that one waits for the next turn, with what is behind it. They stay in the inbox (the
        turn's ``complete`` acks them with the rest); the head's ``took`` count is raised, so a reply resumed after a
        crash acks what this run answered. At most :data:`MAX_COLLECT` in all.
        """
        k = self.keys
        stops = json.dumps(sorted(STOP_COMMANDS))
        reply = await self._run(scripts.STEER, [k.inbox, k.messages, k.attempts], [head, taken, MAX_COLLECT, stops])
        n = int(reply[0])
        return [v.decode() for v in reply[1 : 1 + n]], [v.decode() for v in reply[1 + n : 1 + 2 * n]]

    async def interrupt(self, attempt: Attempt, *, reason: str, outbox_keys: Sequence[str]) -> int:
        """End a turn a newer message interrupted: logged ``run_cancelled``, nothing acked, the attempt handed back.

        Returns the head's interrupts so far (the next turn, which restarts with everything waiting, reads it too).
        """
        event = RunCancelled(message_id=attempt.ids[0], reason=reason)
        n = await self._run(
            scripts.INTERRUPT,
            [self.keys.attempts, self.keys.events, self.keys.outbox],
            [attempt.ids[0], encode_event(event), self.settings.events_maxlen, json.dumps(list(outbox_keys))],
        )
        return int(n)

    async def fail(self, attempt: Attempt, error: str, *, segment: str = "") -> None:
        """Log ``run_failed`` and remember the error (the dead letter's reason if it keeps failing).

        ``segment``: the stats field counting the agent's failed runs (:func:`~switchboard.queue.segments.run_field`).
        """
        event = RunFailed(message_id=attempt.ids[0], attempt=attempt.attempt, error=error)
        await self._run(
            scripts.FAIL,
            [self.keys.attempts, self.keys.events, self.keys.shard.stats],
            [attempt.ids[0], error, encode_event(event), self.settings.events_maxlen, segment],
        )

    async def defer(self, attempt: Attempt, *, until: float, reason: str, max_deferrals: int) -> int:
        """Put the inbox head off until ``until``; returns its deferrals so far (the drain then gives the lease up).

        The attempt is handed back (a provider asking to wait is not the message failing); the session goes
        into its shard's :attr:`ShardKeys.deferred`, which the reaper reads before giving it a new drain job. Returns 0,
        changing nothing, when the head was already deferred ``max_deferrals`` times.
        """
        event = RunDeferred(message_id=attempt.ids[0], until=until, reason=reason)
        n = await self._run(
            scripts.DEFER,
            [self.keys.attempts, self.keys.events, self.keys.shard.deferred, self.keys.shard.stats, self.keys.meta],
            [
                attempt.ids[0],
                reason,
                encode_event(event),
                self.settings.events_maxlen,
                f"{until:.3f}",
                self.lease.session,
                max_deferrals,
            ],
        )
        return int(n)

    async def facts(self, events: Sequence[Event], segments: Sequence[tuple[str, str, bool]] = ()) -> None:
        """Write held events and the turn's segmented metrics in one step.

        A ``usage_metered`` event also adds to the deployment-wide totals.
        """
        if events:
            facts = encode_facts(events, segments)
            await self._run(
                scripts.FACTS, [self.keys.events, self.keys.shard.stats], [self.settings.events_maxlen, facts]
            )

    async def dead_letter(self, attempt: Attempt, *, reason: str, attempts: int, outbox_keys: Sequence[str]) -> int:
        """Set the attempt's messages aside with ``reason`` and ack them; returns the inbox length left."""
        k = self.keys
        now = time.time()
        record = {
            "session": self.lease.session,
            "message_ids": attempt.ids,
            "attempts": attempts,
            "reason": reason,
            "at": now,
            "messages": seal_dead_messages([json.loads(body) for body in attempt.bodies if body], self.lease.session),
        }
        event = RunDeadLettered(at=now, message_id=attempt.ids[0], attempts=attempts, reason=reason)
        remaining = await self._run(
            scripts.DEAD_LETTER,
            [k.inbox, k.messages, k.attempts, k.events, k.dead, k.shard.dead_letters, k.outbox, k.shard.stats, k.meta],
            [
                json.dumps(attempt.ids),
                json.dumps(record, separators=(",", ":")),
                json.dumps([encode_event(event)]),
                self.settings.events_maxlen,
                json.dumps(list(outbox_keys)),
                DEAD_LETTER_CAP,
                SHARD_DEAD_LETTER_CAP,
                int(now * 1000),
            ],
        )
        return int(remaining)

    async def complete(
        self,
        attempt: Attempt,
        messages: Sequence[InboundMessage],
        *,
        reply_text: str,
        reply_to: str | None,
        receipt: Receipt | None,
        started: float,
        outbox_keys: Sequence[str],
        cancelled: str | None = None,
        undelivered: SendDeadLettered | None = None,
        work: Sequence[HistoryEntry] = (),
        release: bool = False,
        yield_slot: bool = False,
        yield_elsewhere: bool = False,
        next_history: int = 0,
        segment: str = "",
    ) -> int:
        """Ack the handled messages, append history and facts, record latencies; returns the inbox length left.

        ``work`` (the turn's tool calls and results, :attr:`TurnResult.history`) goes into the history between
        the user's messages and the answer, so the next turn's context is built from it.

        With ``cancelled`` (the reason a stop was asked) the turn is recorded as ``run_cancelled``. With
        ``undelivered`` the reply was written but its send was dead-lettered: that fact replaces ``reply_sent``.
        ``segment``: with ``cancelled``, the stats field counting the agent's cancelled runs
        (:func:`~switchboard.queue.segments.run_field`).
        With ``release``, an inbox left empty ends the drain in the same step (:attr:`released`); with
        ``yield_slot``, one that is not gives the slot up when other drains wait in the session's shard, or with
        ``yield_elsewhere`` in any case (the worker has other shards' drains waiting) (:attr:`yielded`, see
        :meth:`DrainJobs.yield_slot`). With ``next_history``, an inbox that is not left empty (and no yield) gets its
        next attempt started in the same step, reading that many history entries (:attr:`next_attempt`, as
        :meth:`begin` would return it).
        """
        k = self.keys
        now = time.time()
        resets = [i for i, m in enumerate(messages) if is_reset(m)]  # /reset: what came before it is forgotten
        kept = messages[resets[-1] + 1 :] if resets else messages
        entries = [  # an operator's action is no user's words: what it said to the user is the answer below
            HistoryEntry(role="user", text=history_text(m), message_id=m.id, at=m.received_at)
            for m in kept
            if not isinstance(m.event, OperatorActed)
        ]
        entries += work
        answer = reply_text if cancelled is None else f"(stopped before answering: {cancelled})"
        if kept and answer.strip():  # a deletion gets no answer; a bare /reset leaves the history empty
            entries.append(HistoryEntry(role="assistant", text=answer, message_id=reply_to, at=now))
        history = stored_history(entries, self.lease.session)
        events: list[str] = []
        if undelivered is not None:
            events.append(encode_event(undelivered))
        elif receipt is not None:
            sent = ReplySent(at=now, message_id=reply_to, chars=len(reply_text), parts=receipt.parts)
            events.append(encode_event(sent))
        done: RunCompleted | RunCancelled = (
            RunCompleted(at=now, message_id=attempt.ids[0], duration_ms=(now - started) * 1000)
            if cancelled is None
            else RunCancelled(at=now, message_id=attempt.ids[0], reason=cancelled)
        )
        events.append(encode_event(done))
        wait = max(started - messages[0].received_at, 0.0)
        run = max(now - started, 0.0)
        shard = k.shard
        next_job = new_job_id(now) if yield_slot else ""
        reply = await self._run(
            scripts.COMPLETE,
            [
                k.inbox,
                k.messages,
                k.attempts,
                k.history,
                k.events,
                k.outbox,
                k.meta,
                k.shard.stats,
                k.shard.histogram("queue_wait"),
                k.shard.histogram("run"),
                k.drain,
                k.shard.runnable,
                k.slots,
                k.epoch,
                k.dead,
                k.web,
                shard.wip,
                shard.drainq,
                k.control,
                k.approvals,
            ],
            [
                json.dumps(attempt.ids),
                json.dumps(history),
                self.settings.history_maxlen,
                json.dumps(events),
                self.settings.events_maxlen,
                json.dumps(list(outbox_keys)),
                bucket_field(wait, QUEUE_WAIT_BUCKETS),
                f"{wait:.6f}",
                bucket_field(run, RUN_DURATION_BUCKETS),
                f"{run:.6f}",
                int(now * 1000),
                "1" if undelivered is not None else "0",
                _conversation_of(messages),
                "1" if release else "",
                self.lease.session,
                attempt.idle_ttl,
                self.job.entry if self.job is not None else "",
                ("2" if yield_elsewhere else "1") if yield_slot else "",
                next_job,
                entry(self.lease.session, next_job) if yield_slot else "",
                shard.ready,
                next_history if next_history > 0 else "",
                MAX_COLLECT,
                self.settings.max_attempts,
                self.lease.epoch,
                self.worker_id,
                f"{now:.3f}",
                segment if cancelled is not None else "",
            ],
        )
        left, ended = int(reply[0]), int(reply[1])
        self.released, self.yielded = ended == 1, ended == 2
        self.next_attempt = _attempt(reply[2], next_history) if ended == 3 else None
        return left


async def _begin(
    redis: aioredis.Redis,
    lease: LeaseToken,
    settings: QueueSettings,
    worker_id: str,
    job: StartedJob | None,
    *,
    read_history: int,
    taking: bool,
) -> Any:
    """Run ``begin.lua`` (taking the lease first when ``taking``); its raw reply."""
    k = SessionKeys(lease.session)
    return await scripts.BEGIN(
        redis,
        [
            k.lease,
            k.fenced_rejections,
            k.inbox,
            k.messages,
            k.attempts,
            k.meta,
            k.events,
            k.drain,
            k.shard.runnable,
            k.history,
            k.slots,
            k.epoch,
            k.outbox,
            k.dead,
            k.web,
            k.control,
            k.approvals,
            k.shard.wip,
        ],
        [
            lease.token,
            MAX_COLLECT,
            settings.max_attempts,
            settings.events_maxlen,
            lease.epoch,
            worker_id,
            f"{time.time():.3f}",
            lease.session,
            read_history if read_history > 0 else "",
            "1" if taking else "",
            settings.lease_ms,
            job.entry if job is not None else "",
        ],
        session=lease.session,
        epoch=lease.epoch,
    )


def _attempt(reply: Any, read_history: int) -> Attempt:
    """The attempt ``begin.lua`` started, from its reply (see the script for the layout)."""
    n = int(reply[8])
    ids = [v.decode() for v in reply[9 : 9 + n]]
    bodies = [v.decode() for v in reply[9 + n : 9 + 2 * n]]
    attempt = Attempt(
        int(reply[0]),
        bool(int(reply[1])),
        reply[2].decode(),
        ids,
        bodies,
        policy=_POLICIES.get(reply[3].decode(), "sequential"),
        interrupts=int(reply[4]),
        took=int(reply[5]),
        idle_ttl=reply[7].decode(),
    )
    rest = reply[9 + 2 * n :]
    if len(rest) < 4:
        return attempt
    flat = rest[1]
    slots = {flat[i].decode(): flat[i + 1] for i in range(0, len(flat) - 1, 2)}
    return dataclasses.replace(
        attempt,
        history=list(rest[0]),
        slots=slots,
        history_read=read_history,
        control=rest[2],
        approvals_pending=int(rest[3]),
    )


class AttemptStore(ApprovalsDelegate, RedisSessionStore):
    """The turn's :class:`RedisSessionStore`, answering its first history and slot reads from what ``begin`` read.

    ``begin`` read them under the same lease, and only the lease's holder writes them, so they are current; a
    later read, a read of more entries than ``begin`` took, or any read after a write goes to Redis as usual.
    It is also the session's :class:`~switchboard.core.approvals.records.ApprovalStore`
    (:mod:`switchboard.queue.approvals`),
    fenced by the same lease.
    """

    def __init__(self, redis: aioredis.Redis, lease: LeaseToken, settings: QueueSettings, attempt: Attempt) -> None:
        super().__init__(redis, lease.session, lease.epoch, settings, token=lease.token)
        self.approvals = RedisApprovals(redis, lease.session, lease.token, lease.epoch)
        self._history, self._read, self._slots = attempt.history, attempt.history_read, attempt.slots
        self._control = attempt.control
        self._no_approvals = attempt.control is not None and not attempt.approvals_pending

    async def load_history(self, limit: int) -> list[HistoryEntry]:
        """The most recent ``limit`` entries, oldest first."""
        raw, self._history = self._history, None
        if raw is None or (limit > self._read and len(raw) >= self._read):
            return await super().load_history(limit)
        return parse_history(raw[-limit:], self.session) if limit > 0 else []

    async def load_slots(self) -> dict[str, Any]:
        """The session-state slots (``plan``, ``context``, ``state``)."""
        raw, self._slots = self._slots, None
        if raw is None:
            return await super().load_slots()
        return {name: json.loads(value) for name, value in raw.items()}

    async def append_history(self, entries: Sequence[HistoryEntry]) -> None:
        """Append entries, keeping the last ``history_maxlen``."""
        self._history = None
        await super().append_history(entries)

    async def save_slot(self, name: str, value: Any) -> None:
        """Overwrite one slot (JSON-serialisable value)."""
        self._slots = None
        await super().save_slot(name, value)

    async def reset_conversation(self) -> None:
        """Forget the conversation: history and slots (``/reset``)."""
        self._history = self._slots = None
        await super().reset_conversation()

    async def control(self) -> SessionControl | None:
        """The operator holding the conversation, if one took it over (first read: as ``begin`` read it)."""
        raw, self._control = self._control, None
        if raw is None:
            return await super().control()
        return SessionControl.model_validate_json(raw) if raw else None

    async def set_control(self, control: SessionControl | None) -> None:
        """Take the conversation over (``control``) or hand it back (``None``)."""
        self._control = None
        await super().set_control(control)

    async def approval_pending(self) -> list[ApprovalRecord]:
        """This session's ``pending`` records, oldest first (none, without asking, when ``begin`` counted none)."""
        none, self._no_approvals = self._no_approvals, False
        return [] if none else await super().approval_pending()

    async def approval_open(self, record: ApprovalRecord) -> None:
        """Persist a new ``pending`` record."""
        self._no_approvals = False
        await super().approval_open(record)
