"""Files the web chat's users upload, kept in Redis for the worker that answers the message they are attached to.

The web process and the workers may run on different hosts, so an upload is stored where every worker can read
it: one HASH per upload under the session's keys (:meth:`~switchboard.queue.keys.SessionKeys.web_upload`), with
its name, MIME type, kind, size and bytes, expiring after :data:`UPLOAD_TTL_S`. Only a request holding that
session's token can name it (the key is built from the session the token maps to), and a worker reads it back
for the conversation of the message that carries it, never for another.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from dataclasses import dataclass
from typing import Final, Literal

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard.channels.base import FileData
from switchboard.errors import AttachmentError, QueueUnavailableError
from switchboard.queue import scripts
from switchboard.queue.keys import SessionKeys
from switchboard.types import SessionKey

__all__ = ["UPLOAD_ID", "UPLOAD_TTL_S", "Upload", "UploadStore", "kind_for"]

UPLOAD_TTL_S: Final = 3600
"""An upload is kept this long: time enough to send the message it belongs to and for a worker to answer it."""
UPLOAD_ID: Final = re.compile(r"[0-9a-f]{32}")
"""The shape of an upload id (a uuid4 in hex)."""
_MINUTE_MS: Final = 60_000

Kind = Literal["image", "document", "audio", "voice", "video"]


def kind_for(mime_type: str) -> Kind:
    """What the agent is given a file as, from its MIME type: an image, audio, a video, or a document."""
    major = mime_type.partition("/")[0].strip().lower()
    if major == "image":
        return "image"
    if major == "audio":
        return "audio"
    if major == "video":
        return "video"
    return "document"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True, slots=True)
class Upload:
    """What is known of a stored upload without reading its bytes."""

    id: str
    name: str
    mime_type: str
    kind: Kind
    size: int


class UploadStore:
    """Stores, describes and reads back web chat uploads (over a Redis client owned by the caller)."""

    def __init__(self, redis: aioredis.Redis, *, timeout_s: float = 5.0) -> None:
        """Create the store; each call waits at most ``timeout_s`` for Redis."""
        self.redis = redis
        self.timeout_s = timeout_s

    async def count(self, session: SessionKey, per_minute: int) -> int:
        """Count one upload against the session's upload meter: 0 when allowed (and counted), else the wait in ms.

        Raises:
            QueueUnavailableError: Redis did not answer in time.
        """
        if per_minute <= 0:
            return 0
        try:
            async with asyncio.timeout(self.timeout_s):
                meter = SessionKeys(session).upload_rate
                wait = await scripts.SESSION_QUOTA(self.redis, [meter], [per_minute, _MINUTE_MS])
        except (TimeoutError, RedisError, OSError) as err:
            raise QueueUnavailableError(f"the upload limit could not be checked: {type(err).__name__}") from err
        return int(wait)

    async def store(self, session: SessionKey, name: str, mime_type: str, data: bytes) -> Upload:
        """Keep ``data`` for the session under a new upload id (for :data:`UPLOAD_TTL_S`).

        Raises:
            QueueUnavailableError: Redis did not confirm in time (the upload may or may not be kept; it expires).
        """
        upload = Upload(id=uuid.uuid4().hex, name=name, mime_type=mime_type, kind=kind_for(mime_type), size=len(data))
        key = SessionKeys(session).web_upload(upload.id)
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self.redis.pipeline(transaction=True) as pipe:
                    pipe.hset(
                        key,
                        mapping={
                            "name": upload.name,
                            "mime_type": upload.mime_type,
                            "kind": upload.kind,
                            "size": upload.size,
                            "data": data,
                        },
                    )
                    pipe.expire(key, UPLOAD_TTL_S)
                    await pipe.execute()
        except (TimeoutError, RedisError, OSError) as err:
            raise QueueUnavailableError(f"the upload could not be stored: {type(err).__name__}") from err
        return upload

    async def describe(self, session: SessionKey, ids: tuple[str, ...]) -> list[Upload | None]:
        """The session's uploads by id, without their bytes (``None`` for an id the session does not hold).

        Raises:
            QueueUnavailableError: Redis did not answer in time.
        """
        keys = SessionKeys(session)
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self.redis.pipeline(transaction=False) as pipe:
                    for upload_id in ids:
                        pipe.hmget(keys.web_upload(upload_id), ["name", "mime_type", "kind", "size"])
                    rows = await pipe.execute()
        except (TimeoutError, RedisError, OSError) as err:
            raise QueueUnavailableError(f"the uploads could not be looked up: {type(err).__name__}") from err
        found: list[Upload | None] = []
        for upload_id, row in zip(ids, rows, strict=True):
            name, mime_type, kind, size = row
            if name is None or mime_type is None or kind is None or size is None:
                found.append(None)
                continue
            found.append(
                Upload(
                    id=upload_id,
                    name=_text(name),
                    mime_type=_text(mime_type),
                    kind=kind_for(_text(mime_type)),
                    size=int(size),
                )
            )
        return found

    async def read(self, session: SessionKey, upload_id: str, limit: int) -> FileData:
        """The upload's bytes, refused without reading them when it is over ``limit`` bytes.

        Raises:
            AttachmentError: no such upload in this session (expired, or never sent), over ``limit``, or Redis
                failed.
        """
        if not UPLOAD_ID.fullmatch(upload_id):
            raise AttachmentError("it is not a web chat upload", channel="web")
        key = SessionKeys(session).web_upload(upload_id)
        try:
            async with asyncio.timeout(self.timeout_s):
                name, mime_type, size = await self.redis.hmget(key, ["name", "mime_type", "size"])
                if name is None or size is None:
                    raise AttachmentError("it is gone (uploads are kept for an hour)", channel="web")
                if int(size) > limit:
                    raise AttachmentError("too large", channel="web", too_large=True)
                data = await self.redis.hget(key, "data")
        except (TimeoutError, RedisError, OSError) as err:
            raise AttachmentError(f"it could not be read: {type(err).__name__}", channel="web") from None
        if data is None:
            raise AttachmentError("it is gone (uploads are kept for an hour)", channel="web")
        if len(data) > limit:
            raise AttachmentError("too large", channel="web", too_large=True)
        body = data if isinstance(data, bytes) else data.encode()  # the client never decodes: always bytes
        return FileData(name=_text(name), data=body, mime_type=_text(mime_type) if mime_type else None)
