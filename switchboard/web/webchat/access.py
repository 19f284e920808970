"""Who may use the web chat API: bearer tokens (stored as their hash, cached briefly), and the shared answers.

The chat's routes, its stream and its uploads all admit a request here, so their answers (``401``, ``429``,
``503``, the CORS headers) are the same everywhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Final

from aiohttp import web
from redis.exceptions import RedisError

from switchboard.errors import QueueUnavailableError
from switchboard.queue.keys import GlobalKeys
from switchboard.queue.limits import retry_after_s
from switchboard.types import SessionKey
from switchboard.web.appkeys import METRICS, REDIS, SETTINGS

__all__ = [
    "CORS_HEADERS",
    "NO_STORE",
    "TOKENS",
    "TOKEN_CACHE_MAX",
    "TOKEN_CACHE_S",
    "TOKEN_TTL_S",
    "TokenCache",
    "bearer",
    "bearer_session",
    "error",
    "hash_token",
    "preflight",
    "reject",
    "session_for",
    "too_many",
    "unauthorized",
    "unavailable",
]

TOKEN_TTL_S: Final = 30 * 24 * 3600
"""A web chat token lives this long after its last use."""
TOKEN_CACHE_S: Final = 5.0
"""How long a process trusts a token it has looked up (the bound on refusing a deleted or expired one)."""
TOKEN_CACHE_MAX: Final = 10_000
TOKEN_MAX_CHARS: Final = 512
NO_STORE: Final = {"Cache-Control": "no-store"}
CORS_HEADERS: Final = {
    # Bearer tokens, never cookies: another site embedding the chat gains nothing it was not given.
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, Last-Event-ID",
    "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
    "Access-Control-Max-Age": "600",
}


class TokenCache:
    """Token hash → session for tokens this process found in Redis, each trusted for ``ttl_s`` (bounded size)."""

    def __init__(self, ttl_s: float, max_entries: int) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: dict[str, tuple[SessionKey, float]] = {}

    def get(self, token_hash: str) -> SessionKey | None:
        """The session a token maps to, while its entry is fresh."""
        entry = self._entries.get(token_hash)
        if entry is None:
            return None
        if entry[1] <= time.monotonic():
            del self._entries[token_hash]
            return None
        return entry[0]

    def drop(self, token_hash: str) -> None:
        """Forget a token at once (it was revoked through this process)."""
        self._entries.pop(token_hash, None)

    def put(self, token_hash: str, session: SessionKey) -> None:
        """Remember a token found in Redis (dropping the oldest entry when full)."""
        if len(self._entries) >= self.max_entries:
            del self._entries[next(iter(self._entries))]  # the oldest insertion
        self._entries[token_hash] = (session, time.monotonic() + self.ttl_s)


TOKENS: Final = web.AppKey("webchat_tokens", TokenCache)


def hash_token(token: str) -> str:
    """The hex SHA-256 under which a token is stored (the token itself is never stored).

    Total over ``str``: a lone surrogate (a raw non-UTF-8 byte in a header) hashes too, to a token nobody holds.
    """
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON error answer ``{"ok": false, "error": {"code", "message"}}`` with the CORS headers."""
    body = {"ok": False, "error": {"code": code, "message": message}}
    return web.json_response(body, status=status, headers={**CORS_HEADERS, **(headers or {})})


def unauthorized(message: str) -> web.Response:
    """``401`` with the bearer challenge."""
    return error(401, "unauthorized", message, {"WWW-Authenticate": 'Bearer realm="switchboard"'})


def unavailable() -> web.Response:
    """``503``: Redis did not confirm in time."""
    return error(
        503, "queue_unavailable", "the queue did not confirm in time; retry", dict(QueueUnavailableError.HEADERS)
    )


def too_many(wait_ms: int, message: str) -> web.Response:
    """``429`` with ``Retry-After`` (whole seconds)."""
    wait_s = retry_after_s(wait_ms)
    return error(429, "rate_limited", f"{message}; retry in {wait_s} s", {"Retry-After": str(wait_s)})


def reject(app: web.Application, reason: str) -> None:
    """Count a refused request on the web channel's metrics."""
    metrics = app.get(METRICS)
    if metrics is not None:
        metrics.rejected("web", reason)


def bearer(request: web.BaseRequest, *, allow_query: bool) -> str | None:
    """The token the request carries; ``None`` when missing or not a token's shape (ours are short ASCII)."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    token: str | None = None
    if scheme.lower() == "bearer" and value.strip():
        token = value.strip()
    elif allow_query:
        token = request.query.get("token") or None
    # A raw non-UTF-8 byte in a header arrives as a lone surrogate that no encoder takes: refuse it here.
    if token is None or len(token) > TOKEN_MAX_CHARS or not token.isascii():
        return None
    return token


async def session_for(request: web.BaseRequest, app: web.Application, *, allow_query: bool) -> SessionKey | None:
    """The session the request's token maps to (refreshing its TTL), or ``None`` for a wrong or missing token.

    Raises:
        QueueUnavailableError: Redis did not answer in time.
    """
    token = bearer(request, allow_query=allow_query)
    if not token:
        return None
    token_hash = hash_token(token)
    cache = app[TOKENS]
    cached = cache.get(token_hash)
    if cached is not None:
        return cached
    try:
        async with asyncio.timeout(app[SETTINGS].queue.ingest_timeout_s):
            value = await app[REDIS].getex(GlobalKeys().web_token(token_hash), ex=TOKEN_TTL_S)
    except (TimeoutError, RedisError, OSError) as exc:
        raise QueueUnavailableError("token lookup failed") from exc
    if value is None:
        return None
    session = SessionKey(value.decode() if isinstance(value, bytes) else str(value))
    cache.put(token_hash, session)
    return session


async def bearer_session(request: web.BaseRequest, app: web.Application) -> SessionKey | web.Response:
    """The session a POST's bearer token names, or the response refusing the request (``401``, or ``503``)."""
    try:
        session = await session_for(request, app, allow_query=False)
    except QueueUnavailableError:
        reject(app, "queue_unavailable")
        return unavailable()
    if session is None:
        reject(app, "unauthorized")
        return unauthorized("missing or wrong bearer token: create a session with POST /api/chat/sessions")
    return session


async def preflight(request: web.Request) -> web.Response:
    """CORS preflight for the chat API (sites embedding the chat call it cross-origin)."""
    return web.Response(status=204, headers=dict(CORS_HEADERS))
