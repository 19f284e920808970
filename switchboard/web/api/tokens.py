"""API tokens: made by ``switchboard api-tokens create``, stored only as their SHA-256, checked in constant time.

A token is 32 random bytes (``sb_`` + URL-safe base64), so a fast hash is enough, as for the console's sign-in tokens:
there is nothing to guess a password from. The YAML file holds ``api.tokens[].sha256``; the token is printed once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import sys
from collections.abc import Sequence
from typing import Final, TextIO

from switchboard.settings.api import SCOPES, ApiToken

__all__ = ["MAX_TOKEN_CHARS", "create_token_command", "find_token", "new_token", "token_hash"]

MAX_TOKEN_CHARS: Final = 256
_PREFIX: Final = "sb_"


def token_hash(token: str) -> str:
    """The SHA-256 (hex) a token is stored as."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    """A new random token."""
    return _PREFIX + secrets.token_urlsafe(32)


def find_token(tokens: Sequence[ApiToken], presented: str) -> ApiToken | None:
    """The configured token ``presented`` is, or ``None``; every configured hash is compared, in constant time."""
    if not presented or len(presented) > MAX_TOKEN_CHARS or not presented.isascii():
        return None
    digest = token_hash(presented)
    found: ApiToken | None = None
    for token in tokens:  # no early exit: the time taken does not say how many hashes were tried
        if hmac.compare_digest(digest, token.sha256):
            found = token
    return found


def create_token_command(name: str, tenant: str, scopes: Sequence[str], stdout: TextIO | None = None) -> int:
    """Print a new token once, and the YAML entry holding its hash; returns the exit code."""
    out = stdout or sys.stdout
    unknown = [scope for scope in scopes if scope not in SCOPES]
    if unknown or not scopes:
        print(
            f"switchboard: unknown scope {', '.join(unknown) or '(none)'}; choose from {', '.join(SCOPES)}",
            file=sys.stderr,
        )
        return 2
    token = new_token()
    try:
        entry = ApiToken.model_validate(
            {"name": name, "tenant": tenant, "scopes": list(scopes), "sha256": token_hash(token)}
        )
    except ValueError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 2
    print(token, file=out)
    print(
        "\nThe token above is shown only now. Add this to the YAML file (api.tokens) and restart:\n\n"
        f"api:\n  tokens:\n    - name: {entry.name}\n      tenant: {entry.tenant}\n"
        f'      scopes: [{", ".join(entry.scopes)}]\n      sha256: "{entry.sha256}"',
        file=sys.stderr,
    )
    return 0
