"""What the control services return: plain, JSON-friendly records (``dataclasses.asdict``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from switchboard.types import SESSION_STATES, SessionState

__all__ = [
    "SESSION_STATES",
    "Accepted",
    "AgentView",
    "DeadLetterView",
    "DoubtView",
    "SessionState",
    "SessionView",
    "TimelineEntry",
    "ToolView",
    "TranscriptItem",
    "TranscriptKind",
    "UsageRow",
]


@dataclass(frozen=True, slots=True)
class SessionView:
    """One session and its live state."""

    key: str
    tenant: str
    agent: str
    channel: str
    state: SessionState
    last_activity: float
    """Unix time of the last message accepted or turn finished."""
    inbox_depth: int
    controlled_by: str | None
    """The operator who took it over, if one did."""
    pending_approvals: int
    received: int
    dead_letters: int


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One event of a session's log."""

    id: str
    """The stream entry id."""
    at: float | None
    kind: str
    trace_id: str | None
    """The trace of the request the event belongs to (32 hex digits), when it names a message."""
    data: dict[str, Any] = field(default_factory=dict)
    """The event's other fields."""


TranscriptKind = Literal["user", "agent", "tool_call", "approval", "operator", "notice"]
"""``user``: what the user said; ``agent``: the agent's answer; ``tool_call``: a call with its arguments and result;
``approval``: a gated action asked, decided and settled; ``operator``: a take-over, an operator's message or a
hand-back; ``notice``: a failed, deferred, cancelled or dead-lettered run."""


@dataclass(frozen=True, slots=True)
class TranscriptItem:
    """One line of a session's transcript, built from its history and its event log."""

    kind: TranscriptKind
    at: float | None
    actor: str = ""
    """Who: the user's principal, ``agent``, or the operator's principal."""
    action: str = ""
    """``user``: ``queued`` while the message waits for the agent; ``operator``: ``take_over``, ``say`` or
    ``hand_back``; ``approval``: its last status; ``notice``: the event."""
    text: str = ""
    """The words (``user``, ``agent``, ``operator``), or what happened (``approval``, ``notice``)."""
    tool: str | None = None
    arguments: Any = None
    """A tool call's arguments as the model gave them."""
    result: str | None = None
    """A tool call's result as the agent saw it (data, never markup)."""
    ok: bool | None = None
    untrusted: bool = False
    """Outside content (a data-class tool result), or written with it in view."""
    redacted: bool = False
    """The operator's role may not read messages: ``text``, ``arguments`` and ``result`` are withheld."""
    events: list[TimelineEntry] = field(default_factory=list)
    """The event-log entries this line stands for."""


@dataclass(frozen=True, slots=True)
class DeadLetterView:
    """One dead-lettered turn (its messages were set aside after their last attempt)."""

    id: str
    """The entry id in the operators' stream of dead letters (what :meth:`ControlService.requeue` takes)."""
    session: str
    message_ids: list[str]
    attempts: int
    reason: str
    at: float
    preview: str
    """The start of the first message's text (operators of the tenant may read the conversation)."""
    requeued: bool


@dataclass(frozen=True, slots=True)
class DoubtView:
    """An effect in doubt: claimed, never recorded as done; it waits for an operator to say what happened."""

    session: str
    key: str
    """The effect's idempotency key."""
    tool: str
    run_id: str
    action_sha256: str
    started_at: float | None
    at: float
    """When it was reported in doubt."""
    info: dict[str, Any]
    resolution: str | None = None
    """``done`` (it happened) or ``failed`` (it did not), once resolved."""
    resolved_by: str | None = None
    resolved_at: float | None = None


@dataclass(frozen=True, slots=True)
class ToolView:
    """One tool of an agent."""

    name: str
    side_effect: str
    risk: str


@dataclass(frozen=True, slots=True)
class AgentView:
    """One configured agent: status, model, tools, limits and what it spent in the operator's tenants."""

    name: str
    status: str
    model: str
    tools: list[ToolView]
    max_credits: float | None
    credits: float
    runs: int


@dataclass(frozen=True, slots=True)
class UsageRow:
    """What one agent spent for one tenant (summed from the sessions' metered usage)."""

    tenant: str
    agent: str
    credits: float
    input_tokens: int
    output_tokens: int
    runs: int


@dataclass(frozen=True, slots=True)
class Accepted:
    """An operator's action was queued into its session (applied by the worker, in order with the conversation)."""

    message_id: str
    duplicate: bool


@dataclass(frozen=True, slots=True)
class BudgetView:
    """One period budget counter: who spends against it, how much of it is spent, the alerts already reported."""

    tenant: str
    scope: str
    subject: str
    period: str
    spent: float
    credits: float
    alerts: tuple[float, ...]
    resets_at: float
    """When the period ends (Unix time)."""


@dataclass(frozen=True, slots=True)
class BudgetAlertView:
    """One budget alert, as the operators' stream holds it."""

    tenant: str
    at: float
    scope: str
    subject: str
    period: str
    threshold: float
    spent: float
    credits: float


@dataclass(frozen=True, slots=True)
class PersonView:
    """One person of a tenant and the principals linked to them."""

    tenant: str
    person: str
    principals: list[str]
