"""Discord's REST API on one aiohttp pool, honouring its per-route rate-limit buckets before sending.

Before a request whose bucket is empty the client waits when the refill is near, and otherwise raises
:class:`~switchboard.errors.RateLimitedError` so the outbox retries that send alone later. Interaction webhook URLs
contain the interaction token: errors and logs name the route template only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from switchboard.errors import DeliveryError, RateLimitedError

__all__ = ["DiscordApiError", "DiscordRest", "Upload"]

logger = logging.getLogger(__name__)

_CHANNEL = "discord"
_USER_AGENT = "DiscordBot (https://github.com/switchboard, 0.1) Switchboard"


@dataclass(frozen=True, slots=True)
class Upload:
    """A file for a multipart request (``files[n]``)."""

    name: str
    data: bytes
    content_type: str


class DiscordApiError(DeliveryError):
    """Discord refused a request: ``status`` and Discord's JSON error ``code`` (e.g. 10008 unknown message)."""

    def __init__(self, message: str, *, status: int, code: int | None, retryable: bool) -> None:
        super().__init__(message, channel=_CHANNEL, retryable=retryable)
        self.status = status
        self.code = code


@dataclass(slots=True)
class _Bucket:
    remaining: int
    reset_at: float


_MOST_WAIT_S = 3600.0
"""The longest wait a rate-limit answer is taken at (a larger ``retry_after`` or reset is read as this)."""


def _float(value: str | None) -> float | None:
    """A header's number; ``None`` when absent, unreadable or not finite (``NaN``, ``inf``)."""
    try:
        number = float(value) if value is not None else None
    except ValueError:
        return None
    return number if number is not None and math.isfinite(number) else None


def _seconds(value: float | None) -> float | None:
    """A wait Discord named, within ``[0, _MOST_WAIT_S]``."""
    return min(max(value, 0.0), _MOST_WAIT_S) if value is not None else None


class DiscordRest:
    """Requests to ``base_url`` (``…/api/v10``) with the bot token.

    Args:
        token: The bot token (``None``: only interaction webhooks, which carry their own token, work).
        base_url: The API root, e.g. ``https://discord.com/api/v10``.
        max_wait_s: The longest wait for a bucket to refill inside a request; longer waits raise instead.
    """

    def __init__(self, token: str | None, base_url: str, *, max_wait_s: float = 1.0) -> None:
        self._token = token
        self.base_url = base_url.rstrip("/")
        self._max_wait_s = max_wait_s
        self._session: aiohttp.ClientSession | None = None
        self._route_bucket: dict[str, str] = {}
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._global_until = 0.0
        self._closed = False

    def session(self) -> aiohttp.ClientSession:
        """The connection pool (created on first use, inside the running loop).

        Raises:
            DeliveryError: the client was closed (a listener still running after shutdown opens no new pool).
        """
        if self._closed:
            raise DeliveryError("discord: the API client is closed", channel=_CHANNEL, retryable=False)
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=30, connect=10), headers={"User-Agent": _USER_AGENT}
            )
        return self._session

    async def aclose(self) -> None:
        """Close the pool for good."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def _wait_for_bucket(self, route: str, major: str) -> None:
        now = time.monotonic()
        wait = self._global_until - now
        bucket = self._buckets.get((self._route_bucket.get(route, route), major))
        if bucket is not None and bucket.remaining <= 0:
            wait = max(wait, bucket.reset_at - now)
        if wait <= 0:
            if bucket is not None:
                bucket.remaining -= 1  # claimed for this request; the answer's headers correct it
            return
        if wait > self._max_wait_s:
            raise RateLimitedError(f"discord {route}: rate-limit bucket empty", channel=_CHANNEL, retry_after=wait)
        await asyncio.sleep(wait)

    def _learn(self, route: str, major: str, headers: Any) -> None:
        bucket_id = headers.get("X-RateLimit-Bucket")
        if bucket_id:
            self._route_bucket[route] = bucket_id
        remaining = _float(headers.get("X-RateLimit-Remaining"))
        after = _seconds(_float(headers.get("X-RateLimit-Reset-After")))
        if remaining is not None and after is not None:
            key = (bucket_id or route, major)
            self._buckets[key] = _Bucket(int(remaining), time.monotonic() + after)
        if len(self._buckets) > 10_000:  # old conversations' buckets: forget those already refilled
            now = time.monotonic()
            self._buckets = {k: b for k, b in self._buckets.items() if b.reset_at > now}

    async def request(
        self,
        method: str,
        route: str,
        *,
        major: str = "",
        path: str | None = None,
        json_body: Any = None,
        files: list[Upload] | None = None,
        params: dict[str, str] | None = None,
        auth: bool = True,
    ) -> Any:
        """One request; the decoded JSON answer (``None`` for 204).

        Args:
            method: HTTP method.
            route: The route template (``/channels/{channel_id}/messages``); names the bucket and errors.
            major: The route's major parameter value (channel id, interaction token hash …).
            path: The concrete path (defaults to ``route``).
            json_body: JSON body, or ``payload_json`` when ``files`` are sent.
            files: Files for a ``multipart/form-data`` request.
            params: Query parameters.
            auth: Send the bot token (interaction webhooks authenticate by their URL instead).

        Raises:
            RateLimitedError: a bucket is empty for longer than ``max_wait_s``, or Discord answered 429.
            DiscordApiError: Discord refused (4xx, not retryable) or failed (5xx, retryable).
            DeliveryError: the network failed (retryable).
        """
        name = f"{method} {route}"
        await self._wait_for_bucket(name, major)
        headers: dict[str, str] = {}
        if auth:
            if self._token is None:
                raise DeliveryError(
                    "discord: no bot token configured (SWITCHBOARD_DISCORD__BOT_TOKEN)",
                    channel=_CHANNEL,
                    retryable=False,
                )
            headers["Authorization"] = f"Bot {self._token}"
        data: Any = None
        if files:
            form = aiohttp.FormData()
            form.add_field("payload_json", json.dumps(json_body or {}), content_type="application/json")
            for index, upload in enumerate(files):
                form.add_field(f"files[{index}]", upload.data, filename=upload.name, content_type=upload.content_type)
            data = form
        elif json_body is not None:
            data = json.dumps(json_body).encode()
            headers["Content-Type"] = "application/json"
        url = self.base_url + (path or route)
        session = self.session()
        try:
            async with session.request(method, url, data=data, params=params, headers=headers) as resp:
                self._learn(name, major, resp.headers)
                body = await resp.read()
                status, retry_header = resp.status, resp.headers.get("Retry-After")
                is_global = resp.headers.get("X-RateLimit-Global", "").lower() == "true"
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DeliveryError(f"discord {name}: {type(exc).__name__}", channel=_CHANNEL) from None
        answer: Any = None
        if body:
            try:
                answer = json.loads(body)
            except ValueError:
                answer = None
        if status == 429:
            retry_after = _seconds(_float(str(answer.get("retry_after"))) if isinstance(answer, dict) else None)
            retry_after = retry_after if retry_after is not None else (_seconds(_float(retry_header)) or 1.0)
            if is_global or (isinstance(answer, dict) and answer.get("global")):
                self._global_until = time.monotonic() + retry_after
            logger.info("discord %s: 429, retry after %.2f s", name, retry_after)
            raise RateLimitedError(f"discord {name}: rate limited", channel=_CHANNEL, retry_after=retry_after)
        if status >= 400:
            code = answer.get("code") if isinstance(answer, dict) else None
            message = answer.get("message") if isinstance(answer, dict) else None
            raise DiscordApiError(
                f"discord {name}: {status} {message or ''}".rstrip()[:300],
                status=status,
                code=code if isinstance(code, int) else None,
                retryable=status >= 500,
            )
        return answer
