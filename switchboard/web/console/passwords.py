"""Operator passwords: Argon2id hashes (``argon2-cffi``), checked off the event loop in constant time."""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

__all__ = ["MAX_PASSWORD_CHARS", "hash_password", "verify_password"]

MAX_PASSWORD_CHARS: Final = 1024
"""Longer passwords are refused before hashing (hashing is the expensive part a caller controls)."""
_HASHER: Final = PasswordHasher()
_CHECKS: Final = ThreadPoolExecutor(max_workers=2, thread_name_prefix="console-argon2")
"""At most this many checks at once per process (64 MiB each). Their own threads: a flood of sign-ins waits in this
pool's queue and never holds the event loop's default executor, which serves files and other blocking work."""


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
    try:
        return _HASHER.verify(stored or _dummy_hash(), password) and stored is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


async def verify_password(stored: str | None, password: str) -> bool:
    """Whether ``password`` matches the hash ``stored`` (``None``: no such operator, always ``False``).

    Runs in a thread of its own small pool (an Argon2 check takes tens of milliseconds); the same work is done
    whether or not the operator exists. A password that is not valid Unicode text (a lone surrogate from a JSON
    escape) matches nothing: no hash could have been made of it.
    """
    if len(password) > MAX_PASSWORD_CHARS or not _is_text(password):
        return False
    return await asyncio.get_running_loop().run_in_executor(_CHECKS, _verify, stored, password)


def _is_text(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True
