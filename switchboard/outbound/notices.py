"""What the user is told when a message fails, is put off, or its reply cannot be delivered.

Each notice names the kind of failure and whether the message will still be answered; none carries the error
text itself (it may hold a provider's words, a URL or a key fragment): that stays in the event log and the
dead-letter record, for operators.
"""

from __future__ import annotations

import math
from typing import Final, Literal

from switchboard.errors import BudgetExceededError, ModelError

__all__ = [
    "CANCELLED_TEXT",
    "DEAD_LETTER_CODE",
    "DEFER_NOTICE_S",
    "FailureKind",
    "dead_letter_text",
    "deferred_text",
    "failure_kind",
    "undelivered_text",
]

CANCELLED_TEXT: Final = "You stopped this reply."
"""What a streaming channel shows where a reply stopped on request ended."""
DEAD_LETTER_CODE: Final = "dead_lettered"
"""The ``SendError.code`` of a message that will not be answered."""
DEFER_NOTICE_S: Final = 30.0
"""A turn put off for at least this long tells the user so (a shorter wait passes unremarked)."""
"""The ``SendError.code`` of a message that will not be answered."""

FailureKind = Literal["model_unavailable", "model_auth", "limits", "internal"]
"""What went wrong, as far as the user is concerned."""

_KINDS: Final[dict[FailureKind, str]] = {
    "model_unavailable": "The AI model provider is not answering right now",
    "model_auth": "The assistant's access to its AI model is misconfigured (an operator needs to fix it)",
    "limits": "Answering this message went past the time or work the assistant is allowed",
    "internal": "An internal error stopped this reply",
}


def failure_kind(err: BaseException | None) -> FailureKind:
    """Classify a failed attempt's error for the user (``None``: the worker running it was lost)."""
    if isinstance(err, ModelError):
        return "model_auth" if err.code in ("auth", "quota") else "model_unavailable"
    if isinstance(err, BudgetExceededError | TimeoutError):
        return "limits"
    return "internal"


def dead_letter_text(kind: FailureKind) -> str:
    """The notice for a message set aside after its last attempt: what failed, and that it is not retried."""
    return f"{_KINDS[kind]}, so this message could not be answered. It will not be retried; please send it again later."


def deferred_text(wait_s: float) -> str:
    """The notice for a turn put off because the model provider asked to wait ``wait_s`` seconds."""
    if wait_s < 90:
        when = f"{max(math.ceil(wait_s), 1)} seconds"
    else:
        minutes = math.ceil(wait_s / 60)
        when = "1 minute" if minutes == 1 else f"{minutes} minutes"
    return f"The AI model provider is rate-limiting us; your message will be answered in about {when}."


def undelivered_text() -> str:
    """The notice for a reply the platform would not take (sent best effort: the platform may refuse it too)."""
    return "A reply was written for this message, but it could not be delivered here. It will not be retried."
