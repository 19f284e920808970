"""Approval records: what a person decides before a gated effect runs (``docs/ARCHITECTURE.md`` §6, "Approvals").

A gated call does not run: the gateway returns an :class:`ApprovalRequest`, the runtime persists an
:class:`ApprovalRecord` through the session's fenced :class:`ApprovalStore` and ends the turn, freeing the worker
slot. A decision is applied at most once (compare-and-set on ``pending``, bound to the action hash and the actor) and
consumed once its effect ran or was refused. A record never carries secrets.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "APPROVAL_OPTION_PREFIX",
    "ApprovalKind",
    "ApprovalRecord",
    "ApprovalRequest",
    "ApprovalStatus",
    "ApprovalStore",
    "DecideOutcome",
    "DecideResult",
    "SessionControl",
    "Verdict",
    "new_approval_id",
    "option_id",
    "parse_option_id",
    "record_verifies",
    "sign_record",
    "state_sha256",
]

Verdict = Literal["approve", "deny", "expire"]
"""What a decision asks for (``expire`` is the gateway's own, once ``expires_at`` has passed)."""

ApprovalStatus = Literal["pending", "approved", "denied", "expired", "superseded", "executed", "refused"]
"""``pending`` → ``approved`` | ``denied`` | ``expired`` | ``superseded``; ``approved`` → ``executed`` (the effect
ran, or its recorded outcome was found) | ``refused`` (the re-check before execution failed)."""

ApprovalKind = Literal["tool", "reply"]
"""``tool``: a gated tool call; ``reply``: a whole draft reply held for review (the *review* mode)."""

DecisionVia = Literal["button", "command", "console", "expiry"]

APPROVAL_OPTION_PREFIX = "approval:"
_OPTION = re.compile(r"^approval:([A-Za-z0-9_-]{6,40}):(approve|deny):([0-9a-f]{12})$")


def new_approval_id() -> str:
    """A short, unguessable, URL- and callback-safe id (Telegram's ``callback_data`` holds 64 bytes)."""
    return secrets.token_urlsafe(9)


def option_id(approval_id: str, verdict: Literal["approve", "deny"], action_sha256: str) -> str:
    """The ``Choice.id`` of a decision button: binds the click to the approval *and* to the action's hash."""
    return f"{APPROVAL_OPTION_PREFIX}{approval_id}:{verdict}:{action_sha256[:12]}"


def parse_option_id(value: str) -> tuple[str, Literal["approve", "deny"], str] | None:
    """``(approval id, verdict, action hash prefix)`` of a decision button's id; ``None`` for any other id."""
    found = _OPTION.match(value)
    if found is None:
        return None
    verdict: Literal["approve", "deny"] = "approve" if found.group(2) == "approve" else "deny"
    return found.group(1), verdict, found.group(3)


def state_sha256(state: Any) -> str:
    """Hash of the state an approval depends on (canonical JSON): re-checked before the approved effect runs."""
    canonical = json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


class ApprovalRequest(BaseModel):
    """What the tool gateway returns instead of running a call the policy gates (nothing has run)."""

    model_config = ConfigDict(frozen=True)

    tool: str
    arguments: dict[str, Any]
    """The call's validated, normalised arguments (``model_dump(mode="json")``)."""
    action_sha256: str
    """:func:`switchboard.core.tools.gateway.action_sha256` of the tool and ``arguments``."""
    idempotency_key: str
    """The key the call runs under once approved (the same on every attempt at the run)."""
    resources: tuple[str, ...] = ()
    """What the effect touches, as the reviewer should see it (a path, a table, a recipient, an amount)."""
    reason: str
    """Why the policy asks (the matching rule's reason), shown to the reviewer."""
    rule: str
    """The matching rule's name (or ``default:<what>``)."""
    policy_version: str
    risk: Literal["low", "medium", "high"] = "medium"
    reversible: bool = True


class ApprovalRecord(BaseModel):
    """One approval, as persisted (JSON) in the session's keys; the reviewer sees exactly these fields."""

    model_config = ConfigDict(frozen=True)

    id: str
    kind: ApprovalKind = "tool"
    status: ApprovalStatus = "pending"
    session: str
    tenant: str
    agent: str
    channel: str
    run_id: str
    """The requesting run: the resumed run keeps it, so its idempotency keys are the ones the request named."""
    trace_id: str = ""
    requested_by: str
    """Principal the run acts for (``<channel>:<sender id>``)."""
    requested_at: float
    expires_at: float
    request: ApprovalRequest | None = None
    """The gated call (``kind == "tool"``)."""
    draft: str | None = None
    """The held reply (``kind == "reply"``)."""
    evidence: tuple[str, ...] = ()
    """What the draft rests on (tool calls and results of its turn, shortened), for the reviewer."""
    state_sha256: str
    """:func:`state_sha256` of the relevant state when the approval was asked."""
    call_id: str | None = None
    """The model's tool call id the approval answers (``run_program``'s, for a paused program)."""
    program: str | None = None
    """The paused CodeAct program: :meth:`~switchboard.core.agent.programs.PausedProgram.dump`, signed (UTF-8)."""
    approvers: tuple[str, ...] = ()
    """Who may decide, resolved when asked: principals (``telegram:42``, ``console:alice``) or ``requester``."""
    decided_by: str | None = None
    decided_at: float | None = None
    decision_via: DecisionVia | None = None
    decided_in: str | None = None
    """The run whose turn applied the decision: a re-run of that turn (its worker was lost) carries it on."""
    outcome: dict[str, Any] | None = None
    """After ``executed``: the tool outcome (JSON); after ``refused``: ``{"reason": ...}``; with ``run``, the run that
    settled it (a re-run of that run's turn continues from this outcome)."""
    mac: str | None = None
    """HMAC-SHA256 with the server's approval key over what was asked (:func:`sign_record`): a record rewritten in
    Redis — its arguments and their hash together — no longer verifies and is refused, never run."""

    @property
    def action_sha256(self) -> str:
        """The hash the decision binds to (the draft's hash for a held reply)."""
        if self.request is not None:
            return self.request.action_sha256
        return hashlib.sha256((self.draft or "").encode()).hexdigest()


_SIGNED = frozenset(
    {
        "id", "kind", "session", "tenant", "agent", "channel", "run_id", "requested_by", "requested_at", "expires_at",
        "request", "draft", "evidence", "state_sha256", "call_id", "program", "approvers",
    }
)  # fmt: skip
"""What a record's ``mac`` covers: everything that was asked; not the decision, which the store's scripts write."""


def _mac(record: ApprovalRecord, key: bytes) -> str:
    body = record.model_dump(mode="json", include=set(_SIGNED))
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hmac.new(key, canonical.encode(), hashlib.sha256).hexdigest()


def sign_record(record: ApprovalRecord, key: bytes) -> ApprovalRecord:
    """``record`` with its ``mac`` (made before the record is opened)."""
    return record.model_copy(update={"mac": _mac(record, key)})


def record_verifies(record: ApprovalRecord, key: bytes) -> bool:
    """Whether ``record`` is what this gateway asked (constant-time compare of its ``mac``)."""
    return record.mac is not None and hmac.compare_digest(record.mac.encode(), _mac(record, key).encode())


DecideResult = Literal["applied", "already_decided", "expired", "mismatch", "not_found", "not_due", "not_allowed"]
"""``applied``: this decision changed the record (exactly one decision ever does); ``already_decided``: another
decision came first; ``expired``: the approval had expired (now recorded as such); ``mismatch``: the click named
another action hash; ``not_found``: no such approval in this session; ``not_due``: an ``expire`` before
``expires_at``; ``not_allowed``: the actor may not decide it."""


class DecideOutcome(BaseModel):
    """What :meth:`ApprovalStore.approval_decide` did, and the record as it now stands."""

    model_config = ConfigDict(frozen=True)

    result: DecideResult
    record: ApprovalRecord | None = None


class SessionControl(BaseModel):
    """Who drives the conversation: the agent (no record), or an operator who took it over."""

    model_config = ConfigDict(frozen=True)

    operator: str
    """``console:<name>`` of the operator holding the conversation."""
    since: float = Field(ge=0)


@runtime_checkable
class ApprovalStore(Protocol):
    """Approval records and take-over state of one session, every write fenced by the session lease.

    Implemented in Redis by the queue layer (``switchboard.queue.approvals``).
    """

    async def approval_open(self, record: ApprovalRecord) -> None:
        """Persist a new ``pending`` record (and index it for expiry and the console)."""

    async def approval_get(self, approval_id: str) -> ApprovalRecord | None:
        """This session's record ``approval_id`` (``None``: none, or another session's)."""

    async def approval_pending(self) -> list[ApprovalRecord]:
        """This session's ``pending`` records, oldest first."""

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
        """Apply one decision atomically: only a ``pending`` record changes, at most once.

        ``approve``/``deny`` before ``expires_at`` → ``approved``/``denied`` (``action_prefix``, when given, must
        prefix the record's action hash); at or after ``expires_at`` any verdict records ``expired``. The clock is
        the store's (Redis ``TIME``), so every process agrees on expiry. Authorisation is checked by the caller.
        A decision that changes the record keeps ``run_id`` as its ``decided_in``.
        """

    async def approval_supersede(self, approval_id: str) -> bool:
        """``pending`` → ``superseded`` (a newer user message replaced the request); whether it changed."""

    async def approval_settle(
        self, approval_id: str, status: Literal["executed", "refused"], outcome: dict[str, Any] | None
    ) -> bool:
        """Consume an ``approved`` record once: → ``executed`` or ``refused``; whether this call consumed it."""

    async def control(self) -> SessionControl | None:
        """The operator holding the conversation, if one took it over."""

    async def set_control(self, control: SessionControl | None) -> None:
        """Take the conversation over (``control``) or hand it back (``None``)."""
