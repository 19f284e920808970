"""Tool definitions: typed inputs, side-effect and risk classes, permission, timeout, owner, cost."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from switchboard.core.actions import Action
from switchboard.core.turn import SessionStore
from switchboard.types import SessionKey

__all__ = ["Risk", "SideEffect", "Tool", "ToolContext"]

SideEffect = Literal["read", "write"]
Risk = Literal["low", "medium", "high"]


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
    permissions: frozenset[str] = frozenset()
    """Permissions granted to the principal, checked by the gateway outside the model."""


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
    """Credits against the turn's budget (DESIGN §6: read 1, write 5, full 6; custom 1)."""
    connector: str = "builtin"
    """Circuit breakers trip per connector."""
    retry_on: frozenset[str] = field(default_factory=lambda: frozenset({"rate_limit", "transient"}))
    """Error classes the gateway may retry (never ``validation`` or ``auth``)."""
