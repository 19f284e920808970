"""What a turn has in view, for checking the source a fact cites (nothing plausible goes to durable memory).

The runtime implements :class:`TurnEvidence` over the running turn; the ``remember`` and ``correct`` tools read it
through :attr:`~switchboard.core.tools.definition.ToolContext.evidence`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["SeenMessage", "SeenToolResult", "TurnEvidence"]


@dataclass(frozen=True, slots=True)
class SeenMessage:
    """A user message in the turn's context."""

    message_id: str
    text: str


@dataclass(frozen=True, slots=True)
class SeenToolResult:
    """A tool result of this run, with the call that produced it."""

    call_id: str
    tool: str
    arguments: Mapping[str, Any]
    text: str


class TurnEvidence(Protocol):
    """The messages and tool results a fact may cite."""

    def messages(self) -> Sequence[SeenMessage]:
        """User messages in the conversation's context (this turn's and the loaded history's)."""
        ...

    def tool_results(self) -> Sequence[SeenToolResult]:
        """Tool results produced by this run so far."""
        ...
