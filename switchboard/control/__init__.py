"""The control services operators use — the console (``switchboard.web.console``) and the CLI — one implementation.

See :class:`ControlService`. Every call is scoped to an operator's tenants (:class:`OperatorScope`).
"""

from __future__ import annotations

from switchboard.control.scope import (
    ALL_TENANTS,
    ControlError,
    InvalidRequestError,
    NotFoundError,
    OperatorScope,
    OutOfScopeError,
)
from switchboard.control.service import MAX_SAY_CHARS, ControlService
from switchboard.control.views import (
    SESSION_STATES,
    Accepted,
    AgentView,
    DeadLetterView,
    DoubtView,
    SessionState,
    SessionView,
    TimelineEntry,
    ToolView,
    TranscriptItem,
    UsageRow,
)

__all__ = [
    "ALL_TENANTS",
    "MAX_SAY_CHARS",
    "SESSION_STATES",
    "Accepted",
    "AgentView",
    "ControlError",
    "ControlService",
    "DeadLetterView",
    "DoubtView",
    "InvalidRequestError",
    "NotFoundError",
    "OperatorScope",
    "OutOfScopeError",
    "SessionState",
    "SessionView",
    "TimelineEntry",
    "ToolView",
    "TranscriptItem",
    "UsageRow",
]
