"""What the control services return: plain, JSON-friendly records (``dataclasses.asdict``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "Accepted",
    "AgentView",
    "DeadLetterView",
    "DoubtView",
    "SessionState",
    "SessionView",
    "TimelineEntry",
    "ToolView",
    "UsageRow",
]

SessionState = Literal[
    "reasoning", "waiting_for_data", "waiting_for_approval", "retrying", "queued", "done", "taken_over"
]
"""``taken_over``: an operator holds it; ``reasoning``: a worker runs its turn; ``waiting_for_data``: the turn waits on
a tool call; ``retrying``: its last attempt failed or the provider asked to wait; ``waiting_for_approval``: a gated
action waits for a decision; ``queued``: messages wait for a worker; ``done``: nothing to do."""


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
