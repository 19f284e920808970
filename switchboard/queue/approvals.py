"""Approval records and take-over state in Redis: the queue layer's approval store.

:class:`~switchboard.core.approvals.records.ApprovalStore` on Redis: one hash per approval, indexed while pending in the
session's set, the reaper's expiry sweep and the tenant's list. Every write is a Lua script fenced by the session lease,
so a zombie worker writes nothing, and a decision is one compare-and-set on ``pending`` on the server's clock, so
concurrent decisions resolve to exactly one. A record stays readable for :data:`APPROVAL_RETENTION_S` after it last
changed, so a late click is answered "already decided".
"""

from __future__ import annotations

import json
import re
from typing import Any, Final, Literal

import redis.asyncio as aioredis

from switchboard.core.approvals.records import (
    ApprovalRecord,
    DecideOutcome,
    DecideResult,
    DecisionVia,
    SessionControl,
    Verdict,
)
from switchboard.queue import scripts
from switchboard.queue.keys import SessionKeys, tenant_of
from switchboard.queue.sealed import APPROVAL_CONTEXT, open_stored, seal_stored
from switchboard.types import SessionKey

__all__ = [
    "APPROVAL_RETENTION_S",
    "ApprovalsDelegate",
    "RedisApprovals",
    "approval_member",
    "parse_approval_member",
    "record_from_fields",
    "valid_approval_id",
]

APPROVAL_RETENTION_S: Final = 7 * 24 * 3600
"""How long a record is kept after it last changed (and, while pending, after its expiry)."""

_ID = re.compile(r"^[A-Za-z0-9_-]{6,40}$")
_RESULTS: Final[dict[str, DecideResult]] = {
    "applied": "applied",
    "already_decided": "already_decided",
    "expired": "expired",
    "mismatch": "mismatch",
    "not_found": "not_found",
    "not_due": "not_due",
    "not_allowed": "not_allowed",
}


def valid_approval_id(approval_id: str) -> bool:
    """Whether ``approval_id`` has the shape of an approval id (see ``core.approvals.records.new_approval_id``)."""
    return _ID.match(approval_id) is not None


def approval_member(session: SessionKey, approval_id: str) -> str:
    """The ``<session>|<approval id>`` member of the global approval indexes."""
    return f"{session}|{approval_id}"


def parse_approval_member(member: str | bytes) -> tuple[SessionKey, str]:
    """``(session, approval id)`` of a global index member (ids never contain ``|``)."""
    text = member.decode() if isinstance(member, bytes) else member
    session, _, approval_id = text.rpartition("|")
    return SessionKey(session), approval_id


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def record_from_fields(fields: dict[Any, Any] | list[Any]) -> ApprovalRecord | None:
    """The record an approval HASH holds now (``HGETALL`` as a dict, or a script's flat list); ``None`` when empty.

    Raises:
        SealError: the record is sealed and no key of ``SWITCHBOARD_DATA_KEYS`` opens it.
    """
    if isinstance(fields, list):
        fields = {fields[i]: fields[i + 1] for i in range(0, len(fields) - 1, 2)}
    found = {_text(k): _text(v) for k, v in fields.items()}
    raw = found.get("record")
    if not raw:
        return None
    body = json.loads(open_stored(raw, APPROVAL_CONTEXT))
    body["status"] = found.get("status", body.get("status", "pending"))
    if found.get("decided_by"):
        body["decided_by"] = found["decided_by"]
    if found.get("decided_at"):
        body["decided_at"] = float(found["decided_at"])
    if found.get("decision_via"):
        body["decision_via"] = found["decision_via"]
    if found.get("decided_in"):
        body["decided_in"] = found["decided_in"]
    if found.get("outcome"):
        body["outcome"] = json.loads(found["outcome"])
    return ApprovalRecord.model_validate(body)


class RedisApprovals:
    """The approvals and take-over record of one session, written under one lease token."""

    def __init__(
        self,
        redis: aioredis.Redis,
        session: SessionKey,
        token: str,
        epoch: int,
        *,
        retention_s: int = APPROVAL_RETENTION_S,
    ) -> None:
        self.redis = redis
        self.session = session
        self.token = token
        self.epoch = epoch
        self.retention_ms = retention_s * 1000
        self._keys = SessionKeys(session)
        self._tenant = tenant_of(session)

    def _index_keys(self, approval_id: str) -> list[str]:
        return [
            self._keys.lease,
            self._keys.fenced_rejections,
            self._keys.approval(approval_id),
            self._keys.approvals,
            self._keys.shard.approvals_due,
            self._keys.shard.approvals_pending(self._tenant),
        ]

    async def approval_open(self, record: ApprovalRecord) -> None:
        """Persist a new ``pending`` record and index it for expiry and the console.

        The approval expires ``expires_at - requested_at`` after now on the server's clock (the clock of every
        decision and of the expiry sweep), whatever this worker's clock says; the record keeps the times it was
        opened with.

        Raises:
            ValueError: the record belongs to another session, is not ``pending``, has a malformed id, or its id is
                already taken (nothing was written).
        """
        if record.session != self.session:
            raise ValueError(f"approval {record.id} belongs to another session")
        if record.status != "pending" or not _ID.match(record.id):
            raise ValueError("an approval is opened pending, with an id of 6-40 URL-safe characters")
        opened = await scripts.APPROVAL_OPEN(
            self.redis,
            self._index_keys(record.id),
            [
                self.token,
                record.id,
                seal_stored(record.model_dump_json(), APPROVAL_CONTEXT),
                record.action_sha256,
                repr(record.requested_at),
                repr(record.expires_at),
                approval_member(self.session, record.id),
                self.retention_ms,
            ],
            session=self.session,
            epoch=self.epoch,
        )
        if not int(opened):
            raise ValueError(f"approval id {record.id} is already taken")

    async def approval_get(self, approval_id: str) -> ApprovalRecord | None:
        """This session's record ``approval_id`` (``None``: none, or another session's)."""
        if not _ID.match(approval_id):
            return None
        return record_from_fields(await self.redis.hgetall(self._keys.approval(approval_id)))

    async def approval_pending(self) -> list[ApprovalRecord]:
        """This session's ``pending`` records, oldest first."""
        ids = [_text(i) for i in await self.redis.zrange(self._keys.approvals, 0, -1)]
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for approval_id in ids:
                pipe.hgetall(self._keys.approval(approval_id))
            rows = await pipe.execute()
        records = [record_from_fields(row) for row in rows]
        return [r for r in records if r is not None and r.status == "pending"]

    async def approval_decide(
        self,
        approval_id: str,
        verdict: Verdict,
        actor: str,
        via: DecisionVia,
        *,
        action_prefix: str | None,
        run_id: str | None = None,
    ) -> DecideOutcome:
        """Apply one decision atomically: only a ``pending`` record changes, at most once (Redis ``TIME`` is the clock).

        ``approve``/``deny`` before ``expires_at`` → ``approved``/``denied`` (``applied``), unless ``action_prefix``
        does not prefix the action hash (``mismatch``, nothing changed); ``expire`` before it → ``not_due``. At or
        after ``expires_at`` the record becomes ``expired`` (decided by ``switchboard``, via ``expiry``): the result
        is ``applied`` for an ``expire`` verdict, ``expired`` for the others. A record no longer pending →
        ``already_decided``; no such record in this session → ``not_found``.
        """
        if not _ID.match(approval_id):
            return DecideOutcome(result="not_found")
        reply = await scripts.APPROVAL_DECIDE(
            self.redis,
            self._index_keys(approval_id),
            [
                self.token,
                approval_id,
                approval_member(self.session, approval_id),
                verdict,
                actor,
                via,
                (action_prefix or "").lower(),
                self.retention_ms,
                run_id or "",
            ],
            session=self.session,
            epoch=self.epoch,
        )
        result = _RESULTS[_text(reply[0])]
        record = record_from_fields(reply[1]) if len(reply) > 1 else None
        return DecideOutcome(result=result, record=record)

    async def approval_supersede(self, approval_id: str) -> bool:
        """``pending`` → ``superseded`` (a newer user message replaced the request); whether it changed."""
        if not _ID.match(approval_id):
            return False
        changed = await scripts.APPROVAL_SUPERSEDE(
            self.redis,
            self._index_keys(approval_id),
            [self.token, approval_id, approval_member(self.session, approval_id), self.retention_ms],
            session=self.session,
            epoch=self.epoch,
        )
        return bool(int(changed))

    async def approval_settle(
        self, approval_id: str, status: Literal["executed", "refused"], outcome: dict[str, Any] | None
    ) -> bool:
        """Consume an ``approved`` record once: → ``executed`` or ``refused``; whether this call consumed it."""
        if not _ID.match(approval_id):
            return False
        body = json.dumps(outcome, separators=(",", ":"), ensure_ascii=False, default=str) if outcome else ""
        consumed = await scripts.APPROVAL_SETTLE(
            self.redis,
            [self._keys.lease, self._keys.fenced_rejections, self._keys.approval(approval_id)],
            [self.token, status, body, self.retention_ms],
            session=self.session,
            epoch=self.epoch,
        )
        return bool(int(consumed))

    async def control(self) -> SessionControl | None:
        """The operator holding the conversation, if one took it over."""
        raw = await self.redis.get(self._keys.control)
        return SessionControl.model_validate_json(raw) if raw else None

    async def set_control(self, control: SessionControl | None) -> None:
        """Take the conversation over (``control``) or hand it back (``None``), fenced."""
        await scripts.CONTROL_SET(
            self.redis,
            [self._keys.lease, self._keys.fenced_rejections, self._keys.control],
            [self.token, control.model_dump_json() if control is not None else ""],
            session=self.session,
            epoch=self.epoch,
        )


class ApprovalsDelegate:
    """The approval store of a session store, by delegation to ``self.approvals``."""

    approvals: RedisApprovals

    async def approval_open(self, record: ApprovalRecord) -> None:
        """Persist a new ``pending`` record (see :meth:`RedisApprovals.approval_open`)."""
        await self.approvals.approval_open(record)

    async def approval_get(self, approval_id: str) -> ApprovalRecord | None:
        """This session's record ``approval_id`` (``None``: none, or another session's)."""
        return await self.approvals.approval_get(approval_id)

    async def approval_pending(self) -> list[ApprovalRecord]:
        """This session's ``pending`` records, oldest first."""
        return await self.approvals.approval_pending()

    async def approval_decide(
        self,
        approval_id: str,
        verdict: Verdict,
        actor: str,
        via: DecisionVia,
        *,
        action_prefix: str | None,
        run_id: str | None = None,
    ) -> DecideOutcome:
        """Apply one decision atomically (see :meth:`RedisApprovals.approval_decide`)."""
        return await self.approvals.approval_decide(
            approval_id, verdict, actor, via, action_prefix=action_prefix, run_id=run_id
        )

    async def approval_supersede(self, approval_id: str) -> bool:
        """``pending`` → ``superseded``; whether it changed."""
        return await self.approvals.approval_supersede(approval_id)

    async def approval_settle(
        self, approval_id: str, status: Literal["executed", "refused"], outcome: dict[str, Any] | None
    ) -> bool:
        """Consume an ``approved`` record once; whether this call consumed it."""
        return await self.approvals.approval_settle(approval_id, status, outcome)

    async def control(self) -> SessionControl | None:
        """The operator holding the conversation, if one took it over."""
        return await self.approvals.control()

    async def set_control(self, control: SessionControl | None) -> None:
        """Take the conversation over (``control``) or hand it back (``None``)."""
        await self.approvals.set_control(control)
