"""A small Telegram Bot API client on one aiohttp session: POST JSON (or a file), read ``{"ok": …}``, map errors.

The token sits in the URL path, so nothing here logs or quotes a URL and every error text is scrubbed of it. Answers
map to the gateway's errors: 429 → :class:`RateLimitedError`; 5xx and network trouble → retryable; other 4xx →
:class:`BotApiRefusal`, which keeps Telegram's description.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

from switchboard.channels.base import json_object
from switchboard.errors import AttachmentError, DeliveryError, RateLimitedError

__all__ = ["BotApi", "BotApiRefusal", "Upload"]

logger = logging.getLogger(__name__)

_CHANNEL: Final = "telegram"
_POOL_SIZE: Final = 128
_TIMEOUT: Final = aiohttp.ClientTimeout(total=20, connect=5, sock_read=10)
_UPLOAD_TIMEOUT: Final = aiohttp.ClientTimeout(total=300, connect=5, sock_read=60)
"""Up to 50 MB goes up in one request: minutes on a slow uplink, not the 20 s of a text message."""
_DOWNLOAD_TIMEOUT: Final = aiohttp.ClientTimeout(total=120, connect=5, sock_read=30)
_CHUNK: Final = 64 * 1024
_JSON: Final = {"Content-Type": "application/json"}


@dataclass(frozen=True, slots=True)
class Upload:
    """One file sent as a multipart field: ``field`` is the Bot API parameter (``document``, ``photo``)."""

    field: str
    filename: str
    data: bytes
    content_type: str


class BotApiRefusal(DeliveryError):
    """Telegram refused the call for good (4xx other than 429); ``description`` is its own words.

    Args:
        message: The error text (token-free).
        status: The HTTP status (Telegram's ``error_code``).
        description: Telegram's ``description``.
        migrate_to_chat_id: The group's new id when it was upgraded to a supergroup.
    """

    def __init__(self, message: str, *, status: int, description: str, migrate_to_chat_id: int | None = None) -> None:
        super().__init__(message, channel=_CHANNEL, retryable=False)
        self.status = status
        self.description = description
        self.migrate_to_chat_id = migrate_to_chat_id


class BotApi:
    """Bot API calls for one bot token against a configurable API root.

    Args:
        token: The bot token (never logged; scrubbed from every error text).
        root: The Bot API root, e.g. ``https://api.telegram.org``.
    """

    def __init__(self, token: str, root: str) -> None:
        self._token = token
        self._base = f"{root.rstrip('/')}/bot{token}/"
        self._files = f"{root.rstrip('/')}/file/bot{token}/"
        self._session: aiohttp.ClientSession | None = None

    def _scrub(self, text: str) -> str:
        return text.replace(self._token, "<bot-token>") if self._token else text

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=_POOL_SIZE, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=_TIMEOUT, json_serialize=json.dumps, raise_for_status=False
            )
        return self._session

    async def call(self, method: str, params: dict[str, Any], *, wait_s: float | None = None) -> Any:
        """Call ``method`` with ``params`` (``None`` values left out); returns the answer's ``result``.

        ``wait_s`` (seconds) replaces the usual timeout: a ``getUpdates`` long poll waits longer than a send.

        Raises:
            RateLimitedError: 429; retry after ``retry_after`` seconds.
            BotApiRefusal: any other 4xx, or a chat that migrated (not retryable).
            DeliveryError: 5xx, a timeout, a network failure or an unreadable answer (retryable).
        """
        body = json.dumps({k: v for k, v in params.items() if v is not None}, separators=(",", ":"))
        limits = aiohttp.ClientTimeout(total=wait_s, connect=5, sock_read=wait_s) if wait_s is not None else None
        return await self._post(method, data=body.encode(), headers=_JSON, limits=limits)

    async def upload(self, method: str, params: dict[str, Any], upload: Upload) -> Any:
        """Call ``method`` as ``multipart/form-data`` with one file (``sendDocument``, ``sendPhoto``).

        Object parameters (``reply_parameters``) travel as JSON strings, as the Bot API expects in a form.

        Raises:
            RateLimitedError: 429; retry after ``retry_after`` seconds.
            BotApiRefusal: any other 4xx (the file too big, a photo Telegram cannot process).
            DeliveryError: 5xx, a timeout, a network failure or an unreadable answer (retryable).
        """
        form = aiohttp.FormData()
        for key, value in params.items():
            if value is None:
                continue
            form.add_field(key, value if isinstance(value, str) else json.dumps(value, separators=(",", ":")))
        form.add_field(upload.field, upload.data, filename=upload.filename, content_type=upload.content_type)
        return await self._post(method, data=form, headers=None, limits=_UPLOAD_TIMEOUT)

    async def _post(
        self, method: str, *, data: Any, headers: dict[str, str] | None, limits: aiohttp.ClientTimeout | None
    ) -> Any:
        try:
            async with self._http().post(self._base + method, data=data, headers=headers, timeout=limits) as resp:
                status = resp.status
                raw = await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            detail = self._scrub(str(exc))[:200] or type(exc).__name__
            raise DeliveryError(
                f"telegram unreachable: {method}: {type(exc).__name__}: {detail}", channel=_CHANNEL, retryable=True
            ) from None
        answer = json_object(raw)
        if answer is None:
            if status == 413:
                raise BotApiRefusal(
                    f"telegram refused {method}: the upload is too large",
                    status=413,
                    description="Request Entity Too Large",
                )
            raise DeliveryError(
                f"telegram answered {method} with HTTP {status} and no Bot API answer",
                channel=_CHANNEL,
                retryable=status >= 500 or status == 200,
            )
        if answer.get("ok") is True and status < 300:
            return answer.get("result")
        return self._refusal(method, status, answer)

    def _refusal(self, method: str, status: int, answer: dict[str, Any]) -> Any:
        code = answer.get("error_code")
        code = code if isinstance(code, int) and not isinstance(code, bool) else status
        description = self._scrub(str(answer.get("description") or f"HTTP {code}"))
        parameters = answer.get("parameters") if isinstance(answer.get("parameters"), dict) else {}
        assert isinstance(parameters, dict)
        text = f"telegram {method}: {description}"
        retry_after = parameters.get("retry_after")
        if code == 429 or isinstance(retry_after, int | float):
            wait = float(retry_after) if isinstance(retry_after, int | float) else 1.0
            raise RateLimitedError(text, channel=_CHANNEL, retry_after=wait)
        migrated = parameters.get("migrate_to_chat_id")
        if isinstance(migrated, int):
            raise BotApiRefusal(
                f"{text} (the group is now chat {migrated})",
                status=code,
                description=description,
                migrate_to_chat_id=migrated,
            )
        if 400 <= code < 500:
            raise BotApiRefusal(f"telegram refused the call: {text}", status=code, description=description)
        raise DeliveryError(f"telegram failing: {text}", channel=_CHANNEL, retryable=True)

    async def download(self, file_path: str, limit: int) -> bytes:
        """Download a file ``getFile`` named, refusing more than ``limit`` bytes (stops reading past the cap).

        Raises:
            AttachmentError: too large (``too_large``), gone, refused, or Telegram unreachable.
        """
        url = self._files + file_path.lstrip("/")
        try:
            async with self._http().get(url, timeout=_DOWNLOAD_TIMEOUT) as resp:
                if resp.status != 200:
                    raise AttachmentError(f"telegram refused the file download (HTTP {resp.status})", channel=_CHANNEL)
                if resp.content_length is not None and resp.content_length > limit:
                    raise _too_large(resp.content_length, limit)
                data = bytearray()
                async for chunk in resp.content.iter_chunked(_CHUNK):
                    data += chunk
                    if len(data) > limit:
                        raise _too_large(None, limit)
                return bytes(data)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise AttachmentError(
                f"telegram unreachable while downloading a file: {type(exc).__name__}", channel=_CHANNEL
            ) from None

    async def aclose(self) -> None:
        """Close the connection pool."""
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()


def _too_large(size: int | None, limit: int) -> AttachmentError:
    said = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    return AttachmentError(f"the file is {said}; the limit is {limit} bytes", channel=_CHANNEL, too_large=True)
