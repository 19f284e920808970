"""Files users send reach the model as workspace files, notes and (for vision models) image input."""

from __future__ import annotations

import time
from pathlib import Path

from switchboard.channels.base import FileData
from switchboard.core.agent.attachments import AttachmentLimits, AttachmentSupport, safe_name, vision_capable
from switchboard.core.agent.replay import ReplayModel
from switchboard.core.messages import Attachment, ConversationRef, InboundMessage, Posted
from switchboard.core.tools.gateway import workspace_for
from switchboard.core.turn import TurnRequest
from switchboard.errors import AttachmentError
from tests.core.turns import MemorySink, MemoryStore, agent, answer_step, message, runtime

PDF = b"%PDF-1.4 quarterly figures"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


class Platform:
    """Our own AttachmentSource seam: serves files by ref, refuses what is over the limit, records fetches."""

    def __init__(self, files: dict[str, FileData]) -> None:
        self.files = files
        self.fetched: list[str] = []

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FileData:
        self.fetched.append(attachment.ref)
        found = self.files.get(attachment.ref)
        if found is None:
            raise AttachmentError("the file is gone", channel=conversation.channel)
        if len(found.data) > limit:
            raise AttachmentError("too large", channel=conversation.channel, too_large=True)
        return found


def posted(text: str, *attachments: Attachment) -> TurnRequest:
    msg = message(text, event=Posted(attachments=attachments))
    return TurnRequest(
        session_key=msg.session_key, agent=agent(), messages=[msg], run_id="run-1", deadline=time.time() + 60
    )


def workspace(tmp_path: Path, msg: InboundMessage) -> Path:
    return workspace_for(tmp_path / "ws", msg.session_key)


async def test_a_document_lands_in_the_workspace_and_its_path_is_in_the_prompt(tmp_path: Path) -> None:
    source = Platform({"f1": FileData("Q3 report.pdf", PDF, "application/pdf")})
    model = ReplayModel([answer_step("read it")], strict=False)
    rt = runtime(tmp_path, model=model, attachments=AttachmentSupport(source=source))
    doc = Attachment(kind="document", ref="f1", name="../Q3 report.pdf", mime_type="application/pdf", size=len(PDF))
    req = posted("summarise this", doc)
    result = await rt.run_turn(req, MemorySink(), MemoryStore())
    stored = workspace(tmp_path, req.messages[0]) / "inbox" / "m1-0-Q3_report.pdf"
    assert stored.read_bytes() == PDF
    user = model.requests[0].messages[-1].content
    assert user.startswith("summarise this\n") and "inbox/m1-0-Q3_report.pdf" in user
    assert [e.text for e in result.history if e.meta.get("source") == "attachments"] == [user.split("\n", 1)[1]]


async def test_an_oversize_attachment_becomes_a_note_without_a_file_or_a_fetch(tmp_path: Path) -> None:
    source = Platform({"big": FileData("video.mp4", b"x" * 4096, "video/mp4")})
    model = ReplayModel([answer_step("ok")], strict=False)
    limits = AttachmentLimits(max_bytes=2048)
    rt = runtime(tmp_path, model=model, attachments=AttachmentSupport(source=source, limits=limits))
    declared = Attachment(kind="video", ref="big", name="video.mp4", size=4096)
    undeclared = Attachment(kind="document", ref="big", name="clip.mp4")  # the platform did not say its size
    req = posted("", declared, undeclared)
    result = await rt.run_turn(req, MemorySink(), MemoryStore())
    user = model.requests[0].messages[-1].content
    assert user.count("which could not be read: too large (limit 2 KiB)") == 2
    assert source.fetched == ["big"]  # the declared size was refused before any download
    assert not (workspace(tmp_path, req.messages[0]) / "inbox").exists()
    assert result.text == "ok"


async def test_the_default_cap_reads_20_mib_and_a_refused_fetch_is_a_note(tmp_path: Path) -> None:
    model = ReplayModel([answer_step("ok")], strict=False)
    rt = runtime(tmp_path, model=model, attachments=AttachmentSupport(source=Platform({})))
    huge = Attachment(kind="document", ref="x", name="dump.sql", size=21 * 2**20)
    gone = Attachment(kind="image", ref="missing", mime_type="image/png")
    await rt.run_turn(posted("look", huge, gone), MemorySink(), MemoryStore())
    user = model.requests[0].messages[-1].content
    assert "the user sent a document (dump.sql), which could not be read: too large (limit 20 MiB)" in user
    assert "the user sent a image, which could not be read: the file is gone" in user


async def test_more_attachments_than_the_turn_cap_are_noted_not_fetched(tmp_path: Path) -> None:
    files = {f"f{i}": FileData(f"n{i}.txt", b"hi", "text/plain") for i in range(4)}
    source = Platform(files)
    model = ReplayModel([answer_step("ok")], strict=False)
    rt = runtime(
        tmp_path, model=model, attachments=AttachmentSupport(source=source, limits=AttachmentLimits(max_count=2))
    )
    docs = [Attachment(kind="document", ref=f"f{i}", name=f"n{i}.txt") for i in range(4)]
    await rt.run_turn(posted("files", *docs), MemorySink(), MemoryStore())
    assert source.fetched == ["f0", "f1"]
    assert "2 more attachment(s) than the 2 a turn may carry" in model.requests[0].messages[-1].content


async def test_images_go_by_path_to_a_model_without_vision(tmp_path: Path) -> None:
    source = Platform({"p": FileData("cat.png", PNG, "image/png")})
    model = ReplayModel([answer_step("ok")], strict=False)
    rt = runtime(tmp_path, model=model, attachments=AttachmentSupport(source=source))
    await rt.run_turn(
        posted("what is this?", Attachment(kind="image", ref="p", name="cat.png")), MemorySink(), MemoryStore()
    )
    sent = model.requests[0].messages
    assert all(not m.images for m in sent)
    assert "saved as inbox/m1-0-cat.png" in sent[-1].content and "you cannot see images" in sent[-1].content


async def test_a_voice_note_without_a_transcriber_is_stored_and_said_so(tmp_path: Path) -> None:
    source = Platform({"v": FileData("", b"OggS voice", "audio/ogg")})
    model = ReplayModel([answer_step("ok")], strict=False)
    rt = runtime(tmp_path, model=model, attachments=AttachmentSupport(source=source))
    await rt.run_turn(posted("", Attachment(kind="voice", ref="v", mime_type="audio/ogg")), MemorySink(), MemoryStore())
    user = model.requests[0].messages[-1].content
    assert "inbox/m1-0-voice.oga" in user and "no transcription provider is configured" in user


def test_names_are_sanitised_and_vision_is_known_per_model() -> None:
    assert safe_name(Attachment(kind="document", ref="r", name="..\\..\\etc/pa ss:wd")) == "pa_ss_wd"
    assert safe_name(Attachment(kind="image", ref="r", mime_type="image/jpeg")) == "image.jpg"
    assert vision_capable("openai:gpt-4.1-mini") and vision_capable("anthropic:claude-sonnet-4-5")
    assert not vision_capable("openai:gpt-3.5-turbo") and not vision_capable("offline")
    assert vision_capable("offline", True) and not vision_capable("openai:gpt-4o", False)


async def test_an_image_shown_to_a_vision_model_gates_a_risky_send_like_a_document(tmp_path: Path) -> None:
    from tests.core.test_taint import PERFORMED, REFUSED, SEND, ActingSink, send_outcome
    from tests.core.test_taint import agent as acting_agent

    async def send_after(*attachments: Attachment) -> ActingSink:
        source = Platform({"p": FileData("cat.png", PNG, "image/png"), "d": FileData("a.txt", b"hi", "text/plain")})
        rt = runtime(tmp_path, model=ReplayModel(SEND, strict=False), attachments=AttachmentSupport(source=source))
        req = posted("send me my secrets", *attachments).model_copy(
            update={"agent": acting_agent().model_copy(update={"vision": True})}
        )
        (workspace(tmp_path, req.messages[0])).mkdir(parents=True, exist_ok=True)
        (workspace(tmp_path, req.messages[0]) / "secrets.txt").write_text("the launch codes")
        sink = ActingSink()
        await rt.run_turn(req, sink, MemoryStore())
        return sink

    shown = await send_after(Attachment(kind="image", ref="p", mime_type="image/png"))
    assert send_outcome(shown) == REFUSED  # the image may carry instructions: the send waits for an approval
    by_path = await send_after(Attachment(kind="document", ref="d", name="a.txt"))
    assert send_outcome(by_path) == PERFORMED  # a document given by path is not in view until it is read


async def test_an_attachment_over_the_workspace_quota_is_a_note_not_a_failed_turn(tmp_path: Path) -> None:
    from switchboard.core.tools.builtin import default_registry
    from switchboard.core.tools.gateway import ToolGateway
    from switchboard.core.workspaces.disk import Quotas, Workspaces

    root = tmp_path / "ws"
    tools = default_registry()
    gateway = ToolGateway(tools, workspace_root=root, workspaces=Workspaces(root, Quotas(session_bytes=10_000)))
    source = Platform({"f": FileData("big.bin", b"x" * 20_000, "application/octet-stream")})
    model = ReplayModel([answer_step("ok")], strict=False)
    rt = runtime(tmp_path, model=model, registry=tools, gateway=gateway, attachments=AttachmentSupport(source=source))
    req = posted("keep this", Attachment(kind="document", ref="f", name="big.bin"))
    result = await rt.run_turn(req, MemorySink(), MemoryStore())
    user = model.requests[0].messages[-1].content
    assert "the user sent a document (big.bin), which could not be stored:" in user and "quota" in user
    assert not (workspace(tmp_path, req.messages[0]) / "inbox" / "m1-0-big.bin").exists()
    assert result.text == "ok"
