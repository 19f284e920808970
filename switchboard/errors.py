"""The one error root of Switchboard.

::

    SwitchboardError
    ├── ConfigError                 bad settings or YAML; names the field and how to fix it
    ├── RequestError                bad input at the edge; carries the HTTP status to answer
    │   ├── SignatureError          401/403: the request is not from the platform
    │   ├── MalformedBodyError      400: not JSON, or not the platform's shape
    │   └── BodyTooLargeError       413: over the size cap
    ├── QueueUnavailableError       Redis did not confirm in time; answer 503 so the platform retries
    ├── FencedWriteError            a write by a worker whose session lease has passed to another epoch
    ├── LayoutError                 the data's key layout is not this release's (``switchboard migrate``)
    ├── DeliveryError               a platform send failed
    │   └── RateLimitedError        the platform said 429; carries ``retry_after``
    ├── AttachmentError             a file the user sent could not be fetched (too large, gone, refused)
    ├── SpeechError                 text-to-speech failed; the reply goes out as text alone
    ├── SourceUnreadableError       a knowledge source could not be read (missing, too large, refused, unparsable)
    └── AgentError                  the agent run failed
        ├── RunCancelledError       the user (``/stop``) or an operator stopped the run
        ├── BudgetExceededError     a step, deadline, token or output budget ran out
        ├── ToolError               a tool failed; carries ``error_class`` (and ``retry_after``) for the gateway
        └── ModelError              the model provider failed
            └── ReplayDivergedError a replayed run asked for a step the recording does not have
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

__all__ = [
    "MAX_RETRY_AFTER_S",
    "AgentError",
    "AttachmentError",
    "BodyTooLargeError",
    "BudgetExceededError",
    "ConfigError",
    "DeliveryError",
    "FencedWriteError",
    "LayoutError",
    "MalformedBodyError",
    "ModelError",
    "QueueUnavailableError",
    "RateLimitedError",
    "ReplayDivergedError",
    "RequestError",
    "RunCancelledError",
    "SignatureError",
    "SourceUnreadableError",
    "SpeechError",
    "SwitchboardError",
    "ToolError",
    "excerpt",
]

EXCERPT_CHARS = 40
"""The most of a caller's input an error message repeats."""


def excerpt(value: str, limit: int = EXCERPT_CHARS) -> str:
    """``value`` quoted and cut to ``limit`` characters, for an error message (which never echoes kilobytes)."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}… ({len(value)} characters)"


class SwitchboardError(Exception):
    """Root of every error Switchboard raises on purpose."""


class ConfigError(SwitchboardError):
    """The configuration is wrong; the message names the field and says how to fix it."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class RequestError(SwitchboardError):
    """Bad input at the edge of the gateway; nothing was written."""

    status: int = 400
    code: str = "bad_request"

    def __init__(self, message: str, *, channel: str | None = None) -> None:
        super().__init__(message)
        self.channel = channel


class SignatureError(RequestError):
    """The request's signature or secret did not verify."""

    status = 401
    code = "bad_signature"

    def __init__(self, message: str, *, channel: str | None = None, status: int = 401) -> None:
        super().__init__(message, channel=channel)
        self.status = status


class MalformedBodyError(RequestError):
    """The body is not JSON or not the platform's shape."""

    status = 400
    code = "malformed_body"


class BodyTooLargeError(RequestError):
    """The body is over the size cap."""

    status = 413
    code = "body_too_large"


class QueueUnavailableError(SwitchboardError):
    """Redis did not confirm the write in time (or not on as many replicas as ``SWITCHBOARD_QUEUE__ACK_REPLICAS``)."""

    HEADERS: ClassVar[Mapping[str, str]] = MappingProxyType({"Retry-After": "1"})
    """The 503's headers: a platform retries anyway, a web chat client is told when (a failover takes seconds)."""


class FencedWriteError(SwitchboardError):
    """A session write carried an epoch that no longer owns the session lease."""

    def __init__(self, message: str, *, session_key: str, epoch: int) -> None:
        super().__init__(message)
        self.session_key = session_key
        self.epoch = epoch


class LayoutError(SwitchboardError):
    """The data in Redis is in a key layout this release does not read (older, mid-migration, or newer).

    ``layout`` is what ``sb:layout`` holds (``None``: absent, the release before the sharded layout).
    """

    def __init__(self, message: str, *, layout: str | None) -> None:
        super().__init__(message)
        self.layout = layout


class DeliveryError(SwitchboardError):
    """A platform send failed."""

    def __init__(self, message: str, *, channel: str, retryable: bool = True) -> None:
        super().__init__(message)
        self.channel = channel
        self.retryable = retryable


MAX_RETRY_AFTER_S = 86_400.0
"""The longest wait a platform's ``retry_after`` is taken at (a day): a larger one is read as this."""


class RateLimitedError(DeliveryError):
    """The platform asked us to slow down.

    ``retry_after`` is kept finite and within ``[0, MAX_RETRY_AFTER_S]`` whatever the platform sent (``NaN`` → 1 s):
    a NaN wait would sleep for ever and defeat every bound it is compared with.
    """

    def __init__(self, message: str, *, channel: str, retry_after: float) -> None:
        super().__init__(message, channel=channel, retryable=True)
        self.retry_after = min(max(retry_after, 0.0), MAX_RETRY_AFTER_S) if retry_after == retry_after else 1.0


class AttachmentError(SwitchboardError):
    """A file the user sent could not be fetched from the platform; the message says why, for the agent."""

    def __init__(self, message: str, *, channel: str, too_large: bool = False) -> None:
        super().__init__(message)
        self.channel = channel
        self.too_large = too_large


class SpeechError(SwitchboardError):
    """Text-to-speech failed (refused, unreachable, timed out, or not audio); the message says why, for operators."""


class SourceUnreadableError(SwitchboardError):
    """A knowledge source could not be read; the message says why and what to fix, for operators."""

    def __init__(self, message: str, *, ref: str) -> None:
        super().__init__(message)
        self.ref = ref


class AgentError(SwitchboardError):
    """The agent run failed."""


class RunCancelledError(AgentError):
    """The run was stopped on request; it is not retried."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BudgetExceededError(AgentError):
    """A run budget ran out."""

    def __init__(self, message: str, *, budget: str) -> None:
        super().__init__(message)
        self.budget = budget


class ModelError(AgentError):
    """The model provider failed.

    ``code`` names the cause where the runtime acts on it: ``context_length`` (compact and retry once),
    ``auth`` (stop the run), ``rate_limit``, ``overloaded``, ``server_error``, ``connection``, ``timeout``,
    ``quota``, ``bad_request``, ``not_found``, ``bad_response`` (the provider streamed malformed JSON; retryable).
    """

    def __init__(
        self, message: str, *, retryable: bool = False, retry_after: float | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.code = code


class ToolError(AgentError):
    """A tool failed, and says how: the tool gateway retries only the classes a tool allows.

    ``error_class`` is one of ``validation`` (the model can correct its arguments), ``auth``,
    ``rate_limit`` (with ``retry_after``), ``transient``, ``ambiguous_timeout`` or ``permanent``.
    """

    def __init__(self, message: str, *, error_class: str = "permanent", retry_after: float | None = None) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.retry_after = retry_after


class ReplayDivergedError(ModelError):
    """A replayed run asked the model for a step the recording does not hold (or a different one)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False, code="replay_diverged")
