"""Secret placeholders: what sandboxes and the model see (``{{secret:NAME}}``) and what egress puts in their place.

Substitution happens in request headers only, over ``https``, to a host the secret is bound to; a placeholder
anywhere else refuses the whole request. Responses get the placeholder back in place of every secret bound to that
host, in the encodings a host is likely to echo (best effort, linear in the capped response), so the real value never
reaches the sandbox.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote_from_bytes

from pydantic import SecretStr

__all__ = [
    "MIN_ENCODED",
    "PLACEHOLDER",
    "PlaceholderRefusedError",
    "Secret",
    "Substitution",
    "echo_pattern",
    "placeholder",
    "redact",
    "substitute",
]

PLACEHOLDER: Final = re.compile(r"\{\{\s*secret:([A-Za-z0-9_]{1,64})\s*\}\}")
"""``{{secret:NAME}}`` (no ``$``: the shell would expand ``${{…}}``)."""
_MARKER: Final = re.compile(rb"\{\{\s*secret:", re.IGNORECASE)
MIN_ENCODED: Final = 6
"""Shortest value (bytes) whose hex and base64 forms are redacted too."""
_MIN_B64_CHARS: Final = 8


def _base64_fragments(value: bytes) -> list[bytes]:
    """The base64 text that encodes ``value`` wherever it sits in a longer input: one fragment per alignment.

    For each of the three offsets of ``value`` in the encoded input, the characters that depend on nothing but its
    own bytes: whole 3-byte groups, minus the leading characters that also carry bits of the unknown prefix.
    """
    found: list[bytes] = []
    for offset in range(3):
        whole = (offset + len(value)) // 3 * 4
        text = base64.b64encode(bytes(offset) + value)[:whole]
        fragment = text[(offset * 8 + 5) // 6 :]
        if len(fragment) >= _MIN_B64_CHARS:
            found.append(fragment)
    return found


def echo_pattern(value: bytes) -> re.Pattern[bytes]:
    """What an echo of ``value`` may look like in a response: see the module's note on redaction.

    Group ``text`` matches the forms replaced by the placeholder; group ``b64`` a base64 fragment, replaced by as
    many ``A`` (zero bits), so that the surrounding base64 still decodes — to zero bytes where the value was.
    """
    folded = [value, quote_from_bytes(value, safe="").encode()]
    exact: list[bytes] = []
    if len(value) >= MIN_ENCODED:
        folded.append(value.hex().encode())
        for fragment in _base64_fragments(value):
            exact += [fragment, fragment.translate(bytes.maketrans(b"+/", b"-_"))]
    ordered = sorted(set(folded), key=len, reverse=True)
    pattern = b"(?P<text>(?i:" + b"|".join(re.escape(each) for each in ordered) + b"))"
    if exact:
        fragments = sorted(set(exact), key=len, reverse=True)
        pattern += b"|(?P<b64>" + b"|".join(re.escape(each) for each in fragments) + b")"
    return re.compile(pattern)


@functools.lru_cache(maxsize=256)
def _echo(value: bytes) -> re.Pattern[bytes]:
    """:func:`echo_pattern`, compiled once per value."""
    return echo_pattern(value)


def redact(data: bytes, secrets: Sequence[Secret]) -> bytes:
    """``data`` with each of ``secrets`` — literal, case variant or encoded — turned back into its placeholder.

    Best effort (a response that echoes one): see the module's note for what is found and what is not.
    """
    for secret in secrets:
        shown = (secret.shown or placeholder(secret.name)).encode()
        data = _echo(secret.value.get_secret_value().encode()).sub(functools.partial(_hide, shown), data)
    return data


def placeholder(name: str) -> str:
    """The text that stands for secret ``name`` in commands, scripts and the model's context."""
    return "{{secret:" + name.upper() + "}}"


@dataclass(frozen=True, slots=True)
class Secret:
    """One secret an agent may use: its value and the host patterns it is bound to."""

    name: str
    value: SecretStr
    domains: tuple[str, ...]
    shown: str = ""
    """What a response that echoes the value shows instead (default: ``{{secret:NAME}}``)."""


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
        """``data`` with every substituted value turned back into its placeholder (:func:`redact`)."""
        return redact(data, self.used)


def _hide(shown: bytes, match: re.Match[bytes]) -> bytes:
    """The placeholder for a text form of a secret; as many ``A`` (zero bits) for a base64 fragment."""
    return shown if match.lastgroup == "text" else b"A" * len(match[0])


def substitute(
    headers: Sequence[tuple[str, str]],
    elsewhere: Sequence[bytes],
    secrets: Mapping[str, Secret],
    bound: Callable[[Secret], bool],
    *,
    secure: bool,
) -> Substitution:
    """Put the real values in ``headers``; refuse placeholders in ``elsewhere`` (URL, body) or for unbound hosts.

    Args:
        headers: the request's headers as sent by the sandbox or tool.
        elsewhere: the rest of the request that may not carry a placeholder.
        secrets: the secrets the requesting agent may use, by upper-case name.
        bound: whether a secret may go to this request's host.
        secure: whether the request leaves the proxy encrypted (``https``); a placeholder in any other is refused.

    Raises:
        PlaceholderRefusedError: ``placeholder_outside_headers``, ``unknown_secret``, ``placeholder_unbound`` or
            ``placeholder_insecure``.
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
        if not secure:  # the real value would cross the network in clear text
            raise PlaceholderRefusedError("placeholder_insecure")
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
