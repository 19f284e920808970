"""Decisions about approvals: who asked what, whether they may, and what became of the action.

A decision (a button click, ``/approve``/``/deny``, an operator's or the expiry sweep's ``OperatorActed``) is an
inbound event of the session, so it is ordered with the conversation and applied under the session lease. An
approved action runs under the idempotency key its request named, so a re-run finds the recorded outcome instead
of a second effect; a new message supersedes pending approvals, so none holds the conversation up.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from switchboard.core.approvals.grants import GATEWAY_PRINCIPAL, may_decide
from switchboard.core.approvals.records import (
    ApprovalRecord,
    ApprovalStore,
    DecisionVia,
    Verdict,
    parse_option_id,
)
from switchboard.core.approvals.suspend import principal_of
from switchboard.core.events import ApprovalDecided, ApprovalSettled, Event
from switchboard.core.messages import ChoiceSelected, CommandIssued, InboundMessage, OperatorActed, Posted
from switchboard.core.tools.gateway import action_sha256, canonical_json
from switchboard.tracing import span_at

__all__ = [
    "DECISION_COMMANDS",
    "Applied",
    "Ask",
    "Execute",
    "Settled",
    "Verify",
    "apply_decisions",
    "decision_of",
    "not_done_content",
    "supersede_pending",
]

logger = logging.getLogger(__name__)

DECISION_COMMANDS = frozenset({"approve", "deny"})
_TYPED_DECISION = re.compile(r"^\s*/(approve|deny)(?:@[A-Za-z0-9_]+)?(?:\s+([A-Za-z0-9_-]{1,64}))?\s*$", re.IGNORECASE)
"""``/approve ID`` or ``/deny ID`` typed as a plain message (the text fallback on channels without commands)."""

SettledStatus = Literal["executed", "refused", "denied", "expired", "superseded", "sent"]

UNKNOWN_TEXT = "I don't know that approval (it may belong to another conversation)."
NOT_YOURS_TEXT = "You can't decide that approval: it waits for someone else's decision."
MISMATCH_TEXT = "That button belongs to another version of the request; nothing was changed."
WHICH_TEXT = "Several approvals are waiting: say which one, e.g. /approve {ids}."
NONE_PENDING_TEXT = "No approval is waiting in this conversation."
_ALREADY = {
    "approved": "That was already approved{by}.",
    "executed": "That was already approved{by} and carried out.",
    "refused": "That was approved{by} but refused when it was checked again; it did not happen.",
    "denied": "That was already denied{by}.",
    "expired": "That request expired before it was decided; it did not happen.",
    "superseded": "That request is no longer pending: a newer message replaced it; it did not happen.",
}


@dataclass(frozen=True)
class Ask:
    """A decision as it arrived."""

    approval_id: str
    """Empty: ``/approve`` without an id (the only pending approval)."""
    verdict: Verdict
    actor: str
    via: DecisionVia
    action_prefix: str | None = None
    """From a button: the action hash's prefix the click was offered with."""
    ack_ref: str | None = None
    """From a button on a platform that wants each tap answered (``ChoiceSelected.ack_ref``)."""


@dataclass(frozen=True)
class Settled:
    """An approval's end the model is told about (or, for a held reply, what to send)."""

    record: ApprovalRecord
    status: SettledStatus
    content: str
    """The tool result the model reads for the action (the outcome, or why it did not happen)."""
    ok: bool
    reason: str | None = None
    """Why a ``refused`` action was refused (``approval_mismatch``, ``stale_state``, a gateway refusal)."""


@dataclass
class Applied:
    """What a turn's decisions came to."""

    settled: list[Settled] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    """Fixed replies (no model): already decided, not yours, unknown."""


Execute = Callable[[ApprovalRecord], Awaitable[tuple[str, bool, str | None]]]
"""Runs an approved action: ``(tool result for the model, ok, refusal reason or None when it was executed)``."""
Verify = Callable[[ApprovalRecord], bool]
Answer = Callable[[Ask, str], Awaitable[None]]
"""Acknowledges a button's tap once its decision is known: ``""`` when it was taken, else why it was refused."""


def decision_of(message: InboundMessage) -> Ask | None:
    """The decision ``message`` asks for, if it is one."""
    event = message.event
    if isinstance(event, ChoiceSelected):
        parsed = parse_option_id(event.option_id)
        if parsed is None:
            return None
        approval_id, verdict, prefix = parsed
        return Ask(approval_id, verdict, principal_of(message), "button", prefix, event.ack_ref)
    if isinstance(event, CommandIssued) and event.name in DECISION_COMMANDS:
        words = message.text.split()
        return Ask(
            words[0] if words else "",
            "approve" if event.name == "approve" else "deny",
            principal_of(message),
            "command",
        )
    if isinstance(event, Posted) and (typed := _TYPED_DECISION.match(message.text)) is not None:
        # channels without commands (web chat, Slack, WhatsApp, ...) deliver "/approve ID" as a plain message
        typed_verdict: Verdict = "approve" if typed.group(1).lower() == "approve" else "deny"
        return Ask(typed.group(2) or "", typed_verdict, principal_of(message), "command")
    if isinstance(event, OperatorActed) and event.action == "decide":
        if event.approval_id is None or event.verdict is None:
            return None
        via: DecisionVia = "expiry" if event.operator == GATEWAY_PRINCIPAL else "console"
        return Ask(event.approval_id, event.verdict, event.operator, via)
    return None


def not_done_content(record: ApprovalRecord, status: SettledStatus, detail: str) -> str:
    """The tool result of an action that did not happen."""
    what = record.request.tool if record.request is not None else "the reply"
    return canonical_json(
        {
            "error": f"not done: {detail}; {what} did not run and nothing of it happened",
            "error_class": f"approval_{status}",
            "approval_id": record.id,
            "hint": "tell the user it did not happen; do not call it again unless they ask anew",
        }
    )


async def apply_decisions(
    asks: Sequence[Ask],
    store: ApprovalStore,
    *,
    execute: Execute,
    state: Callable[[], Awaitable[str]],
    event: Callable[[Event], Awaitable[None]],
    verify: Verify | None = None,
    run_id: str | None = None,
    answer: Answer | None = None,
) -> Applied:
    """Apply a turn's decisions in order; see the module docstring.

    Args:
        asks: The decisions of the turn's messages.
        store: The session's approval store (fenced by the lease).
        execute: Runs an approved tool action (or resumes its program) under the recorded key.
        state: The hash of the session state now (:func:`~switchboard.core.approvals.suspend.session_state_sha256`).
        verify: Whether a record is what this gateway asked (its signature); one that is not is refused, never run.
        event: Appends a fact to the session's event log.
        run_id: The deciding turn's run: recorded with what an approved action came to, so a re-run of the turn
            continues from it.
        answer: Acknowledges each button press as soon as its decision is known (before an approved action runs).
    """
    applied = Applied()
    for ask in asks:
        await _apply(ask, store, applied, execute, state, event, verify, run_id, answer)
    return applied


async def _apply(
    ask: Ask,
    store: ApprovalStore,
    applied: Applied,
    execute: Execute,
    state: Callable[[], Awaitable[str]],
    event: Callable[[Event], Awaitable[None]],
    verify: Verify | None,
    run_id: str | None,
    answer: Answer | None = None,
) -> None:
    from_channel = ask.via in ("button", "command")

    async def taken(text: str = "") -> None:
        if answer is not None and ask.via == "button":
            await answer(ask, text)

    async def notice(text: str) -> None:
        """A refusal: said in the conversation, and as the press's acknowledgement."""
        if from_channel:
            applied.notices.append(text)
        await taken(text)

    approval_id = ask.approval_id
    if not approval_id:
        pending = await store.approval_pending()
        if len(pending) != 1:
            await notice(WHICH_TEXT.format(ids=" or ".join(r.id for r in pending)) if pending else NONE_PENDING_TEXT)
            return
        approval_id = pending[0].id
    record = await store.approval_get(approval_id)
    if record is None:
        await notice(UNKNOWN_TEXT)
        return
    if not may_decide(record, ask.actor, ask.verdict) or (record.kind == "reply" and ask.actor == record.requested_by):
        # the user never reviews their own held reply, also when an approver glob (``telegram:*``) names them
        logger.info("a decision on an approval was refused: %s may not decide it", ask.via)
        await event(_decided(record, ask, "not_allowed"))
        await notice(NOT_YOURS_TEXT)
        return
    outcome = await store.approval_decide(
        approval_id, ask.verdict, ask.actor, ask.via, action_prefix=ask.action_prefix, run_id=run_id
    )
    now_record = outcome.record or record
    await event(_decided(now_record, ask, outcome.result))
    match outcome.result:
        case "applied" | "already_decided" | "expired":
            if outcome.result == "applied":
                _wait_span(now_record, ask)
            # a re-run of the turn that decided it (its worker was lost before the model answered) carries it on
            ours = run_id is not None and now_record.decided_in == run_id and not _in(applied, now_record)
            fresh = outcome.result != "already_decided" or ours
            if now_record.status == "approved":  # just now, or by an attempt of this run that crashed after it
                await taken()
                settled = await _run_approved(now_record, store, execute, state, event, verify, run_id)
                applied.settled.append(settled)
            elif fresh and now_record.status in ("denied", "expired"):
                status: SettledStatus = "denied" if now_record.status == "denied" else "expired"
                await taken("" if status == "denied" else _ALREADY["expired"])
                detail = f"denied by {now_record.decided_by}" if status == "denied" else "the approval expired"
                await event(ApprovalSettled(approval_id=now_record.id, status=status))
                applied.settled.append(Settled(now_record, status, not_done_content(now_record, status, detail), False))
            elif not _in(applied, now_record) and (again := _settled_by(now_record, run_id)) is not None:
                # this turn carried it out before its worker was lost: continue from the recorded outcome (the
                # settlement's fact may not have been written: it is written again)
                await taken()
                await event(ApprovalSettled(approval_id=now_record.id, status=again.status, reason=again.reason))
                applied.settled.append(again)
            else:
                by = f" by {now_record.decided_by}" if now_record.decided_by else ""
                await notice(_ALREADY.get(now_record.status, "That was already decided{by}.").format(by=by))
        case "mismatch":
            await notice(MISMATCH_TEXT)
        case "not_found":
            await notice(UNKNOWN_TEXT)
        case "not_allowed":
            await notice(NOT_YOURS_TEXT)
        case "not_due":
            logger.info("an expiry arrived before the approval's expiry time; left pending")


async def _run_approved(
    record: ApprovalRecord,
    store: ApprovalStore,
    execute: Execute,
    state: Callable[[], Awaitable[str]],
    event: Callable[[Event], Awaitable[None]],
    verify: Verify | None = None,
    run_id: str | None = None,
) -> Settled:
    """Re-check an approved action, run it once under its key, and consume the approval (noting ``run_id``)."""
    by = {"run": run_id} if run_id is not None else {}
    if verify is not None and not verify(record):  # rewritten in Redis: what it says is not what was asked
        logger.warning("approval %s does not verify against the approval key; refused", record.id)
        await store.approval_settle(record.id, "refused", {"reason": "approval_mismatch", **by})
        await event(ApprovalSettled(approval_id=record.id, status="refused", reason="approval_mismatch"))
        return _refused(record, "approval_mismatch")
    if record.kind == "reply":
        await store.approval_settle(record.id, "executed", {"sent": True, **by})
        await event(ApprovalSettled(approval_id=record.id, status="sent"))
        return Settled(record, "sent", record.draft or "", True)
    reason: str | None = None
    request = record.request
    if request is None or action_sha256(request.tool, request.arguments) != request.action_sha256:
        reason = "approval_mismatch"  # the stored arguments are not those the hash (and the approver) saw
    elif await state() != record.state_sha256:
        reason = "stale_state"
    if reason is None:
        content, ok, reason = await execute(record)
    if reason is not None:
        await store.approval_settle(record.id, "refused", {"reason": reason, **by})
        await event(ApprovalSettled(approval_id=record.id, status="refused", reason=reason))
        return _refused(record, reason)
    # the whole result the model reads (bounded by the gateway's tiering): a re-run of this turn reads it back
    await store.approval_settle(record.id, "executed", {"ok": ok, "result": content, **by})
    await event(ApprovalSettled(approval_id=record.id, status="executed"))
    return Settled(record, "executed", content, ok)


def _refused(record: ApprovalRecord, reason: str) -> Settled:
    detail = {
        "approval_mismatch": "the stored request does not match what was asked for",
        "stale_state": "the conversation's state changed since it was asked for",
    }.get(reason, f"it was refused when checked again ({reason})")
    return Settled(record, "refused", not_done_content(record, "refused", detail), False, reason)


def _in(applied: Applied, record: ApprovalRecord) -> bool:
    """Whether this turn's decisions settled ``record`` already (a second click in the same batch is told so)."""
    return any(s.record.id == record.id for s in applied.settled)


def _settled_by(record: ApprovalRecord, run_id: str | None) -> Settled | None:
    """How ``record`` ended, when the run ``run_id`` settled it (a re-run of its turn continues from there)."""
    recorded = record.outcome or {}
    if run_id is None or recorded.get("run") != run_id:
        return None
    if record.status == "refused":
        return _refused(record, str(recorded.get("reason") or "refused"))
    if record.status != "executed":
        return None
    if record.kind == "reply":
        return Settled(record, "sent", record.draft or "", True)
    return Settled(record, "executed", str(recorded.get("result", "")), bool(recorded.get("ok", True)))


async def supersede_pending(
    store: ApprovalStore, event: Callable[[Event], Awaitable[None]], *, run_id: str
) -> list[Settled]:
    """Supersede the session's pending tool approvals (a new user message came): each did not happen.

    Approvals of the run ``run_id`` itself are left alone: a re-run of the turn that asked (its first attempt
    died after asking) asks for them again.
    """
    settled: list[Settled] = []
    for record in await store.approval_pending():
        if record.kind != "tool" or record.run_id == run_id or not await store.approval_supersede(record.id):
            continue
        await event(ApprovalSettled(approval_id=record.id, status="superseded"))
        detail = "the user sent a new message instead of deciding, which replaced the request"
        settled.append(Settled(record, "superseded", not_done_content(record, "superseded", detail), False))
    return settled


def _decided(record: ApprovalRecord, ask: Ask, result: str) -> ApprovalDecided:
    return ApprovalDecided(
        approval_id=record.id,
        verdict=ask.verdict,
        actor=ask.actor,
        via=ask.via,
        result=result,
        waited_ms=round(max(0.0, time.time() - record.requested_at) * 1000, 3),
    )


def _wait_span(record: ApprovalRecord, ask: Ask) -> None:
    """``approval.wait``: from the request to the decision that counted, in the requesting run's trace."""
    span_at(
        "approval.wait",
        start_ns=int(record.requested_at * 1e9),
        trace_key=record.trace_id or None,
        approval__id=record.id,
        approval__kind=record.kind,
        approval__verdict=ask.verdict,
        approval__via=ask.via,
        approval__status=record.status,
        tool__name=record.request.tool if record.request is not None else None,
    )
