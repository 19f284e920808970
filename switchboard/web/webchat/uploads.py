"""``POST /api/chat/uploads``: files the web chat's user attaches to a message (part of the web chat's public API).

An upload belongs to the session whose token sent it, is capped (413 before reading anything, or as soon as the body
passes the cap), counts against the session's message rate, and is kept in Redis for an hour so any worker can read
it (``docs/channels/web-chat.md``).
"""

from __future__ import annotations

import logging
import mimetypes
import posixpath
import re
from typing import Final

from aiohttp import BodyPartReader, web

from switchboard.errors import QueueUnavailableError
from switchboard.queue.uploads import UploadStore
from switchboard.settings import Settings
from switchboard.web.appkeys import REDIS, SETTINGS
from switchboard.web.webchat import access

__all__ = ["MAX_NAME_CHARS", "add_upload_routes", "post_upload"]

logger = logging.getLogger(__name__)

MAX_NAME_CHARS: Final = 200
"""Longest file name kept (a longer one is cut, keeping its extension)."""
_MULTIPART_SLACK: Final = 16 * 1024
"""What a multipart body may carry besides the file (boundaries, part headers)."""
_MIME: Final = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,63}/[a-z0-9][a-z0-9!#$&^_.+-]{0,63}")
_DEFAULT_MIME: Final = "application/octet-stream"
_CHUNK: Final = 64 * 1024


class _TooLarge(Exception):
    pass


def _clean_name(raw: str | None, mime_type: str) -> str:
    """A displayable file name: the last path component, printable, at most :data:`MAX_NAME_CHARS`."""
    name = posixpath.basename((raw or "").replace("\\", "/")).strip()
    name = "".join(ch for ch in name if ch.isprintable())
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        name = ""
    if not name or name in {".", ".."}:
        name = "upload" + (mimetypes.guess_extension(mime_type) or "")
    if len(name) > MAX_NAME_CHARS:
        _stem, dot, ext = name.rpartition(".")
        keep = ext if dot and 0 < len(ext) <= 16 else ""
        name = name[: MAX_NAME_CHARS - len(keep) - 1].rstrip() + ("." + keep if keep else "")
    return name


def _clean_mime(raw: str | None) -> str:
    value = (raw or "").split(";", 1)[0].strip().lower()
    return value if _MIME.fullmatch(value) else _DEFAULT_MIME


async def _raw_file(request: web.Request, limit: int) -> tuple[str | None, str | None, bytes]:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return request.query.get("filename"), request.headers.get("Content-Type"), b"".join(chunks)


async def _multipart_file(request: web.Request, limit: int) -> tuple[str | None, str | None, bytes] | None:
    """The first part of a multipart body, or ``None`` when it is not a file part."""
    reader = await request.multipart()
    part = await reader.next()
    if not isinstance(part, BodyPartReader) or part.filename is None:
        return None
    chunks: list[bytes] = []
    size = 0
    while chunk := await part.read_chunk(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return part.filename, part.headers.get("Content-Type"), b"".join(chunks)


async def post_upload(request: web.Request) -> web.Response:
    """``POST /api/chat/uploads`` (bearer): keep one file for the session; ``201 {"upload", ...}``."""
    app = request.app
    settings: Settings = app[SETTINGS]
    limit = settings.attachments.max_bytes
    too_large = f"files are limited to {limit} bytes ({limit / 2**20:.1f} MiB)"
    multipart = request.content_type.startswith("multipart/")
    declared = request.content_length
    if declared is not None and declared > limit + (_MULTIPART_SLACK if multipart else 0):
        access.reject(app, "too_large")
        return access.error(413, "file_too_large", too_large)
    session = await access.bearer_session(request, app)
    if isinstance(session, web.Response):
        return session
    try:
        found = await (_multipart_file(request, limit) if multipart else _raw_file(request, limit))
    except _TooLarge:
        access.reject(app, "too_large")
        return access.error(413, "file_too_large", too_large)
    except ValueError:  # a malformed multipart body (no boundary, bad headers)
        found = None
    if found is None:
        access.reject(app, "malformed_body")
        return access.error(400, "malformed_body", "a multipart upload's first part must be the file")
    raw_name, raw_mime, data = found
    if not data:
        access.reject(app, "malformed_body")
        return access.error(400, "empty_file", "the file is empty")
    mime_type = _clean_mime(raw_mime)
    if mime_type == _DEFAULT_MIME and raw_name:
        mime_type = _clean_mime(mimetypes.guess_type(raw_name)[0])
    name = _clean_name(raw_name, mime_type)
    store = UploadStore(app[REDIS], timeout_s=settings.queue.ingest_timeout_s)
    try:
        wait_ms = await store.count(session, settings.limits.messages_per_session_per_minute)
        if wait_ms:
            access.reject(app, "rate_limited")
            return access.too_many(wait_ms, "too many uploads in this session")
        upload = await store.store(session, name, mime_type, data)
    except QueueUnavailableError:
        access.reject(app, "queue_unavailable")
        return access.unavailable()
    logger.debug("web chat upload stored: %d bytes, %s", upload.size, upload.kind)
    body = {
        "upload": upload.id,
        "name": upload.name,
        "size": upload.size,
        "mime_type": upload.mime_type,
        "kind": upload.kind,
    }
    return web.json_response(body, status=201, headers={**access.CORS_HEADERS, **access.NO_STORE})


def add_upload_routes(app: web.Application) -> None:
    """Register ``POST /api/chat/uploads`` and its CORS preflight."""
    app.router.add_post("/api/chat/uploads", post_upload)
    app.router.add_route("OPTIONS", "/api/chat/uploads", access.preflight)
