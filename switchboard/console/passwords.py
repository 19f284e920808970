"""Operator passwords: Argon2id hashes (``argon2-cffi``), checked off the event loop in constant time."""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Final

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

__all__ = ["MAX_PASSWORD_CHARS", "hash_password", "verify_password"]

MAX_PASSWORD_CHARS: Final = 1024
"""Longer passwords are refused before hashing (hashing is the expensive part a caller controls)."""
_HASHER: Final = PasswordHasher()
_CHECKS: Final = threading.BoundedSemaphore(2)
"""At most this many checks at once per process (64 MiB each): a flood of sign-ins waits, memory stays bounded."""


def hash_password(password: str) -> str:
    """The Argon2id hash of ``password`` (argon2-cffi's current parameters, with a random salt)."""
    if not password:
        raise ValueError("the password is empty")
    if len(password) > MAX_PASSWORD_CHARS:
        raise ValueError(f"the password is over {MAX_PASSWORD_CHARS} characters")
    return _HASHER.hash(password)


@functools.cache
def _dummy_hash() -> str:
    """Verified against when the name is unknown, so an unknown name costs what a wrong password costs."""
    return _HASHER.hash("switchboard: no such operator")


def _verify(stored: str | None, password: str) -> bool:
    with _CHECKS:
        try:
            return _HASHER.verify(stored or _dummy_hash(), password) and stored is not None
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False


async def verify_password(stored: str | None, password: str) -> bool:
    """Whether ``password`` matches the hash ``stored`` (``None``: no such operator, always ``False``).

    Runs in a thread (an Argon2 check takes tens of milliseconds); the same work is done whether or not the
    operator exists.
    """
    if len(password) > MAX_PASSWORD_CHARS:
        return False
    return await asyncio.to_thread(_verify, stored, password)
