"""Web chat files end to end: upload → message → real drain and runtime → the model sees the file."""

from __future__ import annotations

import base64
from pathlib import Path

from switchboard.channels.registry import ChannelSet
from switchboard.channels.web.adapter import WebChannel
from switchboard.core.agent.attachments import AttachmentSupport
from switchboard.core.agent.config import Agent
from switchboard.core.agent.replay import ReplayModel
from switchboard.core.agent.runtime import Runtime
from switchboard.core.messages import Attachment, InboundMessage
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.gateway import workspace_for
from switchboard.errors import AttachmentError
from switchboard.queue.uploads import UploadStore
from switchboard.types import SessionKey
from switchboard.worker.drain import Drainer
from switchboard.worker.files import ChannelAttachments
from tests.core.turns import answer_step

from .conftest import SSE, Chat, read_sse

PDF = b"%PDF-1.4 quarterly figures"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


def drainer(chat: Chat, model: ReplayModel, tmp_path: Path, *, vision: bool) -> Drainer:
    """A worker as ``switchboard worker`` builds one: the web adapter reads uploads back from Redis."""
    web = WebChannel(chat.publisher.publish, read_upload=UploadStore(chat.redis).read)
    channels = ChannelSet({("web", "default"): web})
    models = ModelFactory(ProviderConfig())
    models.override("offline", model)
    runtime = Runtime(
        models=models,
        tools=default_registry(),
        workspace_root=tmp_path / "ws",
        attachments=AttachmentSupport(source=ChannelAttachments(channels)),
    )

    def agent_for(message: InboundMessage) -> Agent:
        return chat.settings.file.agent(message.conversation.agent).model_copy(update={"vision": vision})

    settings = chat.settings.queue.model_copy(update={"max_attempts": 1, "retry_backoff_s": 0})
    return Drainer(chat.redis, settings, runner=runtime.run_turn, deliverer=channels, agent_for=agent_for,
                   worker_id="w1")  # fmt: skip


async def upload(chat: Chat, token: str, data: bytes, name: str, mime: str) -> str:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": mime}
    resp = await chat.client.post("/api/chat/uploads", params={"filename": name}, data=data, headers=headers)
    assert resp.status == 201, await resp.text()
    return str((await resp.json())["upload"])


async def test_a_document_and_an_image_reach_the_model_and_the_reply_reaches_the_page(
    chat: Chat, tmp_path: Path
) -> None:
    model = ReplayModel([answer_step("Got your report and the cat.")], strict=False)
    _, token = await chat.new_session()
    session = SessionKey(await chat.session_key(token))
    doc = await upload(chat, token, PDF, "Q3 report.pdf", "application/pdf")
    image = await upload(chat, token, PNG, "cat.png", "image/png")
    async with chat.client.get(f"/api/chat/stream?token={token}") as stream:
        resp = await chat.post(token, {"text": "what are these?", "attachments": [doc, image]})
        assert resp.status == 202, await resp.text()
        await drainer(chat, model, tmp_path, vision=True).drain(session)
        events: list[SSE] = []
        while not events or events[-1].event != "message":
            batch = await read_sse(stream, 1)
            assert batch, "the stream ended before the reply"
            events += batch
    replies = [e.data["text"] for e in events if e.event == "message" and e.data]
    assert replies == ["Got your report and the cat."]

    (request,) = model.requests
    user = request.messages[-1].content
    assert user.startswith("what are these?") and "inbox/" in user and "Q3_report.pdf" in user
    images = [part for message in request.messages for part in message.images]
    assert [(i.mime_type, base64.b64decode(i.data)) for i in images] == [("image/png", PNG)]
    inbox = workspace_for(tmp_path / "ws", session) / "inbox"
    assert sorted(p.read_bytes() for p in inbox.iterdir()) == sorted([PDF, PNG])


async def test_a_file_only_message_without_vision_gives_the_model_paths(chat: Chat, tmp_path: Path) -> None:
    model = ReplayModel([answer_step("ok")], strict=False)
    _, token = await chat.new_session()
    session = SessionKey(await chat.session_key(token))
    image = await upload(chat, token, PNG, "cat.png", "image/png")
    resp = await chat.post(token, {"attachments": [image]})
    assert resp.status == 202, await resp.text()
    await drainer(chat, model, tmp_path, vision=False).drain(session)
    (request,) = model.requests
    assert all(not m.images for m in request.messages)
    assert "inbox/" in request.messages[-1].content and "cat.png" in request.messages[-1].content


async def test_the_adapter_reads_only_its_sessions_uploads_and_never_past_the_cap(chat: Chat) -> None:
    _, owner = await chat.new_session()
    _, other = await chat.new_session()
    ref = await upload(chat, owner, PDF, "a.pdf", "application/pdf")
    web = WebChannel(None, read_upload=UploadStore(chat.redis).read)
    attachment = Attachment(kind="document", ref=ref, name="a.pdf")
    from switchboard.channels.web.adapter import split_session_key

    mine = split_session_key(SessionKey(await chat.session_key(owner)))
    theirs = split_session_key(SessionKey(await chat.session_key(other)))
    assert (await web.fetch(attachment, mine, len(PDF))).data == PDF
    try:
        await web.fetch(attachment, mine, len(PDF) - 1)
    except AttachmentError as err:
        assert err.too_large
    else:
        raise AssertionError("an upload over the cap was read")
    for conversation, reader in ((theirs, web), (mine, WebChannel(None))):
        try:
            await reader.fetch(attachment, conversation, 2**20)
        except AttachmentError as err:
            assert not err.too_large
        else:
            raise AssertionError("read without its session or a reader")
