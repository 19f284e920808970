"""Tool definitions: typed inputs, side-effect and risk classes, permission, timeout, owner, cost."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from switchboard.core.access import Role
from switchboard.core.actions import Action
from switchboard.core.approvals.policy import Policy
from switchboard.core.events import Event
from switchboard.core.memory.evidence import TurnEvidence
from switchboard.core.sql.databases import SharedDatabase
from switchboard.core.tools.effects import EffectStore
from switchboard.core.tools.status import StatusMessages
from switchboard.core.tools.threads import ThreadShare
from switchboard.core.turn import SessionStore
from switchboard.core.workspaces.disk import Workspaces
from switchboard.skills.package import SkillRef
from switchboard.types import SessionKey

__all__ = ["OutputTrust", "Risk", "SideEffect", "Tool", "ToolContext"]

SideEffect = Literal["read", "write"]
Risk = Literal["low", "medium", "high"]
OutputTrust = Literal["tool", "data"]
"""``tool``: the tool's own output; ``data``: text from outside (documents, files, pages), untrusted."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool may know about the call it serves; never credentials."""

    session_key: SessionKey
    tenant: str
    run_id: str
    actor: str
    """Who the run acts for (the sender of the message)."""
    workspace: Path
    """The session's own directory; file tools are confined to it."""
    idempotency_key: str
    """Derived from (run, logical action); the same key always means the same effect."""
    store: SessionStore | None = None
    act: Callable[[Action], Awaitable[None]] | None = None
    """Perform a channel send action for the conversation (send a file, offer a choice)."""
    record: Callable[[Event], Awaitable[None]] | None = None
    """Append a fact to the session's event log (the sandbox a command ran in)."""
    status: StatusMessages | None = None
    """Live status messages on the conversation's channel, for a call that runs a while (``None``: none shown)."""
    permissions: frozenset[str] = frozenset()
    """Permissions granted to the principal, checked by the gateway outside the model."""
    workspaces: Workspaces | None = None
    """Every workspace and its quotas (set by the gateway); ``None``: the session quota alone applies."""
    threads: ThreadShare | None = None
    """The tool threads and this session's share of them (set by the gateway); ``None``: the process default."""
    effects: EffectStore | None = None
    """Idempotency records of write effects (``None``: none kept, every call runs)."""
    untrusted_context: bool = False
    """Untrusted content (a document, a file, a search result) has entered this turn's context."""
    untrusted_sources: tuple[str, ...] = ()
    """What brought it in, as a reviewer should read it (``the output of shell``, ``a file the user sent``)."""
    policy: Policy = field(default_factory=Policy)
    """The turn's effective policy (agent, channel, tenant): decides each call (see
    :mod:`switchboard.core.approvals.policy`)."""
    databases: Mapping[str, SharedDatabase] = field(default_factory=dict)
    """The agent's shared read-only databases by name, attached to its ``sql`` connections."""
    skills: tuple[SkillRef, ...] = ()
    """The agent's skills, resolved once per turn: the packages its context lists and ``use_skill`` loads."""
    agent: str = ""
    """The agent the call serves (whose egress allowlist a sandboxed command gets); empty: no agent, no egress."""
    role: Role = "user"
    """The turn's role (``switchboard.core.access``), which the policy's ``role`` rules match."""
    evidence: TurnEvidence | None = None
    """The messages and tool results the turn has in view, which a memory write must cite (``None``: none)."""


@dataclass(frozen=True, slots=True)
class Tool:
    """One tool the agent may call."""

    name: str
    description: str
    input: type[BaseModel]
    fn: Callable[[Any, ToolContext], Awaitable[Any]]
    """Receives the validated input model and the context; returns JSON-able data."""
    side_effect: SideEffect = "read"
    risk: Risk = "low"
    permission: str | None = None
    """Permission the principal needs (``None``: anyone who can talk to the agent)."""
    timeout_s: float = 30.0
    owner: str = "builtin"
    cost: int = 1
    """Credits against the turn's budget (docs/ARCHITECTURE.md §6: read 1, write 5, full 6; custom 1)."""
    connector: str = ""
    """Circuit breakers trip per connector (a service or a family of tools); empty: the tool is its own."""
    retry_on: frozenset[str] = field(default_factory=lambda: frozenset({"rate_limit", "transient"}))
    """Error classes the gateway may retry (never ``validation`` or ``auth``)."""
    key_fields: tuple[str, ...] = ()
    """Arguments naming the logical action, for idempotency keys (``path`` for ``send_file``); empty: all."""
    output_trust: OutputTrust = "tool"
    """``data`` when results carry outside text: shown as a data block, and later risky writes need confirmation."""
    max_inline_bytes: int | None = None
    """The tool bounds its own output (a ranged read): results up to this size are shown inline, never carded."""
    reversible: bool = True
    """The effect can be undone (a file rewritten, a slot updated); an irreversible write of medium risk or more
    needs approval by default."""
    idempotent: bool = False
    """The downstream honours the idempotency key: only then are transient or ambiguous failures of a write
    retried (a rate limit means not performed, and is retried either way)."""
    resources: Callable[[Any], tuple[str, ...]] | None = None
    """What a call affects, from its validated input (a path, a recipient, an amount), as a reviewer reads it."""
    per_agent: Callable[[str], Tool] | None = None
    """The tool as one agent (by name) has it, when its risk or description follow that agent's own configuration
    (``shell``: network only for an agent with an egress allowlist); ``None``: the same for every agent."""

    def affected(self, validated: BaseModel) -> tuple[str, ...]:
        """The resources a call with the ``validated`` input touches (empty when the tool names none)."""
        if self.resources is None:
            return ()
        return tuple(str(item) for item in self.resources(validated))

    @property
    def breaker_key(self) -> str:
        """The circuit breaker this tool's failures count against."""
        return self.connector or self.name
