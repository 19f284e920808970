"""Encryption at rest of sensitive fields, with keys from the environment and rotation.

``SWITCHBOARD_DATA_KEYS`` holds one or more keys, ``id:base64`` separated by commas, the **first** the current one:
new values are sealed with it, and values sealed with any listed key still open. Rotating is: put a new key first,
keep the old ones listed, run ``switchboard keys rotate`` (which re-seals what is stored with an older key), then drop
the old key. ``switchboard keys new`` prints a fresh key.

A sealed value is text: ``sb1:<key id>:<base64url(nonce ‖ AES-256-GCM ciphertext)>``. The caller gives a *context*
(e.g. ``memory:<tenant>``), bound in as associated data, so a value copied into another tenant's row does not open.
A value without the prefix is plain text written before sealing was switched on, and opens as itself.

Words of sealed text that must stay searchable are indexed as *blind terms*: an HMAC of the word under a key derived
from a data key, so the index holds no word. A query is blinded under every listed key, so rows indexed under an old
key are found until they are rotated.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from switchboard.errors import ConfigError

__all__ = [
    "DATA_KEYS_ENV",
    "PLAIN_ESCAPE",
    "SEALED_PREFIX",
    "Keyring",
    "SealError",
    "escape_plain",
    "is_sealed",
    "new_key",
    "unescape_plain",
]

DATA_KEYS_ENV = "SWITCHBOARD_DATA_KEYS"
"""The environment variable holding the data keys."""

SEALED_PREFIX = "sb1:"
"""How every sealed value starts."""

_KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_NONCE = 12


class SealError(ValueError):
    """A sealed value that does not open: unknown key id, altered, or sealed for another context."""


PLAIN_ESCAPE = "sbp:"
"""Put before a stored plain text that starts like a sealed value (or like this), so it is never taken for one."""


def escape_plain(text: str) -> str:
    """``text`` as a store keeps it in plain: escaped when it starts like a sealed value (a user may write ``sb1:``)."""
    return PLAIN_ESCAPE + text if text.startswith((SEALED_PREFIX, PLAIN_ESCAPE)) else text


def unescape_plain(text: str) -> str:
    """The text :func:`escape_plain` was given."""
    return text[len(PLAIN_ESCAPE) :] if text.startswith(PLAIN_ESCAPE) else text


def is_sealed(value: str) -> bool:
    """Whether ``value`` is a sealed value (rather than plain text written before sealing)."""
    return value.startswith(SEALED_PREFIX)


def new_key(key_id: str) -> str:
    """A fresh key entry for ``SWITCHBOARD_DATA_KEYS``: ``key_id:base64`` of 32 random bytes."""
    if not _KEY_ID.fullmatch(key_id):
        raise ConfigError(f"key id {key_id!r} must be 1-32 letters, digits, '_' or '-'")
    return f"{key_id}:{base64.b64encode(secrets.token_bytes(32)).decode()}"


class Keyring:
    """The data keys, current first: seals with the current key, opens with any."""

    def __init__(self, keys: Sequence[tuple[str, bytes]]) -> None:
        if not keys:
            raise ConfigError(f"{DATA_KEYS_ENV} lists no key")
        self._keys: dict[str, AESGCM] = {}
        self._blind: dict[str, bytes] = {}
        for key_id, raw in keys:
            if key_id in self._keys:
                raise ConfigError(f"{DATA_KEYS_ENV} lists key id {key_id!r} twice")
            self._keys[key_id] = AESGCM(raw)
            self._blind[key_id] = hmac.new(raw, b"switchboard blind index v1", hashlib.sha256).digest()
        self.current = keys[0][0]
        """The id of the key new values are sealed with."""

    @property
    def key_ids(self) -> list[str]:
        """Every listed key id, current first."""
        return list(self._keys)

    @classmethod
    def parse(cls, value: str) -> Keyring:
        """The keyring of a ``SWITCHBOARD_DATA_KEYS`` value; :class:`ConfigError` saying what to fix."""
        keys: list[tuple[str, bytes]] = []
        for number, entry in enumerate(part.strip() for part in value.split(",")):
            if not entry:
                continue
            key_id, sep, encoded = entry.partition(":")
            if not sep or not _KEY_ID.fullmatch(key_id):
                raise ConfigError(
                    f"{DATA_KEYS_ENV} entry {number + 1} is not 'id:base64' (make one: switchboard keys new)"
                )
            try:
                raw = base64.b64decode(encoded, validate=True)
            except binascii.Error:
                raise ConfigError(f"{DATA_KEYS_ENV} key {key_id!r} is not valid base64") from None
            if len(raw) != 32:
                raise ConfigError(f"{DATA_KEYS_ENV} key {key_id!r} must be 32 bytes (it is {len(raw)})")
            keys.append((key_id, raw))
        return cls(keys)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Keyring | None:
        """The keyring of ``SWITCHBOARD_DATA_KEYS``, or ``None`` when it is unset or empty (sealing off)."""
        value = (os.environ if environ is None else environ).get(DATA_KEYS_ENV, "").strip()
        return cls.parse(value) if value else None

    def seal(self, plaintext: str, context: str) -> str:
        """``plaintext`` sealed with the current key, bound to ``context``."""
        nonce = secrets.token_bytes(_NONCE)
        sealed = self._keys[self.current].encrypt(nonce, plaintext.encode(), context.encode())
        return f"{SEALED_PREFIX}{self.current}:{base64.urlsafe_b64encode(nonce + sealed).decode()}"

    def open(self, value: str, context: str) -> str:
        """The plain text of ``value`` (sealed for ``context``, or plain text as it is); :class:`SealError` else."""
        if not is_sealed(value):
            return value
        key_id, sep, body = value[len(SEALED_PREFIX) :].partition(":")
        key = self._keys.get(key_id)
        if not sep or key is None:
            raise SealError(f"sealed with key {key_id!r}, which {DATA_KEYS_ENV} no longer lists")
        try:
            raw = base64.urlsafe_b64decode(body)
            return key.decrypt(raw[:_NONCE], raw[_NONCE:], context.encode()).decode()
        except (InvalidTag, binascii.Error, ValueError):
            raise SealError("a sealed value does not open (altered, or sealed for another place)") from None

    def key_of(self, value: str) -> str | None:
        """The key id ``value`` is sealed with (``None``: plain text)."""
        if not is_sealed(value):
            return None
        return value[len(SEALED_PREFIX) :].partition(":")[0]

    def needs_rotation(self, value: str) -> bool:
        """Whether ``value`` is plain text or sealed with a key other than the current one."""
        return self.key_of(value) != self.current

    def reseal(self, value: str, context: str) -> str:
        """``value`` sealed with the current key (opened first when sealed with another)."""
        return self.seal(self.open(value, context), context)

    def blind(self, term: str, context: str, key_id: str | None = None) -> str:
        """The blind index term of ``term`` under one key (the current one by default): ``b`` + 24 hex digits."""
        key = self._blind[key_id or self.current]
        return "b" + hmac.new(key, f"{context}\n{term}".encode(), hashlib.sha256).hexdigest()[:24]

    def blind_all(self, term: str, context: str) -> list[str]:
        """The blind terms of ``term`` under every listed key, current first (what a query looks for)."""
        return [self.blind(term, context, key_id) for key_id in self._keys]
