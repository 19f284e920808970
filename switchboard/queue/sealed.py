"""Sealed fields in Redis: history entries, approval records and dead letters' messages, with the environment's keys.

With ``SWITCHBOARD_DATA_KEYS`` set (:mod:`switchboard.core.sealing`), every history entry (the words of the
conversation, tool calls and results), every approval record (the gated call's arguments, the held draft, the
paused program) and the messages of every dead letter are written sealed, and every reader opens them; unset, they
are written as plain JSON, as before.
Values written before sealing was switched on still read, and ``switchboard keys rotate`` re-seals them.
"""

from __future__ import annotations

import json
import os
from typing import Any

from switchboard.core.sealing import DATA_KEYS_ENV, Keyring, SealError, is_sealed

__all__ = [
    "APPROVAL_CONTEXT",
    "data_keyring",
    "dead_messages",
    "history_context",
    "open_stored",
    "seal_dead_messages",
    "seal_stored",
]

APPROVAL_CONTEXT = "approval"
"""The sealing context of approval records (a record also names its session and is signed, so it cannot move)."""

_LOADED: dict[str, Keyring | None] = {}


def data_keyring() -> Keyring | None:
    """The keyring of ``SWITCHBOARD_DATA_KEYS`` (parsed once per value), ``None`` when sealing is off.

    Raises:
        ConfigError: the variable is malformed (saying what to fix).
    """
    value = os.environ.get(DATA_KEYS_ENV, "")
    if value not in _LOADED:
        keyring = Keyring.parse(value) if value.strip() else None
        _LOADED.clear()
        _LOADED[value] = keyring
    return _LOADED[value]


def history_context(session: str) -> str:
    """The sealing context of one session's history entries: an entry copied into another session does not open."""
    return f"history:{session}"


def seal_stored(value: str, context: str) -> str:
    """``value`` sealed with the current data key, or as it is when sealing is off."""
    keyring = data_keyring()
    return value if keyring is None else keyring.seal(value, context)


def open_stored(value: bytes | str, context: str) -> str:
    """The plain text of a stored value (sealed or not).

    Raises:
        SealError: it is sealed and no listed key opens it (the message names ``SWITCHBOARD_DATA_KEYS``).
    """
    text = value.decode() if isinstance(value, bytes) else value
    if not is_sealed(text):
        return text
    keyring = data_keyring()
    if keyring is None:
        raise SealError(f"a stored value is sealed but {DATA_KEYS_ENV} is not set: set it to the data keys")
    try:
        return keyring.open(text, context)
    except SealError as err:
        message = str(err)
        raise SealError(message if DATA_KEYS_ENV in message else f"{message}; check {DATA_KEYS_ENV}") from None


def _dead_context(session: str) -> str:
    return f"dead:{session}"


def seal_dead_messages(messages: list[dict[str, Any]], session: str) -> list[dict[str, Any]] | str:
    """A dead letter's ``messages`` as stored: the list, or (sealing on) the list's JSON sealed for ``session``."""
    keyring = data_keyring()
    if keyring is None:
        return messages
    return keyring.seal(json.dumps(messages, separators=(",", ":")), _dead_context(session))


def dead_messages(record: dict[str, Any]) -> list[Any]:
    """The messages of a dead-letter record (opened when sealed).

    Raises:
        SealError: they are sealed and no key of ``SWITCHBOARD_DATA_KEYS`` opens them.
    """
    stored = record.get("messages") or []
    if isinstance(stored, str):
        opened = json.loads(open_stored(stored, _dead_context(str(record.get("session", "")))))
        return opened if isinstance(opened, list) else []
    return stored if isinstance(stored, list) else []
