"""``SessionStore`` on Redis: history, session-state slots and effect records, every write fenced by the lease epoch."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import redis.asyncio as aioredis
from pydantic import Json, TypeAdapter, ValidationError

from switchboard.core.schedules import ScheduleSpec
from switchboard.core.sealing import SEALED_PREFIX
from switchboard.core.tools.builtin.handoff import ConversationHandoff, HandoffDone
from switchboard.core.tools.effects import EffectRecord
from switchboard.core.turn import HistoryEntry
from switchboard.queue import scripts
from switchboard.queue.effects import RedisEffects
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.lease import LeaseToken
from switchboard.queue.operators import session_conversation
from switchboard.queue.schedules import JobExistsError, create_job, get_job, list_jobs, remove_job
from switchboard.queue.sealed import history_context, open_stored, seal_stored
from switchboard.settings import QueueSettings
from switchboard.types import SessionKey

__all__ = ["RedisSessionStore", "load_history", "parse_history", "stored_history"]

_GLOBAL = GlobalKeys()
_HISTORY: TypeAdapter[list[HistoryEntry]] = TypeAdapter(list[Json[HistoryEntry]])


SEALED = SEALED_PREFIX.encode()
_PARSED: dict[bytes, HistoryEntry] = {}
"""Stored entry → the entry it parsed to: a session's history is read again every turn, mostly unchanged."""
_PARSED_MAX = 4096


def parse_history(raw: Sequence[bytes | str], session: str) -> list[HistoryEntry]:
    """Stored history entries of ``session`` (one JSON document each, or sealed); those not parsed before, in one call.

    Each entry is parsed on its own (not joined into one array), so a corrupt one that holds several values is
    refused rather than read as several entries. Entries are immutable and their stored form names the message they
    hold, so one parsed before is that same entry.

    Raises:
        SealError: an entry is sealed and no key of ``SWITCHBOARD_DATA_KEYS`` opens it.
    """
    stored = [r if isinstance(r, bytes) else r.encode() for r in raw]
    missing = [r for r in stored if r not in _PARSED]
    if missing:
        context = history_context(session)
        opened = [open_stored(r, context).encode() if r.startswith(SEALED) else r for r in missing]
        parsed = _HISTORY.validate_python(opened)
        if len(_PARSED) + len(missing) > _PARSED_MAX:
            _PARSED.clear()
        _PARSED.update(zip(missing, parsed, strict=True))
        if len(missing) == len(stored):
            return parsed
    return [_PARSED[r] for r in stored]


async def load_history(redis: aioredis.Redis, session: SessionKey, limit: int) -> list[HistoryEntry]:
    """The most recent ``limit`` history entries of a session, oldest first (no lease needed to read)."""
    if limit <= 0:
        return []
    return parse_history(await redis.lrange(SessionKeys(session).history, -limit, -1), session)


def stored_history(entries: Sequence[HistoryEntry], session: str) -> list[str]:
    """How ``entries`` are stored in ``session``'s history: their JSON, sealed when sealing is on."""
    context = history_context(session)
    return [seal_stored(entry.model_dump_json(), context) for entry in entries]


class RedisSessionStore:
    """Per-session storage for one turn, bound to the lease epoch the drain holds.

    Implements :class:`switchboard.core.turn.SessionStore` and :class:`switchboard.core.tools.effects.EffectStore`.
    Reads are plain; writes run as Lua scripts that
    first compare the lease with this store's token and raise
    :class:`~switchboard.errors.FencedWriteError` when the epoch has passed.
    """

    def __init__(
        self, redis: aioredis.Redis, session: SessionKey, epoch: int, settings: QueueSettings, *, token: str = ""
    ) -> None:
        self.redis = redis
        self.session = session
        self.epoch = epoch
        self.settings = settings
        self.token = token or f"{epoch}:"
        self._keys = SessionKeys(session)
        self._effects = RedisEffects(redis, session, self.token, epoch)
        self.handoff: ConversationHandoff | None = None
        """Hands the conversation to another agent (set by the drain when some agent may; ``None``: none may)."""

    @classmethod
    def for_lease(cls, redis: aioredis.Redis, lease: LeaseToken, settings: QueueSettings) -> RedisSessionStore:
        """A store bound to ``lease``."""
        return cls(redis, lease.session, lease.epoch, settings, token=lease.token)

    async def load_history(self, limit: int) -> list[HistoryEntry]:
        """The most recent ``limit`` entries, oldest first."""
        return await load_history(self.redis, self.session, limit)

    async def append_history(self, entries: Sequence[HistoryEntry]) -> None:
        """Append entries, keeping the last ``history_maxlen``."""
        if not entries:
            return
        args: list[str | int] = [self.token, self.settings.history_maxlen]
        args += stored_history(entries, self.session)
        await scripts.HISTORY_APPEND(
            self.redis,
            [self._keys.lease, self._keys.fenced_rejections, self._keys.history],
            args,
            session=self.session,
            epoch=self.epoch,
        )

    async def load_slots(self) -> dict[str, Any]:
        """The session-state slots (``plan``, ``context``, ``state``) and their ``untrusted`` marks (one field each)."""
        raw = await self.redis.hgetall(self._keys.slots)
        return {(k.decode() if isinstance(k, bytes) else k): json.loads(v) for k, v in raw.items()}

    async def save_slot(self, name: str, value: Any) -> None:
        """Overwrite one slot (JSON-serialisable value)."""
        await scripts.SLOT_SAVE(
            self.redis,
            [self._keys.lease, self._keys.fenced_rejections, self._keys.slots, self._keys.meta],
            [self.token, name, json.dumps(value, separators=(",", ":"), default=str)],
            session=self.session,
            epoch=self.epoch,
        )

    async def reset_conversation(self) -> None:
        """Forget the conversation (``/reset``): delete its history, session-state slots and recorded offers, fenced."""
        await scripts.SESSION_RESET(
            self.redis,
            [self._keys.lease, self._keys.fenced_rejections, self._keys.history, self._keys.slots, self._keys.offers],
            [self.token],
            session=self.session,
            epoch=self.epoch,
        )

    async def effect_begin(self, key: str, record: EffectRecord) -> EffectRecord | None:
        """Claim a write effect's idempotency key; returns the record already under it, if any."""
        return await self._effects.effect_begin(key, record)

    async def effect_finish(self, key: str, record: EffectRecord | None) -> None:
        """Record a write effect's outcome, or release its claim (``None``) after a failure."""
        await self._effects.effect_finish(key, record)

    async def effect_doubt(self, key: str, record: EffectRecord, info: Mapping[str, Any]) -> None:
        """Route an effect in doubt (``started``, no result) to reconciliation (never re-executed automatically)."""
        await self._effects.effect_doubt(key, record, info)

    async def hand_off(self, from_agent: str, to: str, reason: str, note: str) -> HandoffDone:
        """Hand the conversation to agent ``to`` (the ``handoff`` tool's backend, :mod:`switchboard.queue.handoffs`).

        Raises:
            ValueError: no agent may hand over here, or ``from_agent`` may not hand to ``to``.
        """
        if self.handoff is None:
            raise ValueError("this agent may not hand conversations over (it has no handoff block)")
        return await self.handoff.hand_off(from_agent, to, reason, note)

    async def schedule_add(
        self,
        action: Literal["turn", "message"],
        text: str,
        *,
        at: dt.datetime | None,
        cron: str | None,
        timezone: str,
        key: str,
        role: Literal["guest", "user"] = "user",
    ) -> dict[str, Any]:
        """Make a job into this session (the ``schedule_*`` tools' backend); ``key`` names it, so a retry is no second.

        Its turns act with ``role``, the role of the turn that made it.

        Raises:
            ValueError: the job is invalid, its time has passed, or the session holds its most jobs.
        """
        conversation = await session_conversation(self.redis, self.session)
        if conversation is None:
            raise ValueError("this conversation cannot be reached later (not a session of a known channel)")
        job_id = "agent-" + hashlib.sha256(key.encode()).hexdigest()[:16]
        try:
            spec = ScheduleSpec.model_validate(
                {
                    "id": job_id,
                    "tenant": conversation.tenant,
                    "target": {
                        "channel": conversation.channel,
                        "account": conversation.account,
                        "conversation": conversation.conversation,
                        "agent": conversation.agent,
                        "thread": conversation.thread,
                    },
                    "action": action,
                    "text": text,
                    "at": at,
                    "cron": cron,
                    "timezone": timezone,
                    "created_by": f"agent:{self.session}",
                    "role": role,
                }
            )
        except ValidationError as err:
            raise ValueError("; ".join(str(e["msg"]) for e in err.errors())) from None
        try:
            view = await create_job(self.redis, spec, per_session=self.settings.schedules_per_session)
        except JobExistsError:  # this call's retry: the job it made
            existing = await get_job(self.redis, job_id)
            if existing is None or existing.session != self.session:
                raise
            view = existing
        return view.as_dict()

    async def schedule_list(self) -> list[dict[str, Any]]:
        """This session's jobs (the ``list_schedules`` tool's backend)."""
        return [view.as_dict() for view in await list_jobs(self.redis, session=self.session)]

    async def schedule_cancel(self, job_id: str) -> bool:
        """Remove one of this session's jobs (``False``: it has no such job; another session's is not its)."""
        view = await get_job(self.redis, job_id)
        if view is None or view.session != self.session:
            return False
        return await remove_job(self.redis, job_id)

    async def search(self, query: str, limit: int) -> list[dict[str, Any]]:
        """Search the conversation history and the event log (the ``search_history`` tool's backend).

        Every word of ``query`` must appear (case-insensitive); most recent first, at most ``limit``.
        """
        words = [w for w in query.lower().split() if w]
        found: list[dict[str, Any]] = []
        history = parse_history(await self.redis.lrange(self._keys.history, 0, -1), self.session)
        for seq in range(len(history) - 1, -1, -1):
            entry = history[seq]
            if all(w in entry.text.lower() for w in words):
                found.append({"role": entry.role, "text": entry.text, "seq": seq, "at": entry.at})
                if len(found) >= limit:
                    return found
        entries = await self.redis.xrevrange(self._keys.events, count=self.settings.events_maxlen)
        for event_id, fields in entries or []:
            raw = {(k.decode() if isinstance(k, bytes) else k): v for k, v in (fields or {}).items()}
            body = raw.get("event") or raw.get("data") or b""
            text = body.decode() if isinstance(body, bytes) else str(body)
            if words and all(w in text.lower() for w in words):
                eid = event_id.decode() if isinstance(event_id, bytes) else event_id
                found.append({"kind": "event", "text": text[:2000], "seq": eid})
                if len(found) >= limit:
                    break
        return found
