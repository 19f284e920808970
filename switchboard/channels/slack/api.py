"""A small Slack Web API client on one aiohttp session: POST JSON with a bearer token, read ``{"ok": …}``.

slack-sdk's ``AsyncWebClient`` makes a new session per call by default; the gateway keeps one keep-alive pool for the
adapter's life. Tokens live only in the ``Authorization`` header, never in a URL, a log or an error text. Answers map
to the gateway's errors: 429 or ``ratelimited`` → :class:`RateLimitedError`; 5xx and transient errors → retryable;
other refusals → :class:`SlackRefusal`, carrying Slack's error code.
"""

from __future__ import annotations

import json
from typing import Any, Final
from urllib.parse import urlencode

import aiohttp

from switchboard.channels.base import json_object, retry_after_s
from switchboard.errors import DeliveryError, RateLimitedError

__all__ = ["SlackApi", "SlackRefusal"]

_CHANNEL: Final = "slack"
_POOL_SIZE: Final = 128
_TIMEOUT: Final = aiohttp.ClientTimeout(total=20, connect=5, sock_read=10)
_UPLOAD_TIMEOUT: Final = aiohttp.ClientTimeout(total=300, connect=5, sock_read=60)
_TRANSIENT: Final = frozenset({"internal_error", "fatal_error", "service_unavailable", "request_timeout"})
_JSON: Final = "application/json; charset=utf-8"
_FORM: Final = "application/x-www-form-urlencoded"


class SlackRefusal(DeliveryError):
    """Slack answered ``"ok": false`` with an error that retrying will not fix.

    Args:
        method: The Web API method.
        error: Slack's error code (``channel_not_found``, ``not_allowed``, ``invalid_blocks`` …).
    """

    def __init__(self, method: str, error: str) -> None:
        super().__init__(f"slack refused {method}: {error}", channel=_CHANNEL, retryable=False)
        self.method = method
        self.error = error


class SlackApi:
    """Web API calls with one token against a configurable base URL.

    Args:
        token: A bot (``xoxb-``) or app-level (``xapp-``) token.
        base_url: The Web API root ending in ``/`` (``https://slack.com/api/``).
        session: A shared pool to use (not closed by :meth:`aclose`); one of its own otherwise.
    """

    def __init__(self, token: str, base_url: str, *, session: aiohttp.ClientSession | None = None) -> None:
        self._auth = {"Authorization": f"Bearer {token}"}
        self._base = base_url if base_url.endswith("/") else base_url + "/"
        self._session = session
        self._owned = session is None

    @property
    def base_url(self) -> str:
        """The Web API root (ends with ``/``)."""
        return self._base

    def http(self) -> aiohttp.ClientSession:
        """The connection pool (created on first use)."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=_POOL_SIZE, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=connector, timeout=_TIMEOUT, raise_for_status=False)
            self._owned = True
        return self._session

    async def call(self, method: str, params: dict[str, Any], *, form: bool = False) -> dict[str, Any]:
        """Call ``method`` with ``params`` (``None`` values left out); returns Slack's whole answer.

        ``form`` sends the parameters form-encoded (the file-upload methods take no JSON body).

        Raises:
            RateLimitedError: 429 or ``ratelimited``; retry after ``retry_after`` seconds.
            SlackRefusal: any other ``"ok": false`` (not retryable).
            DeliveryError: 5xx, a timeout, a network failure or an unreadable answer (retryable).
        """
        values = {k: v for k, v in params.items() if v is not None}
        if form:
            body = urlencode({k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()})
            headers = {**self._auth, "Content-Type": _FORM}
        else:
            body = json.dumps(values, separators=(",", ":"))
            headers = {**self._auth, "Content-Type": _JSON}
        try:
            async with self.http().post(self._base + method, data=body.encode(), headers=headers) as resp:
                status, retry_after, raw = resp.status, resp.headers.get("Retry-After"), await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise DeliveryError(
                f"slack unreachable: {method}: {type(exc).__name__}", channel=_CHANNEL, retryable=True
            ) from None
        return self._answer(method, status, retry_after, raw)

    async def upload(self, url: str, data: bytes, filename: str, content_type: str) -> None:
        """POST a file's bytes to the upload URL ``files.getUploadURLExternal`` gave (no token: the URL is signed).

        Raises:
            RateLimitedError: 429.
            DeliveryError: refused (not retryable), or 5xx / network trouble (retryable).
        """
        form = aiohttp.FormData()
        form.add_field("file", data, filename=filename, content_type=content_type)
        try:
            async with self.http().post(url, data=form, timeout=_UPLOAD_TIMEOUT) as resp:
                status, retry_after = resp.status, resp.headers.get("Retry-After")
                await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise DeliveryError(f"slack upload failed: {type(exc).__name__}", channel=_CHANNEL) from None
        if status == 429:
            raise RateLimitedError(
                "slack upload: rate limited", channel=_CHANNEL, retry_after=retry_after_s(retry_after)
            )
        if status >= 300:
            raise DeliveryError(f"slack upload answered HTTP {status}", channel=_CHANNEL, retryable=status >= 500)

    def _answer(self, method: str, status: int, retry_after: str | None, raw: bytes) -> dict[str, Any]:
        if status == 429:
            raise RateLimitedError(
                f"slack {method}: ratelimited", channel=_CHANNEL, retry_after=retry_after_s(retry_after)
            )
        answer = json_object(raw)
        if answer is None:
            raise DeliveryError(
                f"slack answered {method} with HTTP {status} and no Web API answer",
                channel=_CHANNEL,
                retryable=status >= 500 or status == 200,
            )
        if answer.get("ok") is True and status < 300:
            return answer
        error = str(answer.get("error") or f"http_{status}")[:100]
        if error == "ratelimited":
            raise RateLimitedError(
                f"slack {method}: ratelimited", channel=_CHANNEL, retry_after=retry_after_s(retry_after)
            )
        if status >= 500 or error in _TRANSIENT:
            raise DeliveryError(f"slack failing: {method}: {error}", channel=_CHANNEL, retryable=True)
        raise SlackRefusal(method, error)

    @property
    def auth_header(self) -> dict[str, str]:
        """The ``Authorization`` header (for file downloads from Slack's own hosts only)."""
        return dict(self._auth)

    async def aclose(self) -> None:
        """Close the pool if this client created it."""
        session, self._session = self._session, None
        if session is not None and self._owned and not session.closed:
            await session.close()
