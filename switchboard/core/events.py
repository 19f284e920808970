"""Facts appended to a session's event log, one per state transition.

The run state machine is ``queued → running → completed | failed | dead_lettered | cancelled``;
a failed attempt that will be retried is followed by another ``running``. A run that asked a person
(:class:`ApprovalRequested`) ends ``waiting_for_approval``: its worker slot is free, and the decision, an
inbound event of the session, starts the run that continues it (:class:`ApprovalDecided`,
:class:`ApprovalSettled`).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

__all__ = [
    "AccessPaired",
    "AccessRefused",
    "AccessRevoked",
    "ApprovalDecided",
    "ApprovalRequested",
    "ApprovalSettled",
    "BudgetAlerted",
    "BudgetExhausted",
    "CommandAnswered",
    "CompactionHeld",
    "ContextKept",
    "ControlChanged",
    "ConversationHandedOff",
    "DeliveryReported",
    "DropReason",
    "EgressDecision",
    "EgressRequested",
    "Event",
    "EventAdapter",
    "MemoryChanged",
    "MessageDropped",
    "MessageReceived",
    "PairingCodeIssued",
    "PersonLinked",
    "PersonUnlinked",
    "ReplySent",
    "RunCancelled",
    "RunCompleted",
    "RunDeadLettered",
    "RunDeferred",
    "RunFailed",
    "RunQueued",
    "RunStarted",
    "RunStatus",
    "SandboxUsed",
    "ScheduleSkipped",
    "SendDeadLettered",
    "SkillUsed",
    "StepRecorded",
    "ToolCalled",
    "TurnClassified",
    "UsageMetered",
    "VoiceReplied",
]

RunStatus = Literal["queued", "running", "waiting_for_approval", "completed", "failed", "dead_lettered", "cancelled"]


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True)

    at: float = Field(default_factory=time.time)
    """Unix time of the fact."""
    message_id: str | None = None
    """The inbound message the fact is about."""


class MessageReceived(_Event):
    """The gateway accepted a message (recorded atomically with the enqueue)."""

    kind: Literal["message_received"] = "message_received"
    channel: str
    sender: str
    chars: int
    access: str | None = None
    """With access control configured: the rule that admitted the sender (``allowlist:telegram:42``, ``paired``)."""
    role: str | None = None
    """With access control configured: the sender's role (``admin``, ``user``, ``guest``)."""


DropReason = Literal["inbox_full", "session_rate", "sender_rate"]
"""Which abuse limit refused a message: the session's inbox depth, its message rate, or its sender's."""


class ContextKept(_Event):
    """A group message that did not address the bot was kept as context for the session's next answered turn."""

    kind: Literal["context_kept"] = "context_kept"
    channel: str
    sender: str
    chars: int


class MessageDropped(_Event):
    """A platform message was over an abuse limit: answered 2xx (a refusal would only be retried), not queued."""

    kind: Literal["message_dropped"] = "message_dropped"
    channel: str
    sender: str
    reason: DropReason


class RunQueued(_Event):
    """A run is waiting for its turn."""

    kind: Literal["run_queued"] = "run_queued"


class RunStarted(_Event):
    """A worker took the session and started a run."""

    kind: Literal["run_started"] = "run_started"
    attempt: int
    epoch: int
    worker: str


class StepRecorded(_Event):
    """One step of the agent loop (a model decision)."""

    kind: Literal["step"] = "step"
    step: int
    decision: Literal["answer", "tool_calls", "program"]
    detail: dict[str, Any] = Field(default_factory=dict)


class ToolCalled(_Event):
    """A tool ran through the tool gateway."""

    kind: Literal["tool_called"] = "tool_called"
    tool: str
    ok: bool
    duration_ms: float
    call_id: str | None = None
    """The model's id of the call."""
    side_effect: Literal["read", "write"] = "read"
    error_class: str | None = None
    """``validation``, ``auth``, ``rate_limit``, ``transient``, ``ambiguous_timeout``, ``permanent``, ..."""
    idempotency_key: str | None = None
    action_sha256: str | None = None
    """Hash of the tool name and its canonical arguments."""
    variable: str | None = None
    """Variable a large result was bound to (``result_1``...)."""
    file: str | None = None
    """Workspace path a very large result was written to."""
    policy: str | None = None
    """What the policy decided (``allow:<rule>``, ``approve:<rule>``, ``observe:<rule>``, ``refuse:<rule>``)."""
    attempts: int = 1
    """Times the gateway ran the tool (retries of a transient failure add to it; 0: a recorded outcome reused)."""


class SandboxUsed(_Event):
    """Shell commands ran in a sandbox: which isolation applied (``bwrap+seccomp``, ``landlock+seccomp``, ``weak``)."""

    kind: Literal["sandbox_used"] = "sandbox_used"
    isolation: str
    commands: int
    timed_out: int = 0
    """Commands killed at their deadline."""
    duration_ms: float = 0.0


EgressDecision = Literal["allowed", "refused"]
"""What the egress proxy did with a request."""


class EgressRequested(_Event):
    """One outbound request of a sandboxed command or a tool, allowed or refused by the egress proxy.

    Never a header value, a body, a query string or a secret's value: only where it went and what became of it.
    """

    kind: Literal["egress_request"] = "egress_request"
    agent: str | None
    session: str | None
    method: str
    scheme: str
    host: str
    port: int
    path: str
    """The URL path, cut at 200 characters; the query string is never recorded (it may hold credentials)."""
    status: int
    """What the client was answered (the destination's status, or the proxy's own refusal)."""
    decision: EgressDecision
    reason: str | None = None
    """Why it was refused (``domain_not_allowed``, ``loopback``, ``placeholder_unbound``, …)."""
    bytes_out: int = 0
    """Request body bytes sent on."""
    bytes_in: int = 0
    """Response body bytes passed back."""
    secrets: tuple[str, ...] = ()
    """Names of the secrets injected (never their values)."""
    duration_ms: float = 0.0


class SkillUsed(_Event):
    """The agent loaded a skill: the exact package copied into the session workspace."""

    kind: Literal["skill_used"] = "skill_used"
    name: str
    version: str
    sha256: str
    """Content hash of the package (the same files always give the same hash)."""
    source: Literal["builtin", "template", "local"]


class MemoryChanged(_Event):
    """A fact of a project was remembered, linked, corrected or forgotten: who and why, never its text."""

    kind: Literal["memory_changed"] = "memory_changed"
    op: Literal["remembered", "linked", "corrected", "forgotten"]
    fact_id: str
    project: str
    actor: str
    agent: str
    run_id: str
    reason: str = ""
    source_kind: str = ""
    """The kind of source the fact cites (``message``, ``file``, ``tool_result``, ``url``), for writes with one."""


class UsageMetered(_Event):
    """What a turn spent: steps, tool calls, tokens and credits (from the price table), or its spoken reply's cost."""

    kind: Literal["usage_metered"] = "usage_metered"
    model: str
    steps: int
    tool_calls: int
    input_tokens: int
    output_tokens: int
    credits: float
    stopped_by: str | None = None
    """The budget that ended the turn early, if any."""
    policy_version: str = ""
    """The version of the policy the run's tool calls were checked against."""
    characters: int = 0
    """Characters spoken: set on the metering of a voice reply's speech request (not a run of its own)."""
    task_class: str = ""
    """The agent's task class the turn ran under (``docs/budgets.md``); empty: none declared or matched."""
    cached_input_tokens: int = 0
    """Of ``input_tokens``, those read from the provider's prompt cache (``docs/caching.md``)."""
    cache_write_tokens: int = 0
    """Of ``input_tokens``, those written to the provider's prompt cache."""
    agent: str = ""
    """The agent that ran the turn (empty on a voice reply's metering)."""
    prompt_version: str = ""
    """The digest of the agent's system prompt and tool catalog the turn ran with (its prompt version)."""
    duration_ms: float = 0.0
    """How long the turn ran, from its start to this metering."""


class CompactionHeld(_Event):
    """A turn stopped for review before its model step: fitting the context would have summarised away open actions.

    An approval waiting, a write in doubt or a call without its result could no longer be kept word for word; the
    model was not asked, the user was told a person reviews first (``stopped_by="compaction"``).
    """

    kind: Literal["compaction_held"] = "compaction_held"
    actions: list[dict[str, Any]]
    """Each open action: ``kind``, ``tool``, ``call_id``, ``approval_id`` (never its arguments)."""
    max_input_tokens: int
    reason: str = ""
    """What the operator reads: which actions wait for a review."""


class TurnClassified(_Event):
    """A turn was put in one of its agent's task classes, and runs under that class's budgets."""

    kind: Literal["turn_classified"] = "turn_classified"
    task_class: str
    rule: str
    """The condition that matched (``keyword:price``, ``command:research``, ``channel:slack``, ``default``)."""
    max_steps: int
    max_tokens: int | None = None
    max_credits: float | None = None
    deadline_s: float
    """Seconds the turn may run, from its start."""


class BudgetAlerted(_Event):
    """A period budget's spend reached one of its ``alert_at`` thresholds (reported once per threshold and period)."""

    kind: Literal["budget_alerted"] = "budget_alerted"
    tenant: str
    scope: Literal["tenant", "agent", "user"]
    subject: str
    """The tenant, agent or user (person id or principal) whose budget it is."""
    period: str
    """The period's stamp (``2026-12-07``, ``2026-12``)."""
    threshold: float
    spent: float
    credits: float
    """The budget."""


class BudgetExhausted(_Event):
    """A run was refused before the model was asked: a period budget that applies to it is used up."""

    kind: Literal["budget_exhausted"] = "budget_exhausted"
    tenant: str
    scope: Literal["tenant", "agent", "user"]
    subject: str
    period: str
    spent: float
    credits: float


class PersonLinked(_Event):
    """Two principals were linked to one person (by an operator, or by the person with a one-time code)."""

    kind: Literal["person_linked"] = "person_linked"
    tenant: str
    person: str
    principals: tuple[str, ...]
    by: str
    """``operator:<name>``, ``cli``, or ``code`` (the person, verified on both sides)."""


class PersonUnlinked(_Event):
    """A principal no longer belongs to a person."""

    kind: Literal["person_unlinked"] = "person_unlinked"
    tenant: str
    person: str
    principal: str
    by: str


class ApprovalRequested(_Event):
    """A gated effect (or, in review mode, a held reply) waits for a person: the run is ``waiting_for_approval``."""

    kind: Literal["approval_requested"] = "approval_requested"
    approval_id: str
    approval_kind: Literal["tool", "reply"] = "tool"
    tool: str | None = None
    """The gated tool (``None`` for a held reply)."""
    rule: str = ""
    policy_version: str = ""
    action_sha256: str
    expires_at: float
    program: bool = False
    """The call came from a CodeAct program, paused at it (its signed snapshot is in the record)."""
    status: RunStatus = "waiting_for_approval"


class ApprovalDecided(_Event):
    """A decision reached an approval: what it asked, who made it, and what the store did with it."""

    kind: Literal["approval_decided"] = "approval_decided"
    approval_id: str
    verdict: Literal["approve", "deny", "expire"]
    actor: str
    via: Literal["button", "command", "console", "expiry"]
    result: str
    """:data:`~switchboard.core.approvals.records.DecideResult` (``applied``: this decision counted), or
    ``not_allowed``."""
    waited_ms: float | None = None
    """From the request to this decision."""


class ApprovalSettled(_Event):
    """An approval's end: the effect ran, was refused at the re-check, or did not happen (denied, expired, ...)."""

    kind: Literal["approval_settled"] = "approval_settled"
    approval_id: str
    status: Literal["executed", "refused", "denied", "expired", "superseded", "sent"]
    reason: str | None = None
    """Why it was refused (``stale_state``, ``approval_mismatch``, ``refused_by_policy``, ...)."""


class ControlChanged(_Event):
    """An operator took the conversation over, or handed it back to the agent."""

    kind: Literal["control_changed"] = "control_changed"
    action: Literal["take_over", "hand_back"]
    operator: str


class ReplySent(_Event):
    """A reply reached the platform."""

    kind: Literal["reply_sent"] = "reply_sent"
    chars: int
    parts: int = 1


class VoiceReplied(_Event):
    """What became of a reply's voice note: sent, or why the reply stayed text only."""

    kind: Literal["voice_replied"] = "voice_replied"
    outcome: Literal["sent", "too_long", "failed", "undelivered"]
    """``too_long``: over the agent's ``voice.max_chars`` (not spoken); ``failed``: the speech request failed;
    ``undelivered``: spoken, but the channel refused the audio."""
    model: str
    chars: int
    """Characters of the text spoken (or that would have been)."""
    seconds: float | None = None
    """Length of the audio, when there was one."""
    reason: str = ""
    """Why it failed, in a few words (never the provider's own text)."""


class RunCompleted(_Event):
    """The run finished and its reply was delivered."""

    kind: Literal["run_completed"] = "run_completed"
    duration_ms: float


class RunFailed(_Event):
    """An attempt failed; it will be retried unless a dead letter follows."""

    kind: Literal["run_failed"] = "run_failed"
    attempt: int
    error: str


class RunDeadLettered(_Event):
    """The message kept failing and was set aside with its reason."""

    kind: Literal["run_dead_lettered"] = "run_dead_lettered"
    attempts: int
    reason: str


class RunCancelled(_Event):
    """The run was cancelled."""

    kind: Literal["run_cancelled"] = "run_cancelled"
    reason: str


class RunDeferred(_Event):
    """The model provider asked to wait: the turn was put off until ``until`` (not counted as a failure)."""

    kind: Literal["run_deferred"] = "run_deferred"
    until: float
    """Unix time before which the message does not run again."""
    reason: str


class DeliveryReported(_Event):
    """The platform reported what became of a message the gateway sent (WhatsApp statuses, Messenger receipts)."""

    kind: Literal["delivery_reported"] = "delivery_reported"
    channel: str
    status: Literal["sent", "delivered", "read", "failed"]
    platform_id: str = ""
    """The platform's id of the message it is about (empty: a read mark covering everything before ``at``)."""
    error: str = ""
    """For ``failed``: the platform's error code and title (never message text)."""


class SendDeadLettered(_Event):
    """A finished turn's reply could not be delivered (refused, or out of attempts); the turn stays completed."""

    kind: Literal["send_dead_lettered"] = "send_dead_lettered"
    attempts: int
    reason: str


class AccessRefused(_Event):
    """Access control refused a message (``switchboard.core.access``): nothing was queued, no model was asked."""

    kind: Literal["access_refused"] = "access_refused"
    channel: str
    sender: str
    reason: Literal["not_allowed", "group_not_allowed", "not_allowed_in_group", "pairing_required"]
    rule: str
    """The rule that refused it (``allowlist``, ``groups``, ``group:<id>``, ``pairing``)."""
    answered: bool
    """Whether the sender was told (the answer is rate-limited per sender)."""


class PairingCodeIssued(_Event):
    """An unknown sender got a one-time pairing code (the code itself is never recorded)."""

    kind: Literal["pairing_code_issued"] = "pairing_code_issued"
    channel: str
    sender: str
    expires_at: float


class AccessPaired(_Event):
    """An operator approved a sender's pairing code: the sender may talk to the tenant's agents."""

    kind: Literal["access_paired"] = "access_paired"
    principal: str
    role: str
    """The role the operator chose, or ``default`` (the account's ``pairing.role``)."""
    operator: str


class AccessRevoked(_Event):
    """An operator revoked a paired sender's access."""

    kind: Literal["access_revoked"] = "access_revoked"
    principal: str
    operator: str


class ScheduleSkipped(_Event):
    """An occurrence of a scheduled job was not delivered into the session, and why.

    ``reason``: ``misfire`` (found later than its grace with ``misfire: skip``), ``window_closed`` (WhatsApp's or
    Messenger's 24-hour window is closed and the job has no template or tag to send instead).
    """

    kind: Literal["schedule_skipped"] = "schedule_skipped"
    job_id: str
    due_at: float
    reason: Literal["misfire", "window_closed"]
    detail: str = ""


class ConversationHandedOff(_Event):
    """An agent handed the conversation to another (the ``handoff`` tool): the next messages go to ``to``."""

    kind: Literal["conversation_handed_off"] = "conversation_handed_off"
    from_agent: str
    to: str
    reason: str
    history: Literal["none", "summary", "full"]
    """What the receiving agent may see of the conversation (``handoff.history``)."""
    carried: int
    """How many history entries the receiving agent got (the handing agent's note included)."""


class CommandAnswered(_Event):
    """A chat command the gateway answered without a model call (``/status``, ``/model``, ``/whoami``, ``/help``).

    ``outcome``: ``answered``, ``refused`` (the sender's role may not use it), or ``switched`` (``/model`` changed
    the conversation's model to ``detail``).
    """

    kind: Literal["command_answered"] = "command_answered"
    command: str
    role: Literal["admin", "user", "guest"]
    outcome: Literal["answered", "refused", "switched"]
    detail: str = ""


Event = Annotated[
    MessageReceived
    | MessageDropped
    | ContextKept
    | AccessRefused
    | PairingCodeIssued
    | AccessPaired
    | AccessRevoked
    | RunQueued
    | RunStarted
    | StepRecorded
    | ToolCalled
    | SandboxUsed
    | EgressRequested
    | SkillUsed
    | MemoryChanged
    | UsageMetered
    | TurnClassified
    | CompactionHeld
    | ReplySent
    | VoiceReplied
    | RunCompleted
    | RunFailed
    | RunDeadLettered
    | RunCancelled
    | RunDeferred
    | SendDeadLettered
    | DeliveryReported
    | ApprovalRequested
    | ApprovalDecided
    | ApprovalSettled
    | ControlChanged
    | BudgetAlerted
    | BudgetExhausted
    | PersonLinked
    | PersonUnlinked
    | ScheduleSkipped
    | ConversationHandedOff
    | CommandAnswered,
    Field(discriminator="kind"),
]
"""Any event-log fact."""

EventAdapter: TypeAdapter[Event] = TypeAdapter(Event)
"""Validates and dumps events to and from JSON."""
