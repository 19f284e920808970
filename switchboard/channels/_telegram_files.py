"""Files through the Telegram Bot API: ``sendPhoto`` for pictures, ``sendDocument`` for everything else.

The Bot API's caps decide the method: a JPEG, PNG or WebP up to 10 MB goes as a photo (shown inline);
anything else, or a bigger image, as a document up to 50 MB. Over that nothing is sent and the caller gets
a non-retryable :class:`~switchboard.errors.DeliveryError` saying why, so the agent can tell the user.
A photo Telegram cannot process (odd dimensions) goes again as a document. The file is read in a thread:
never in the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import mimetypes
from pathlib import Path
from typing import Any, Final

from switchboard.channels._botapi import BotApi, BotApiRefusal, Upload
from switchboard.errors import DeliveryError

__all__ = ["MAX_DOCUMENT_BYTES", "MAX_PHOTO_BYTES", "upload_file"]

logger = logging.getLogger(__name__)

_CHANNEL: Final = "telegram"
MAX_DOCUMENT_BYTES = 50 * 1000 * 1000
"""Largest file a bot uploads with ``sendDocument`` (Bot API: 50 MB)."""
MAX_PHOTO_BYTES = 10 * 1000 * 1000
"""Largest image sent with ``sendPhoto`` (Bot API: 10 MB); a bigger one goes as a document."""
_PHOTO_TYPES = frozenset({"image/jpeg", "image/png", "image/webp"})


def _read(path: Path) -> tuple[int, bytes]:
    """``(size, bytes)`` of a regular file; no bytes when it is over the upload cap."""
    if not path.is_file():
        raise FileNotFoundError(2, "no such file", str(path))
    size = path.stat().st_size
    return size, b"" if size > MAX_DOCUMENT_BYTES else path.read_bytes()


async def upload_file(
    api: BotApi, path: Path, mime_type: str | None, params: dict[str, Any]
) -> tuple[str, dict[str, Any], int]:
    """Send the file at ``path`` with ``params`` (chat, caption, reply); returns ``(method, message, size)``.

    Raises:
        DeliveryError: the file is gone, unreadable or over 50 MB (not retryable), or Telegram failed.
        RateLimitedError: Telegram answered 429.
    """
    try:
        size, data = await asyncio.to_thread(_read, path)
    except OSError as exc:
        raise DeliveryError(
            f"cannot read the file to send ({path.name}): {exc.strerror or type(exc).__name__}",
            channel=_CHANNEL,
            retryable=False,
        ) from None
    if size > MAX_DOCUMENT_BYTES or len(data) > MAX_DOCUMENT_BYTES:
        raise DeliveryError(
            f"{path.name} is {max(size, len(data))} bytes; Telegram bots send files up to {MAX_DOCUMENT_BYTES} bytes",
            channel=_CHANNEL,
            retryable=False,
        )
    content_type = mime_type or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    as_photo = content_type in _PHOTO_TYPES and len(data) <= MAX_PHOTO_BYTES
    method = "sendPhoto" if as_photo else "sendDocument"
    try:
        message = await api.upload(
            method, params, Upload("photo" if as_photo else "document", path.name, data, content_type)
        )
    except BotApiRefusal as exc:
        if not as_photo or exc.status != 400:
            raise
        logger.info("telegram refused a photo (%s); sending it as a document", exc.description)
        method = "sendDocument"
        message = await api.upload(method, params, Upload("document", path.name, data, content_type))
    if not isinstance(message, dict) or "message_id" not in message:
        raise DeliveryError(f"telegram answered {method} without a message", channel=_CHANNEL)
    return method, message, len(data)
