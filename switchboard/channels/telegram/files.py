"""Files through the Telegram Bot API: ``sendPhoto`` / ``sendDocument`` out, ``getFile`` + download in.

The Bot API's caps decide the method (a photo up to 10 MB, a document up to 50 MB, nothing beyond: a non-retryable
error saying why). Downloads are refused from ``getFile``'s size before downloading and read no further than the cap.
"""

from __future__ import annotations

import logging
import mimetypes
from pathlib import PurePosixPath
from typing import Any, Final

from switchboard.channels.base import FileData
from switchboard.channels.telegram.api import BotApi, BotApiRefusal, Upload
from switchboard.core.messages import Attachment
from switchboard.errors import AttachmentError, DeliveryError

__all__ = ["MAX_DOCUMENT_BYTES", "MAX_FETCH_BYTES", "MAX_PHOTO_BYTES", "fetch_file", "upload_file"]

logger = logging.getLogger(__name__)

_CHANNEL: Final = "telegram"
MAX_DOCUMENT_BYTES = 50 * 1000 * 1000
"""Largest file a bot uploads with ``sendDocument`` (Bot API: 50 MB)."""
MAX_PHOTO_BYTES = 10 * 1000 * 1000
"""Largest image sent with ``sendPhoto`` (Bot API: 10 MB); a bigger one goes as a document."""
MAX_FETCH_BYTES = 20 * 1000 * 1000
"""Largest file a bot downloads with ``getFile`` (Bot API: 20 MB)."""
_PHOTO_TYPES = frozenset({"image/jpeg", "image/png", "image/webp"})


async def upload_file(api: BotApi, file: FileData, params: dict[str, Any]) -> tuple[str, dict[str, Any], int]:
    """Send ``file`` with ``params`` (chat, caption, reply); returns ``(method, message, size)``.

    Raises:
        DeliveryError: the file is over 50 MB (not retryable), or Telegram failed.
        RateLimitedError: Telegram answered 429.
    """
    data = file.data
    if len(data) > MAX_DOCUMENT_BYTES:
        raise DeliveryError(
            f"{file.name} is {len(data)} bytes; Telegram bots send files up to {MAX_DOCUMENT_BYTES} bytes",
            channel=_CHANNEL,
            retryable=False,
        )
    content_type = file.mime_type or mimetypes.guess_type(file.name)[0] or "application/octet-stream"
    as_photo = content_type in _PHOTO_TYPES and len(data) <= MAX_PHOTO_BYTES
    method = "sendPhoto" if as_photo else "sendDocument"
    try:
        message = await api.upload(
            method, params, Upload("photo" if as_photo else "document", file.name, data, content_type)
        )
    except BotApiRefusal as exc:
        if not as_photo or exc.status != 400:
            raise
        logger.info("telegram refused a photo (%s); sending it as a document", exc.description)
        method = "sendDocument"
        message = await api.upload(method, params, Upload("document", file.name, data, content_type))
    if not isinstance(message, dict) or "message_id" not in message:
        raise DeliveryError(f"telegram answered {method} without a message", channel=_CHANNEL)
    return method, message, len(data)


def _too_large(size: int, limit: int) -> AttachmentError:
    return AttachmentError(f"the file is {size} bytes; the limit is {limit} bytes", channel=_CHANNEL, too_large=True)


async def fetch_file(api: BotApi, attachment: Attachment, limit: int) -> FileData:
    """Download what ``attachment`` refers to (a ``file_id``), refusing more than ``limit`` bytes.

    Raises:
        AttachmentError: too large, gone (the ``file_id`` expired or is unknown), or Telegram refused or failed.
    """
    limit = min(limit, MAX_FETCH_BYTES)
    if attachment.size is not None and attachment.size > limit:
        raise _too_large(attachment.size, limit)
    try:
        info = await api.call("getFile", {"file_id": attachment.ref})
    except BotApiRefusal as exc:
        too_big = "too big" in exc.description.lower()
        raise AttachmentError(
            f"telegram refused the file: {exc.description}", channel=_CHANNEL, too_large=too_big
        ) from None
    except DeliveryError as exc:
        raise AttachmentError(f"telegram could not look the file up: {exc}", channel=_CHANNEL) from None
    path = info.get("file_path") if isinstance(info, dict) else None
    if not isinstance(path, str) or not path:
        raise AttachmentError("telegram has no file_path for the file (it may be gone)", channel=_CHANNEL)
    size = info.get("file_size")
    if isinstance(size, int) and size > limit:
        raise _too_large(size, limit)
    data = await api.download(path, limit)
    name = attachment.name or PurePosixPath(path).name or "file"
    return FileData(name=name, data=data, mime_type=attachment.mime_type or mimetypes.guess_type(name)[0])
