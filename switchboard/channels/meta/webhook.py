"""What the three Meta channels (WhatsApp, Instagram, Messenger) share on the way in.

The handshake and the ``X-Hub-Signature-256`` check on the raw body (:func:`verify_request`, constant time, before
anything is parsed), the delivery's JSON (:func:`load_delivery`), the account a message belongs to
(:class:`AccountMap`: one app's webhook URL serves every number and page) and structured operator events
(:func:`record_event`, never bodies or tokens). The Graph API client is :mod:`switchboard.channels.meta.graph`.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from pydantic import SecretStr
from pydantic_core import from_json

from switchboard.channels.base import HttpAnswer, Inbound, RawRequest, header_values
from switchboard.errors import MalformedBodyError, SignatureError

__all__ = [
    "EVENT_COUNTS",
    "HANDSHAKE_METHODS",
    "LEGACY_SIGNATURE_HEADER",
    "SIGNATURE_HEADER",
    "UNCLAIMED_PREFIX",
    "AccountMap",
    "handshake_answer",
    "load_delivery",
    "record_event",
    "secret_bytes",
    "sign",
    "verify_request",
]

logger = logging.getLogger("switchboard.channels.meta")

SIGNATURE_HEADER: Final = "X-Hub-Signature-256"
LEGACY_SIGNATURE_HEADER: Final = "X-Hub-Signature"
"""The ``sha1=`` signature Meta still sends beside the SHA-256 one; never accepted on its own."""
HANDSHAKE_METHODS: Final = frozenset({"GET", "POST"})
"""What a Meta channel's ``ChannelFactory.webhook_methods`` is: ``GET`` for the handshake, ``POST`` for events."""
UNCLAIMED_PREFIX: Final = "unclaimed:"
"""Account name given to messages for a platform id no configured account claims (the router drops them)."""
_CHALLENGE: Final = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_HEX_LEN: Final = 64

EVENT_COUNTS: Counter[tuple[str, str, str]] = Counter()
"""Per-process counts of Meta channel events by ``(channel, account, kind)`` (window failures, alerts)."""

S = TypeVar("S")


def secret_bytes(value: SecretStr | None) -> bytes | None:
    """A secret setting as bytes (``None`` when unset or empty)."""
    if value is None:
        return None
    raw = value.get_secret_value()
    return raw.encode() if raw else None


def sign(body: bytes, app_secret: bytes | str) -> str:
    """The ``X-Hub-Signature-256`` value Meta sends for ``body`` (``sha256=`` + lowercase hex).

    For the fakes, ``switchboard simulate`` and tests: sign the exact bytes that are sent.
    """
    key = app_secret.encode() if isinstance(app_secret, str) else app_secret
    return "sha256=" + hmac.digest(key, body, "sha256").hex()


def _check_handshake(request: RawRequest, verify_token: bytes | None, channel: str) -> None:
    if verify_token is None:
        raise SignatureError(
            f"{channel}: no verify token configured: set SWITCHBOARD_{channel.upper()}__VERIFY_TOKEN to the value "
            "typed in the App Dashboard's webhook settings",
            channel=channel,
            status=403,
        )
    mode = request.query.get("hub.mode", "")
    given = request.query.get("hub.verify_token", "").encode("utf-8", "surrogateescape")
    token_ok = hmac.compare_digest(hashlib.sha256(given).digest(), hashlib.sha256(verify_token).digest())
    if mode != "subscribe" or not token_ok:
        raise SignatureError(f"{channel}: wrong hub.mode or hub.verify_token", channel=channel, status=403)


@functools.lru_cache(maxsize=64)
def _keyed_mac(app_secret: bytes) -> hmac.HMAC:
    """HMAC-SHA256 keyed with ``app_secret`` and fed nothing yet (callers copy it, never update it)."""
    return hmac.new(app_secret, digestmod=hashlib.sha256)


def _check_signature(request: RawRequest, app_secret: bytes | None, channel: str) -> None:
    if app_secret is None:
        raise SignatureError(
            f"{channel}: refusing every request until an app secret is configured: set "
            f"SWITCHBOARD_{channel.upper()}__APP_SECRET (App Dashboard → App settings → Basic → App secret)",
            channel=channel,
            status=403,
        )
    given = header_values(request.headers, SIGNATURE_HEADER)
    if not given:
        legacy = bool(header_values(request.headers, LEGACY_SIGNATURE_HEADER))
        what = f"only the legacy {LEGACY_SIGNATURE_HEADER} (sha1)" if legacy else f"no {SIGNATURE_HEADER} header"
        raise SignatureError(f"{channel}: {what}", channel=channel)
    value = given[0].strip()
    if len(given) != 1 or not value.startswith("sha256=") or len(value) != len("sha256=") + _HEX_LEN:
        raise SignatureError(f"{channel}: malformed {SIGNATURE_HEADER} header", channel=channel)
    mac = _keyed_mac(app_secret).copy()  # the keyed state is built once per secret, copied per request
    mac.update(request.body)
    expected = mac.hexdigest().encode()
    if not hmac.compare_digest(value[len("sha256=") :].lower().encode("utf-8", "surrogateescape"), expected):
        raise SignatureError(f"{channel}: wrong {SIGNATURE_HEADER}", channel=channel)


def verify_request(request: RawRequest, *, app_secret: bytes | None, verify_token: bytes | None, channel: str) -> None:
    """Check a Meta webhook request: the ``GET`` handshake's token, or a ``POST``'s signature over the raw body.

    Raises:
        SignatureError: 403 for a wrong handshake or an unset secret/token; 401 for a missing, ``sha1``-only,
            malformed or wrong signature; 405-like methods never reach here (the route refuses them).
    """
    if request.method == "GET":
        _check_handshake(request, verify_token, channel)
    else:
        _check_signature(request, app_secret, channel)


def handshake_answer(request: RawRequest, channel: str) -> Inbound:
    """The verified handshake's answer: ``hub.challenge`` echoed as ``text/plain``, no messages.

    Raises:
        MalformedBodyError: no challenge, or one that is not a short token (Meta sends digits).
    """
    challenge = request.query.get("hub.challenge", "")
    if not _CHALLENGE.fullmatch(challenge):
        raise MalformedBodyError(f"{channel}: hub.challenge missing or not a short token", channel=channel)
    return Inbound((), HttpAnswer(200, challenge.encode(), "text/plain"))


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
"""What is left of a surrogate after JSON decoding is lone (pairs became one character): not encodable text."""


def _repaired(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (keys included) replaced by U+FFFD."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_repaired(item) for item in value]
    if isinstance(value, dict):
        return {_repaired(key): _repaired(item) for key, item in value.items()}
    return value


def load_delivery(body: bytes, object_name: str, channel: str) -> dict[str, Any]:
    """A verified ``POST`` body as JSON, checked to be a delivery for ``object_name`` with an ``entry`` list.

    Raises:
        MalformedBodyError: not JSON, not an object, another ``object``, or ``entry`` not a list.
    """
    try:  # pydantic-core's parser is about twice as fast; what it refuses, json.loads decides (same results)
        payload = from_json(body)
    except ValueError:  # not JSON, or JSON it does not take: a lone surrogate, UTF-16/32, deep nesting, a BOM
        try:
            payload = json.loads(body)
            # A lone surrogate would poison the stored record: escaped, or as raw UTF-8 bytes (0xED 0xA0-0xBF), which
            # json.loads reads with surrogatepass.
            if b"\\ud" in body or b"\\uD" in body or b"\xed" in body:
                payload = _repaired(payload)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise MalformedBodyError(f"{channel}: body is not JSON", channel=channel) from None
    if not isinstance(payload, dict):
        raise MalformedBodyError(f"{channel}: body is not a JSON object", channel=channel)
    if payload.get("object") != object_name:
        raise MalformedBodyError(f"{channel}: object is not {object_name!r}", channel=channel)
    if not isinstance(payload.get("entry", []), list):
        raise MalformedBodyError(f"{channel}: entry is not a list", channel=channel)
    return payload


@dataclass(frozen=True, slots=True)
class AccountMap:
    """Platform id (phone number id, Page id, Instagram account id) → the configured account name claiming it.

    Built once per adapter from every enabled account of the channel (``BuildContext.accounts``); only accounts of
    the same Meta app (same app secret) are claimed, so a payload signed by one app never routes into another's.
    """

    by_id: Mapping[str, str]

    @classmethod
    def build(
        cls,
        accounts: Mapping[str, S],
        platform_id: Callable[[S], str | None],
        app_secret: Callable[[S], bytes | None],
        *,
        own: tuple[str, S],
    ) -> AccountMap:
        """Map every account of the same app as ``own`` (``(name, settings)``, the receiving account) by its id.

        ``own`` is always included (also when ``accounts`` is empty: tests and single-account setups); when two
        accounts claim one id, the receiving account wins, else the first in configuration order.
        """
        own_name, own_settings = own
        secret = app_secret(own_settings)
        found: dict[str, str] = {}
        own_id = platform_id(own_settings)
        if own_id:
            found[own_id] = own_name
        for name, settings in accounts.items():
            other_id, other_secret = platform_id(settings), app_secret(settings)
            if not other_id or other_id in found:
                continue
            if secret is not None and other_secret is not None and hmac.compare_digest(secret, other_secret):
                found[other_id] = name
        return cls(found)

    def account_for(self, platform_id: str) -> str:
        """The account claiming ``platform_id``, or an ``unclaimed:`` name no account has (dropped by the router)."""
        name = self.by_id.get(platform_id)
        return name if name is not None else UNCLAIMED_PREFIX + platform_id[:64]


def record_event(channel: str, account: str, kind: str, *, level: int = logging.INFO, **fields: str | int) -> None:
    """Record a channel event (a window failure, a template fallback, an auth alert): a log record and a count.

    ``fields`` are short identifiers and codes only (message ids, statuses, error codes) — never bodies or tokens.
    The record carries ``extra={"meta_event": {...}}`` for structured log handlers.
    """
    EVENT_COUNTS[(channel, account, kind)] += 1
    if logger.isEnabledFor(level):
        event = {"channel": channel, "account": account, "kind": kind, **fields}
        shown = " ".join(f"{k}={v}" for k, v in fields.items())
        logger.log(level, "%s/%s %s %s", channel, account, kind, shown, extra={"meta_event": event})
