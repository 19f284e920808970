"""The contract between a session drain (③) and the agent runtime (④) for one turn."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from switchboard.core.access import Role
from switchboard.core.actions import SettleChoices, ShowToolCall
from switchboard.core.agent.config import Agent
from switchboard.core.approvals.policy import Policy
from switchboard.core.events import Event
from switchboard.core.messages import InboundMessage
from switchboard.types import SessionKey

__all__ = ["ActivitySink", "HistoryEntry", "SessionStore", "SteeringSink", "TurnRequest", "TurnResult", "TurnSink"]


class HistoryEntry(BaseModel):
    """One message of the conversation as the agent remembers it.

    Assistant entries that called tools carry ``meta.tool_calls`` (``[{"id", "name", "arguments"}]``); tool
    entries carry ``meta.call_id``, ``meta.tool`` and, for outside text, ``meta.trust == "data"``. Entries the
    turn produced after untrusted content had entered its context carry ``meta.untrusted`` (see
    :attr:`untrusted`).
    """

    model_config = ConfigDict(frozen=True)

    role: Literal["user", "assistant", "tool"]
    text: str
    message_id: str | None = None
    at: float = Field(default_factory=time.time)
    meta: dict[str, Any] = Field(default_factory=dict)

    @property
    def untrusted(self) -> bool:
        """Outside text (``meta.trust == "data"``), or written with outside text in view (``meta.untrusted``)."""
        return self.meta.get("trust") == "data" or self.meta.get("untrusted") is True


class TurnRequest(BaseModel):
    """Everything one turn starts from: ``messages`` holds one message, or several (all waiting, folded)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    session_key: SessionKey
    agent: Agent
    messages: Sequence[InboundMessage]
    run_id: str
    """Stable across re-runs of the same turn (derived from the first message id), so idempotency keys repeat."""
    deadline: float
    """Unix time by which the turn must end."""
    tenant: str = "default"
    request_id: str = ""
    trace_id: str = ""
    actor: str = ""
    """Who the run acts for; empty means the sender of the last message."""
    role: Role = "user"
    """The least trusted role among the turn's senders (``switchboard.core.access``): the policy's ``role`` rules
    read it, and a tool they refuse it outright is not offered to the model."""
    person: str = ""
    """The person the actor's principal is linked to (``docs/identity.md``); empty: not linked, or not looked up."""
    goal: str = ""
    """What the caller wants from the turn, when it is more than answering the message (console, API)."""
    policy_version: str = ""
    """Version of the policy the turn runs under (recorded with approvals and events)."""
    policy: Policy | None = None
    """The turn's effective policy (``switchboard.core.approvals.grants.resolve_policy``); ``None``: the agent's own
    block."""
    step_budget: int | None = None
    """Narrows ``agent.limits.max_steps`` for this turn."""
    token_budget: int | None = None
    """Input plus output tokens this turn may use (narrows ``agent.limits.max_turn_tokens``)."""
    credit_budget: float | None = None
    """Credits this turn may spend (narrows ``agent.limits.max_credits``)."""
    task_class: str = ""
    """The agent's task class the turn was classified into (its budgets set the three above); empty: none."""
    task_rule: str = ""
    """The condition that picked :attr:`task_class` (``keyword:price``, ``command:research``, ``default``)."""
    permissions: frozenset[str] = frozenset()
    """Permissions of the principal, checked by the tool gateway outside the model."""
    permissions_of: Callable[[str], frozenset[str]] | None = None
    """Permissions of any principal under this turn's configuration: an approved action runs with its requester's,
    whoever approved it (``None``: the requester keeps :attr:`permissions` only when it is the actor)."""


class TurnResult(BaseModel):
    """What a turn produced."""

    model_config = ConfigDict(frozen=True)

    text: str
    steps: int
    input_tokens: int = 0
    output_tokens: int = 0
    credits: float = 0.0
    stopped_by: str | None = None
    """The budget that ended the turn early, if any."""
    history: list[HistoryEntry] = Field(default_factory=list)
    """The turn's tool calls and their results, in order (the answer is not among them): the queue layer stores
    them between the user's message and the answer, and the next turn's context is built from them."""
    waiting_for: list[str] = Field(default_factory=list)
    """Approvals the run now waits for (its state is ``waiting_for_approval``): the decision, an inbound event of
    the session, continues it in a later turn. Empty: the run is done."""


class TurnSink(Protocol):
    """Where a turn reports progress while it runs; implemented by the queue layer (fenced writes)."""

    async def delta(self, text: str) -> None:
        """A piece of the reply, as the model streams it."""

    async def event(self, event: Event) -> None:
        """Append a fact to the session's event log."""


@runtime_checkable
class ActivitySink(TurnSink, Protocol):
    """A sink that shows the turn's work as it happens: each tool call as it starts and ends, each decided offer.

    Best effort and never the reply: a channel that cannot show them is sent nothing. A sink without this method
    shows nothing.
    """

    async def activity(self, action: ShowToolCall | SettleChoices) -> None:
        """Show ``action`` on the conversation's channel, if it shows such things."""


@runtime_checkable
class SteeringSink(TurnSink, Protocol):
    """A sink that can hand the running turn messages the user sent while it runs (the ``steer`` busy policy).

    The runtime asks before each model call and adds what comes back as the user's words, so the next request
    carries them; the queue layer acks them with the turn. A sink without this method steers nothing.
    """

    async def steered(self) -> Sequence[InboundMessage]:
        """Messages accepted for the session since the turn last asked, oldest first (each given once; often none)."""


class SessionStore(Protocol):
    """Per-session storage the runtime needs; every write is fenced by the session lease."""

    async def load_history(self, limit: int) -> list[HistoryEntry]:
        """The most recent ``limit`` entries, oldest first."""

    async def append_history(self, entries: Sequence[HistoryEntry]) -> None:
        """Append entries (capped by the store)."""

    async def load_slots(self) -> dict[str, Any]:
        """The session-state slots (``plan``, ``context``, ``state``) and their ``untrusted`` marks, as stored."""

    async def save_slot(self, name: str, value: Any) -> None:
        """Overwrite one slot."""
