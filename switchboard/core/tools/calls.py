"""What one tool call produced, and how its failures are classified (the tool gateway's vocabulary).

:class:`ToolOutcome` is what the runtime and the model see of a call; :func:`classify_error` names a failure's
class; :func:`retry_safe` says whether that class may be retried (never a write in doubt, unless its downstream
honours the idempotency key); :func:`action_sha256` and :func:`idempotency_key` fingerprint and key an action.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from switchboard.core.approvals.records import ApprovalRequest
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.tools.effects import effect_key
from switchboard.errors import DeliveryError, RateLimitedError, ToolError

__all__ = [
    "NEVER_RETRIED",
    "Tier",
    "ToolOutcome",
    "action_sha256",
    "canonical_json",
    "classify_error",
    "describe_invalid",
    "doubt_info",
    "failure_message",
    "idempotency_key",
    "retry_safe",
]

Tier = Literal["inline", "card", "file"]
NEVER_RETRIED = frozenset({"validation", "auth", "circuit_open", "needs_approval", "refused_by_policy"})
"""Failure classes no retry can change."""


def canonical_json(value: Any) -> str:
    """Sorted-key, compact JSON: equal values give equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def action_sha256(tool: str, args: Any) -> str:
    """Fingerprint of one logical action: the tool name and its canonical arguments."""
    return hashlib.sha256(f"{tool}\n{canonical_json(args)}".encode()).hexdigest()


def idempotency_key(run_id: str, tool: str, logical: dict[str, Any], occurrence: int = 1) -> str:
    """``sha256(run_id, tool, logical action, occurrence)``: the same on every attempt at the run.

    See :func:`~switchboard.core.tools.effects.effect_key`.
    """
    return effect_key(run_id, tool, logical, occurrence)


def classify_error(exc: BaseException, tool: Tool) -> tuple[str, float | None]:
    """The error class of a tool failure and, for rate limits, how long to wait."""
    if isinstance(exc, ToolError):
        return exc.error_class, exc.retry_after
    if isinstance(exc, RateLimitedError):
        return "rate_limit", exc.retry_after
    if isinstance(exc, DeliveryError):
        return ("transient" if exc.retryable else "permanent"), None
    if isinstance(exc, TimeoutError):
        return ("ambiguous_timeout" if tool.side_effect == "write" else "transient"), None
    if isinstance(exc, ValidationError | ValueError):
        return "validation", None
    if isinstance(exc, PermissionError):
        return "auth", None
    if isinstance(exc, ConnectionError):
        return "transient", None
    return "permanent", None


class ToolOutcome(BaseModel):
    """What one call produced, as the runtime and the model see it."""

    model_config = ConfigDict(frozen=True)

    tool: str
    ok: bool
    value: Any = None
    """The result (``tier == "inline"``) or its data card (``card``/``file``)."""
    error: str | None = None
    error_class: str | None = None
    variable: str | None = None
    """Variable the full result is bound to (large results); the next program receives it as an input."""
    file: str | None = None
    """Workspace-relative path the full result was written to (very large results)."""
    duration_ms: float = 0.0
    tier: Tier = "inline"
    attempts: int = 0
    idempotency_key: str | None = None
    action_sha256: str | None = None
    approval: ApprovalRequest | None = None
    """``error_class == "needs_approval"``: the request a person must approve; nothing ran."""
    policy: str | None = None
    """The policy's decision as recorded (``allow:default:read``, ``observe:<rule>``, ``approve:<rule>``)."""

    @property
    def correctable(self) -> bool:
        """The model can fix the call itself (wrong name or arguments)."""
        return self.error_class == "validation"

    def for_model(self, *, codeact: bool = False) -> str:
        """The tool message content sent back to the model."""
        if not self.ok:
            hint = "fix the arguments and call again" if self.correctable else "do not repeat this call unchanged"
            return canonical_json({"error": self.error, "error_class": self.error_class, "hint": hint})
        if self.tier == "inline":
            return self.value if isinstance(self.value, str) else canonical_json(self.value)
        body: dict[str, Any] = {"result": "too large to show; this is its data card", "card": self.value}
        if codeact and self.variable:
            body["variable"] = self.variable
            body["hint"] = f"the full result is the input variable `{self.variable}` of your next run_program"
        if self.file:
            body["file"] = self.file
            body["pages"] = f"read any part of it with read_file(path={self.file!r}, offset=N) or start_line/end_line"
        return canonical_json(body)


def retry_safe(tool: Tool, error_class: str) -> bool:
    """Whether a failure of ``error_class`` may be retried: allowed by the tool, and never a write in doubt.

    A rate limit means the call was not performed; any other failure of a write may have half-happened, so it is
    retried only when the downstream honours the idempotency key (``tool.idempotent``).
    """
    if error_class in NEVER_RETRIED or error_class not in tool.retry_on:
        return False
    return tool.side_effect == "read" or tool.idempotent or error_class == "rate_limit"


def doubt_info(ctx: ToolContext, reason: str) -> dict[str, str]:
    """What reconciliation shows about an effect in doubt (ids and classes, never arguments)."""
    return {
        "session": str(ctx.session_key),
        "tenant": ctx.tenant,
        "agent": ctx.agent,
        "run_id": ctx.run_id,
        "actor": ctx.actor,
        "reason": reason,
    }


def describe_invalid(name: str, err: ValidationError) -> str:
    """A validation error as the model should read it: each field and what is wrong with it."""
    parts = []
    for item in err.errors(include_url=False)[:10]:
        where = ".".join(str(p) for p in item["loc"]) or "(arguments)"
        parts.append(f"{where}: {item['msg']}")
    return f"invalid arguments for {name}: " + "; ".join(parts)


def failure_message(name: str, exc: BaseException, tool: Tool) -> str:
    """A failure as the model reads it (the caller scrubs host paths)."""
    if isinstance(exc, TimeoutError) and not str(exc):
        return f"{name} did not finish within {tool.timeout_s:g}s"
    if isinstance(exc, ValidationError):
        return describe_invalid(name, exc)
    text = str(exc) or type(exc).__name__
    return f"{name} failed: {text[:500]}"
