"""Pausing a run for a person: the approval record, the question on the channel, the held reply of review mode.

A paused CodeAct program is signed with the server's key (:func:`snapshot_key`), so no one who can write to Redis can
make a worker resume a program of their own. Each button binds the click to the approval *and* the action's hash;
``/approve ID`` / ``/deny ID`` is the text fallback. In review mode the final reply is held as a ``kind="reply"``
approval.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

from switchboard.core.actions import ApprovalCard, Choice, OfferChoice
from switchboard.core.agent.toolcards import title_of
from switchboard.core.approvals.policy import Policy
from switchboard.core.approvals.records import (
    ApprovalRecord,
    ApprovalRequest,
    option_id,
    state_sha256,
)
from switchboard.core.messages import ExternalEvent, InboundMessage, OperatorActed, Scheduled
from switchboard.core.model import ChatMessage, ToolCall
from switchboard.core.tools.gateway import canonical_json
from switchboard.core.turn import TurnRequest

__all__ = [
    "KEY_FILE",
    "approval_id_for",
    "approval_offer",
    "approval_options",
    "approval_record",
    "evidence_of",
    "principal_of",
    "reply_record",
    "session_state_sha256",
    "snapshot_key",
    "waiting_content",
]

KEY_FILE = "approval-snapshot.key"
"""The generated signing key of paused programs, under the data directory (when none is configured)."""
_KEY_BYTES = 32
_SHOWN_ARGUMENT_CHARS = 600
_EVIDENCE_ITEMS = 12
_EVIDENCE_CHARS = 300


def snapshot_key(configured: str | None, data_dir: Path) -> bytes:
    """The HMAC key paused CodeAct programs are signed with, the same in every worker of a deployment.

    ``configured`` (``SWITCHBOARD_APPROVAL_KEY``) wins; otherwise a random key is generated once into
    ``<data dir>/approval-snapshot.key`` (mode 0600) and read from there by every later process. Workers on other
    hosts must be given the same key (the setting, or the same file): a program paused on one worker then resumes
    on any other.
    """
    if configured:
        return configured.encode()
    path = data_dir / KEY_FILE
    with contextlib.suppress(FileExistsError):
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:  # created exclusively: two processes starting at once agree on one key
            out.write(secrets.token_hex(_KEY_BYTES))
    for _ in range(50):  # another process may have created it a moment ago and not yet written it
        key = path.read_text().strip()
        if key:
            return key.encode()
        time.sleep(0.01)
    raise RuntimeError(f"{path} is empty: delete it, or set SWITCHBOARD_APPROVAL_KEY")


def approval_id_for(key: bytes, basis: str) -> str:
    """The id of the approval a run asks for ``basis`` (the gated call's idempotency key): unguessable, stable.

    Keyed with the server's key, so no one can guess an id; stable, so a re-run of the requesting turn (its worker
    died after asking) finds the approval it already opened and offers the same buttons again, instead of leaving
    a second request pending beside the first.
    """
    digest = hmac.new(key, f"approval\n{basis}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:9]).decode()


def principal_of(message: InboundMessage) -> str:
    """The principal who sent ``message``: ``<channel>:<sender id>``.

    An operator's, an integration's or the gateway's action names its principal itself (``console:alice``,
    ``api:shop``, ``switchboard``); no channel can send one. A scheduled job's occurrence is ``schedule:<job id>``,
    which holds no permissions.
    """
    if isinstance(message.event, OperatorActed | ExternalEvent | Scheduled):
        return message.sender.id
    return f"{message.conversation.channel}:{message.sender.id}"


def session_state_sha256(slots: dict[str, Any]) -> str:
    """The hash of the session state an approval depends on: the session-state slots as stored."""
    return state_sha256({"slots": slots})


class _Origin(TypedDict):
    """The fields of a record that say which run asked, for whom, and until when."""

    session: str
    tenant: str
    agent: str
    channel: str
    run_id: str
    trace_id: str
    requested_by: str
    requested_at: float
    expires_at: float


def _origin(request: TurnRequest, policy: Policy, requested_by: str, now: float) -> _Origin:
    return _Origin(
        session=request.session_key,
        tenant=request.tenant,
        agent=request.agent.name,
        channel=request.messages[-1].conversation.channel,
        run_id=request.run_id,
        trace_id=request.trace_id,
        requested_by=requested_by,
        requested_at=now,
        expires_at=now + policy.approvals.expire_after_s,
    )


def approval_record(
    request: TurnRequest,
    approval: ApprovalRequest,
    policy: Policy,
    *,
    approval_id: str,
    state: str,
    call_id: str | None,
    requested_by: str,
    program: bytes | None = None,
    now: float | None = None,
) -> ApprovalRecord:
    """The ``pending`` record ``approval_id`` of a gated call of the run of ``request``.

    ``requested_by`` is the principal the call acts for (the tool context's actor): the user whose request it is,
    also when an operator's decision resumed the program that asks.
    """
    return ApprovalRecord(
        id=approval_id,
        **_origin(request, policy, requested_by, time.time() if now is None else now),
        request=approval,
        state_sha256=state,
        call_id=call_id,
        program=program.decode() if program is not None else None,
        approvers=policy.approvers(),
    )


def reply_record(
    request: TurnRequest,
    policy: Policy,
    draft: str,
    evidence: Sequence[str],
    *,
    approval_id: str,
    state: str,
    requested_by: str,
) -> ApprovalRecord:
    """A held reply (review mode): decided by operators, sent when approved."""
    return ApprovalRecord(
        id=approval_id,
        kind="reply",
        **_origin(request, policy, requested_by, time.time()),
        draft=draft,
        evidence=tuple(evidence),
        state_sha256=state,
        approvers=tuple(a for a in policy.approvers() if a != "requester") or ("operators",),
    )


def evidence_of(messages: Sequence[ChatMessage]) -> list[str]:
    """What a draft rests on, for its reviewer: the turn's tool calls and results, shortened."""
    lines: list[str] = []
    for message in messages:
        if message.role == "assistant":
            lines += [f"called {c.name}({_short(canonical_json(c.arguments))})" for c in message.tool_calls]
        elif message.role == "tool":
            lines.append(f"{message.name or 'tool'} → {_short(message.content)}")
    return lines[-_EVIDENCE_ITEMS:]


def _short(text: str, limit: int = _EVIDENCE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def approval_offer(record: ApprovalRecord, reply_to: str | None = None) -> OfferChoice:
    """The question on the conversation's channel: what would run, why it asks, until when, and how to answer."""
    assert record.request is not None, "a held reply is decided in the console"
    request = record.request
    lines = [f"Approval needed: {request.tool}({_short(canonical_json(request.arguments), _SHOWN_ARGUMENT_CHARS)})"]
    if request.resources:
        lines.append("Affects: " + ", ".join(request.resources))
    lines.append(f"Why: {request.reason}")
    if not request.reversible:
        lines.append("This cannot be undone.")
    lines.append(f"Expires: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(record.expires_at))}")
    lines.append(f"Reply /approve {record.id} or /deny {record.id}")
    card = ApprovalCard(
        id=record.id,
        tool=request.tool,
        title=title_of(ToolCall(id=record.call_id or record.id, name=request.tool, arguments=request.arguments)),
        reason=request.reason,
        expires_at=record.expires_at,
    )
    return OfferChoice(question="\n".join(lines), options=approval_options(record), reply_to=reply_to, approval=card)


def approval_options(record: ApprovalRecord) -> list[Choice]:
    """The decision buttons of a tool approval: Approve and Deny, each bound to the action's hash."""
    assert record.request is not None, "a held reply is decided in the console"
    digest = record.request.action_sha256
    return [
        Choice(id=option_id(record.id, "approve", digest), label="Approve"),
        Choice(id=option_id(record.id, "deny", digest), label="Deny"),
    ]


def waiting_content(record: ApprovalRecord) -> str:
    """The tool result the model reads for a call now waiting for a person (nothing ran yet)."""
    return canonical_json(
        {
            "status": "waiting_for_approval",
            "approval_id": record.id,
            "note": "not run yet: a person must approve it first; you will be told the outcome",
        }
    )
