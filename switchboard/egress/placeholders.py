"""Secret placeholders: what sandboxes and the model see (``{{secret:NAME}}``) and what egress puts in their place.

Substitution happens in request headers only, and only on requests to a host the secret is bound to. A placeholder
anywhere else (an unbound host, the URL, the body, an unknown name) refuses the whole request: it is either a
mistake or an attempt to move the secret somewhere it may not go. A response that echoes a substituted value back
gets the placeholder in its place, so the real value never reaches the sandbox.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from pydantic import SecretStr

__all__ = ["PLACEHOLDER", "PlaceholderRefusedError", "Secret", "Substitution", "placeholder", "substitute"]

PLACEHOLDER: Final = re.compile(r"\{\{\s*secret:([A-Za-z0-9_]{1,64})\s*\}\}")
"""``{{secret:NAME}}`` (no ``$``: the shell would expand ``${{…}}``)."""
_MARKER: Final = re.compile(rb"\{\{\s*secret:", re.IGNORECASE)


def placeholder(name: str) -> str:
    """The text that stands for secret ``name`` in commands, scripts and the model's context."""
    return "{{secret:" + name.upper() + "}}"


@dataclass(frozen=True, slots=True)
class Secret:
    """One secret an agent may use: its value and the host patterns it is bound to."""

    name: str
    value: SecretStr
    domains: tuple[str, ...]


class PlaceholderRefusedError(Exception):
    """A request carries a placeholder it may not carry; ``reason`` is a code for the event log."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Substitution:
    """The request headers with real values in place of placeholders, and what was put in."""

    headers: list[tuple[str, str]]
    used: tuple[Secret, ...]

    def redact(self, data: bytes) -> bytes:
        """``data`` with every substituted value turned back into its placeholder (a response that echoes it)."""
        for secret in self.used:
            data = data.replace(secret.value.get_secret_value().encode(), placeholder(secret.name).encode())
        return data


def substitute(
    headers: Sequence[tuple[str, str]],
    elsewhere: Sequence[bytes],
    secrets: Mapping[str, Secret],
    bound: Callable[[Secret], bool],
) -> Substitution:
    """Put the real values in ``headers``; refuse placeholders in ``elsewhere`` (URL, body) or for unbound hosts.

    Args:
        headers: the request's headers as sent by the sandbox or tool.
        elsewhere: the rest of the request that may not carry a placeholder.
        secrets: the secrets the requesting agent may use, by upper-case name.
        bound: whether a secret may go to this request's host.

    Raises:
        PlaceholderRefusedError: ``placeholder_outside_headers``, ``unknown_secret`` or ``placeholder_unbound``.
    """
    if any(_MARKER.search(part) for part in elsewhere):
        raise PlaceholderRefusedError("placeholder_outside_headers")
    used: dict[str, Secret] = {}

    def put(match: re.Match[str]) -> str:
        secret = secrets.get(match.group(1).upper())
        if secret is None:
            raise PlaceholderRefusedError("unknown_secret")
        if not bound(secret):
            raise PlaceholderRefusedError("placeholder_unbound")
        used[secret.name] = secret
        return secret.value.get_secret_value()

    out: list[tuple[str, str]] = []
    for name, value in headers:
        if _MARKER.search(name.encode("latin-1", "replace")):
            raise PlaceholderRefusedError("placeholder_outside_headers")
        if "{{" not in value:
            out.append((name, value))
            continue
        if _MARKER.search(PLACEHOLDER.sub("", value).encode("latin-1", "replace")):
            raise PlaceholderRefusedError("unknown_secret")  # a malformed placeholder: never sent on as it is
        out.append((name, PLACEHOLDER.sub(put, value)))
    return Substitution(headers=out, used=tuple(used.values()))
