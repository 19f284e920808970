"""Web chat uploads: ``POST /api/chat/uploads``, then a message naming them (real route, real Redis)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import FormData

from switchboard.core.messages import InboundMessage, Posted
from switchboard.errors import AttachmentError
from switchboard.queue.keys import SessionKeys
from switchboard.queue.uploads import UPLOAD_TTL_S, UploadStore, kind_for
from switchboard.settings import Settings
from switchboard.types import SessionKey

from .conftest import Chat, build_app, read_sse

PDF = b"%PDF-1.4 quarterly figures"


async def dump(chat: Chat) -> dict[str, Any]:
    """Every key and its serialised value (``DUMP``): a refused request leaves this unchanged."""
    keys = sorted(await chat.redis.keys("*"))
    return {str(k): await chat.redis.dump(k) for k in keys}


async def upload(
    chat: Chat, token: str | None, data: bytes, *, name: str = "report.pdf", mime: str = "application/pdf"
) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": mime, **({"Authorization": f"Bearer {token}"} if token else {})}
    resp = await chat.client.post("/api/chat/uploads", params={"filename": name}, data=data, headers=headers)
    return resp.status, await resp.json()


async def stored_messages(chat: Chat, session: SessionKey) -> list[InboundMessage]:
    ids = await chat.redis.lrange(SessionKeys(session).inbox, 0, -1)
    raw = [await chat.redis.hget(SessionKeys(session).messages, i) for i in ids]
    return [InboundMessage.model_validate_json(r) for r in raw if r is not None]


async def test_an_upload_is_kept_for_its_session_and_a_message_carries_it(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    status, body = await upload(chat, token, PDF, name="C:\\Users\\ada\\Q3 report.pdf")
    assert status == 201, body
    assert body == {
        "upload": body["upload"],
        "name": "Q3 report.pdf",
        "size": len(PDF),
        "mime_type": "application/pdf",
        "kind": "document",
    }
    key = SessionKeys(session).web_upload(body["upload"])
    assert await chat.redis.hget(key, "data") == PDF
    assert 0 < await chat.redis.ttl(key) <= UPLOAD_TTL_S

    resp = await chat.post(token, {"text": "", "attachments": [body["upload"]], "client_id": "c1"})
    assert resp.status == 202, await resp.text()
    (message,) = await stored_messages(chat, session)
    assert message.text == ""
    assert isinstance(message.event, Posted)
    (attachment,) = message.event.attachments
    assert (attachment.kind, attachment.ref, attachment.name, attachment.mime_type, attachment.size) == (
        "document",
        body["upload"],
        "Q3 report.pdf",
        "application/pdf",
        len(PDF),
    )


async def test_multipart_uploads_and_kinds_from_the_mime_type(chat: Chat) -> None:
    _, token = await chat.new_session()
    form = FormData()
    form.add_field("file", b"\x89PNG\r\n\x1a\n" + b"\x00" * 32, filename="cat.png", content_type="image/png")
    resp = await chat.client.post("/api/chat/uploads", data=form, headers={"Authorization": f"Bearer {token}"})
    assert resp.status == 201, await resp.text()
    assert (await resp.json())["kind"] == "image"
    assert [kind_for(m) for m in ("image/webp", "audio/ogg", "video/mp4", "text/csv", "nonsense")] == [
        "image",
        "audio",
        "video",
        "document",
        "document",
    ]
    status, body = await upload(chat, token, b"a,b\n1,2\n", name="figures.csv", mime="application/octet-stream")
    assert (status, body["mime_type"]) == (201, "text/csv")  # a generic type: guessed from the name


async def test_another_sessions_token_cannot_use_or_read_an_upload(chat: Chat) -> None:
    _, owner = await chat.new_session()
    _, other = await chat.new_session()
    status, body = await upload(chat, owner, PDF)
    assert status == 201
    before = await dump(chat)
    resp = await chat.post(other, {"text": "look", "attachments": [body["upload"]]})
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["code"] == "malformed_body" and "unknown upload" in error["message"]
    assert await dump(chat) == before
    # a worker reads it back only for the owner's conversation
    store = UploadStore(chat.redis)
    with pytest.raises(AttachmentError, match="gone"):
        await store.read(await chat.session_key(other), body["upload"], 2**20)
    assert (await store.read(await chat.session_key(owner), body["upload"], 2**20)).data == PDF


async def test_unknown_upload_ids_and_too_many_attachments_are_400_with_nothing_written(chat: Chat) -> None:
    _, token = await chat.new_session()
    max_count = chat.settings.attachments.max_count
    before = await dump(chat)
    cases: list[dict[str, Any]] = [
        {"text": "hi", "attachments": ["0" * 32]},  # well formed, never uploaded
        {"text": "hi", "attachments": [f"{i:032x}" for i in range(max_count + 1)]},
        {"text": "hi", "attachments": ["../../etc"]},
        {"text": "hi", "attachments": "0" * 32},
        {"text": "hi", "attachments": ["0" * 32, "0" * 32]},
        {"choice": "pro", "attachments": ["0" * 32]},
        {"text": "", "attachments": []},  # no text and no files
    ]
    for case in cases:
        resp = await chat.post(token, case)
        assert resp.status == 400, (case, await resp.text())
    assert "at most" in (await (await chat.post(token, cases[1])).json())["error"]["message"]
    assert await dump(chat) == before


async def test_an_oversize_upload_is_413_before_reading_with_nothing_written(
    chat: Chat, settings: Settings, aiohttp_client: Any
) -> None:
    small = settings.model_copy(update={"attachments": settings.attachments.model_copy(update={"max_bytes": 4096})})
    app = build_app(small, chat.redis)
    client = await aiohttp_client(app)
    resp = await client.post("/api/chat/sessions")
    token = (await resp.json())["token"]
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/pdf"}
    before = await dump(chat)
    resp = await client.post("/api/chat/uploads", data=b"x" * 4097, headers=headers)  # Content-Length says so
    assert resp.status == 413
    assert (await resp.json())["error"]["code"] == "file_too_large"

    async def chunks() -> Any:  # no Content-Length: refused once the stream passes the cap
        for _ in range(10):
            yield b"x" * 1024

    resp = await client.post("/api/chat/uploads", data=chunks(), headers=headers)
    assert resp.status == 413
    form = FormData()
    form.add_field("file", b"x" * 4097, filename="big.pdf", content_type="application/pdf")
    resp = await client.post("/api/chat/uploads", data=form, headers={"Authorization": f"Bearer {token}"})
    assert resp.status == 413
    assert await dump(chat) == before
    resp = await client.post("/api/chat/uploads", data=b"x" * 4096, headers=headers)
    assert resp.status == 201  # exactly the cap is allowed


async def test_uploads_need_a_token_a_file_and_are_rate_limited(
    chat: Chat, settings: Settings, aiohttp_client: Any
) -> None:
    before = await dump(chat)
    assert (await upload(chat, None, PDF))[0] == 401
    assert (await upload(chat, "not-a-token", PDF))[0] == 401
    assert await dump(chat) == before
    _, token = await chat.new_session()
    before = await dump(chat)
    assert (await upload(chat, token, b""))[0] == 400
    form = FormData(default_to_multipart=True)
    form.add_field("note", "no file here")
    resp = await chat.client.post("/api/chat/uploads", data=form, headers={"Authorization": f"Bearer {token}"})
    assert resp.status == 400
    assert await dump(chat) == before

    limited = settings.model_copy(
        update={"limits": settings.limits.model_copy(update={"messages_per_session_per_minute": 2})}
    )
    client = await aiohttp_client(build_app(limited, chat.redis))
    token = (await (await client.post("/api/chat/sessions")).json())["token"]
    statuses = []
    for _ in range(3):
        resp = await client.post("/api/chat/uploads", data=PDF, headers={"Authorization": f"Bearer {token}"})
        statuses.append(resp.status)
    assert statuses == [201, 201, 429]
    assert int(resp.headers["Retry-After"]) >= 1


async def test_the_echo_names_the_files_and_preflight_allows_uploads(chat: Chat) -> None:
    _, token = await chat.new_session()
    status, body = await upload(chat, token, PDF)
    assert status == 201
    async with chat.client.get(f"/api/chat/stream?token={token}") as stream:
        resp = await chat.post(token, {"text": "see attached", "attachments": [body["upload"]]})
        assert resp.status == 202
        (echo,) = await read_sse(stream, 1)
    assert echo.event == "user" and echo.data is not None
    assert echo.data["attachments"] == [
        {"upload": body["upload"], "name": "report.pdf", "mime_type": "application/pdf", "size": len(PDF)}
    ]
    resp = await chat.client.options("/api/chat/uploads")
    assert resp.status == 204 and "POST" in resp.headers["Access-Control-Allow-Methods"]
