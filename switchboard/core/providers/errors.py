"""How provider failures become :class:`~switchboard.errors.ModelError`: one policy for the OpenAI and Anthropic SDKs.

Each adapter pulls the neutral facts out of its SDK's exception and hands them here (the table is on
:func:`status_error`). Messages quote the provider's own explanation, shortened and with the API key blanked out,
except for authentication failures, whose upstream text may echo part of the key.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from switchboard.errors import ModelError

__all__ = [
    "ProviderFacts",
    "auth_error",
    "bad_response_error",
    "redact",
    "retry_after",
    "status_error",
    "stream_error",
    "transport_error",
]

_MAX_QUOTED = 300

_CONTEXT_LENGTH_KINDS = frozenset({"context_length_exceeded", "exceed_context_size_error", "string_above_max_length"})
_CONTEXT_LENGTH_TEXT = re.compile(
    r"context[ _](length|size|window|limit)|maximum context|prompt is too long|too many tokens|input is too long",
    re.IGNORECASE,
)
_AUTH_KINDS = frozenset({"authentication_error", "permission_error", "invalid_api_key"})
_RETRYABLE_STREAM_KINDS = frozenset(
    {
        "server_error",
        "api_error",
        "overloaded_error",
        "rate_limit_error",
        "rate_limit_exceeded",
        "timeout_error",
        "vector_store_timeout",
    }
)


@dataclass(frozen=True, slots=True)
class ProviderFacts:
    """What an error message needs to know about the provider that failed."""

    name: str
    """Display name: ``OpenAI``, ``Anthropic``."""
    key_env: str
    """The environment variable holding the API key (``OPENAI_API_KEY``)."""
    base_url_env: str
    """The environment variable holding the endpoint (``OPENAI_BASE_URL``)."""
    custom_endpoint: bool = False
    """True when the adapter talks to a base URL other than the provider's own."""
    secret: str = field(default="", repr=False)
    """The API key, only so that it can be blanked out of any quoted text."""


def redact(text: str, secret: str) -> str:
    """Blank out ``secret`` from ``text`` (keys shorter than 4 characters are not worth matching)."""
    if len(secret) >= 4:
        text = text.replace(secret, "[redacted]")
    return text


def _quote(text: str | None, facts: ProviderFacts) -> str:
    cleaned = redact(" ".join((text or "").split()), facts.secret)
    if len(cleaned) > _MAX_QUOTED:
        cleaned = cleaned[: _MAX_QUOTED - 1] + "…"
    return cleaned


def retry_after(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds to wait before retrying, from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date).

    Returns:
        A non-negative number of seconds, or ``None`` when the headers say nothing usable.
    """
    if not headers:
        return None
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(float(raw_ms) / 1000.0, 0.0)
        except ValueError:
            pass
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        return max(float(raw), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def _is_context_length(kind: str | None, message: str) -> bool:
    return (kind in _CONTEXT_LENGTH_KINDS) or bool(_CONTEXT_LENGTH_TEXT.search(message))


def auth_error(facts: ProviderFacts, *, status: int | None) -> ModelError:
    """The credentials were refused: not retryable, and the message says which variable to fix."""
    where = f" (and {facts.base_url_env}, which points at a custom endpoint)" if facts.custom_endpoint else ""
    if status == 403:
        text = (
            f"{facts.name} refused access (HTTP 403): the key in {facts.key_env} is not allowed to use this "
            f"model or endpoint. Check {facts.key_env}{where} and the key's permissions."
        )
    else:
        shown = f"HTTP {status}" if status is not None else "authentication failed"
        text = f"{facts.name} rejected the API key ({shown}). Set {facts.key_env} to a valid key{where}."
    return ModelError(text, retryable=False, code="auth")


def status_error(
    facts: ProviderFacts,
    *,
    status: int,
    headers: Mapping[str, str] | None,
    kind: str | None,
    message: str | None,
    model: str,
) -> ModelError:
    """Classify an HTTP error answer from the provider.

    ========================================  =========  ==================  ======================================
    cause                                     retryable  ``code``            notes
    ========================================  =========  ==================  ======================================
    429 rate limit                            yes        ``rate_limit``      ``retry_after`` from the headers
    429 ``insufficient_quota``                no         ``quota``           billing, waiting will not help
    529 / ``overloaded_error``                yes        ``overloaded``      ``retry_after`` when given
    5xx, 408, 409, errors inside a stream     yes        ``server_error``
    malformed JSON in a stream               yes        ``bad_response``    an event the SDK could not parse
    connection failures                       yes        ``connection``
    timeouts                                  yes        ``timeout``
    401 / 403                                 no         ``auth``            names the env var, never the key
    context too long (400 / 413)              no         ``context_length``  the runtime compacts and retries once
    404                                       no         ``not_found``       usually a wrong model name
    other 4xx                                 no         ``bad_request``
    ========================================  =========  ==================  ======================================

    Args:
        facts: The provider that answered.
        status: The HTTP status code.
        headers: The response headers (for ``retry-after``).
        kind: The provider's error type or code (``rate_limit_error``, ``context_length_exceeded``).
        message: The provider's explanation.
        model: The model the request named.
    """
    if status in (401, 403) or kind in _AUTH_KINDS:
        return auth_error(facts, status=status)
    quoted = _quote(message, facts)
    label = f"{facts.name} answered HTTP {status}" + (f" ({kind})" if kind else "")
    if status == 413 or (400 <= status < 500 and status != 429 and _is_context_length(kind, quoted)):
        return ModelError(
            f"{label}: the request is too long for model {model!r}: {quoted}", retryable=False, code="context_length"
        )
    if status == 429:
        if kind == "insufficient_quota":
            return ModelError(f"{label}: the account is out of quota: {quoted}", retryable=False, code="quota")
        wait = retry_after(headers)
        return ModelError(f"{label}: rate limited: {quoted}", retryable=True, retry_after=wait, code="rate_limit")
    if status == 529 or kind == "overloaded_error":
        wait = retry_after(headers)
        return ModelError(f"{label}: overloaded: {quoted}", retryable=True, retry_after=wait, code="overloaded")
    if status >= 500 or status in (408, 409):
        wait = retry_after(headers)
        return ModelError(f"{label}: {quoted}", retryable=True, retry_after=wait, code="server_error")
    if status == 404:
        return ModelError(f"{label}: not found (is model {model!r} right?): {quoted}", code="not_found")
    return ModelError(f"{label}: {quoted}", retryable=False, code="bad_request")


def stream_error(facts: ProviderFacts, *, kind: str | None, message: str | None, model: str) -> ModelError:
    """Classify an error the provider reported inside a stream that had started with HTTP 200."""
    if kind in _AUTH_KINDS:
        return auth_error(facts, status=None)
    quoted = _quote(message, facts)
    label = f"{facts.name} failed mid-stream" + (f" ({kind})" if kind else "")
    if _is_context_length(kind, quoted):
        return ModelError(
            f"{label}: the request is too long for model {model!r}: {quoted}", retryable=False, code="context_length"
        )
    if kind in ("rate_limit_error", "rate_limit_exceeded"):
        return ModelError(f"{label}: rate limited: {quoted}", retryable=True, code="rate_limit")
    if kind == "overloaded_error":
        return ModelError(f"{label}: overloaded: {quoted}", retryable=True, code="overloaded")
    if kind is None or kind in _RETRYABLE_STREAM_KINDS:
        return ModelError(f"{label}: {quoted}", retryable=True, code="server_error")
    return ModelError(f"{label}: {quoted}", retryable=False, code="bad_request")


def bad_response_error(facts: ProviderFacts, *, detail: str) -> ModelError:
    """The provider streamed something that is not valid JSON: retryable, like any broken response."""
    return ModelError(
        f"{facts.name} sent a malformed response (an event that is not valid JSON: {_quote(detail, facts)})",
        retryable=True,
        code="bad_response",
    )


def transport_error(facts: ProviderFacts, *, timed_out: bool) -> ModelError:
    """The request never got a complete answer: a retryable connection failure or timeout."""
    hint = f" Check {facts.base_url_env} and the network." if facts.custom_endpoint else ""
    if timed_out:
        return ModelError(f"{facts.name} did not answer in time.{hint}", retryable=True, code="timeout")
    return ModelError(f"Could not reach {facts.name}.{hint}", retryable=True, code="connection")
