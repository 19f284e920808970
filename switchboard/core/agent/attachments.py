"""Files the user sent, in a form the model can use: workspace files, image input, transcripts.

Before a turn's first model call each attachment is fetched through an :class:`AttachmentSource` (core never imports
channels), capped, and stored under ``inbox/`` in the workspace; a document gets its path, an image becomes image
input for a vision-capable model, audio a transcript when a :class:`Transcriber` is configured. What cannot be read
reaches the model as a short note, never a failed turn; images are untrusted content.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import mimetypes
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from switchboard.core.inbound import event_text
from switchboard.core.messages import (
    Attachment,
    ChoiceSelected,
    CommandIssued,
    ConversationRef,
    ExternalEvent,
    InboundMessage,
    MessageDeleted,
    MessageEdited,
    OperatorActed,
    Posted,
    Scheduled,
)
from switchboard.core.model import ChatMessage, ImagePart, data_block
from switchboard.core.turn import HistoryEntry
from switchboard.core.workspaces.disk import Workspaces
from switchboard.errors import AttachmentError, ToolError

__all__ = [
    "IMAGE_INLINE_BYTES",
    "INBOX",
    "VISION_MIME_TYPES",
    "AttachmentLimits",
    "AttachmentSource",
    "AttachmentSupport",
    "FetchedFile",
    "Prepared",
    "Transcriber",
    "TurnInput",
    "attachments_of",
    "prepare_attachments",
    "safe_name",
    "turn_input",
    "vision_capable",
]

logger = logging.getLogger(__name__)

INBOX = "inbox"
"""Workspace directory the files users send are stored in."""
VISION_MIME_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
"""Image formats both OpenAI and Anthropic accept as input."""
IMAGE_INLINE_BYTES = 5 * 2**20
"""Largest image sent to a model as image input (Anthropic's per-image limit); larger ones go by path."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_VISION_OPENAI = re.compile(r"^(gpt-4o|chatgpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|o1(?!-mini)|o3|o4)", re.IGNORECASE)
_VISION_ANTHROPIC = re.compile(r"^claude-(3|[a-z]+-[34]|[a-z]+-\d)", re.IGNORECASE)
_KIND_WORDS = {"image": "image", "document": "document", "audio": "audio file", "voice": "voice note", "video": "video"}


class FetchedFile(Protocol):
    """A downloaded attachment (what ``Channel.fetch`` returns)."""

    @property
    def name(self) -> str:
        """The file name the platform gave it (may be empty)."""

    @property
    def data(self) -> bytes:
        """The bytes."""

    @property
    def mime_type(self) -> str | None:
        """The media type, when known."""


class AttachmentSource(Protocol):
    """Fetches what users send, by reference, from the conversation's channel (implemented by the worker)."""

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FetchedFile:
        """Download ``attachment``, refusing more than ``limit`` bytes.

        Raises:
            AttachmentError: too large, gone, the platform refused, or no channel for the conversation here.
        """


class Transcriber(Protocol):
    """Speech to text (OpenAI's audio transcription API; see :mod:`switchboard.core.transcription`)."""

    async def transcribe(self, name: str, data: bytes, mime_type: str | None) -> str:
        """The text spoken in the audio.

        Raises:
            AttachmentError: the provider failed or refused.
        """


@dataclass(frozen=True)
class AttachmentLimits:
    """Caps on what one turn fetches."""

    max_bytes: int = 20 * 2**20
    """Largest attachment fetched (bigger ones become a note)."""
    max_count: int = 10
    """Most attachments fetched per turn (the rest become a note)."""


@dataclass(frozen=True)
class AttachmentSupport:
    """How a runtime gets at attachments: where it fetches them, its caps, and the transcriber if any."""

    source: AttachmentSource | None = None
    limits: AttachmentLimits = AttachmentLimits()
    transcriber: Transcriber | None = None


@dataclass
class Prepared:
    """What a turn's attachments became."""

    notes: dict[int, list[str]] = field(default_factory=dict)
    """Per message index: lines the model reads after that message's text."""
    transcripts: dict[int, list[str]] = field(default_factory=dict)
    """Per message index: transcripts of its voice notes (the message text when it had none)."""
    images: list[ImagePart] = field(default_factory=list)
    image_paths: list[str] = field(default_factory=list)

    def text_for(self, index: int, text: str) -> str:
        """The message text at ``index`` with its transcripts and attachment notes."""
        parts = [text] if text.strip() else []
        parts += [f"[voice note, transcribed] {t}" for t in self.transcripts.get(index, [])]
        parts += self.notes.get(index, [])
        return "\n".join(parts)


def attachments_of(message: InboundMessage) -> tuple[Attachment, ...]:
    """The attachments an inbound event carries (only messages and commands carry any)."""
    event = message.event
    match event:
        case Posted() | CommandIssued():
            return event.attachments
        case ChoiceSelected() | MessageEdited() | MessageDeleted() | OperatorActed() | ExternalEvent() | Scheduled():
            return ()


def safe_name(attachment: Attachment, fetched_name: str = "") -> str:
    """A file name safe on every file system: letters, digits, ``._-``; an extension from the type if none."""
    raw = (attachment.name or fetched_name or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = _UNSAFE.sub("_", raw).strip("._")[:80]
    if not name:
        name = attachment.kind
    if "." not in name and attachment.mime_type:
        name += mimetypes.guess_extension(attachment.mime_type.split(";", 1)[0].strip()) or ""
    return name


def vision_capable(spec: str, flag: bool | None = None) -> bool:
    """Whether the model behind ``spec`` (``provider:name``) takes image input; ``flag`` (the agent's) decides."""
    if flag is not None:
        return flag
    provider, _, name = spec.partition(":")
    if provider == "openai":
        return bool(_VISION_OPENAI.match(name))
    if provider == "anthropic":
        return bool(_VISION_ANTHROPIC.match(name))
    return False


def _mb(size: int) -> str:
    """``20 MiB``, ``2.5 MiB``, ``64 KiB``: a cap in words."""
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size // scale} {unit}" if size % scale == 0 else f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def _described(attachment: Attachment) -> str:
    what = _KIND_WORDS.get(attachment.kind, attachment.kind)
    return f"a {what} ({safe_name(attachment)})" if attachment.name else f"a {what}"


def _mime(attachment: Attachment, fetched: FetchedFile, name: str) -> str:
    found = attachment.mime_type or fetched.mime_type or mimetypes.guess_type(name)[0] or ""
    return found.split(";", 1)[0].strip().lower()


async def prepare_attachments(
    messages: Sequence[InboundMessage],
    *,
    source: AttachmentSource | None,
    workspaces: Workspaces,
    workspace: Path,
    limits: AttachmentLimits,
    vision: bool,
    transcriber: Transcriber | None,
) -> Prepared:
    """Fetch, store and convert the attachments of ``messages``; see the module docstring.

    Never raises for a single attachment (its failure becomes a note); ``CancelledError`` passes through.
    """
    prepared = Prepared()
    taken = 0
    for index, message in enumerate(messages):
        found = attachments_of(message)
        for number, attachment in enumerate(found):
            if taken >= limits.max_count:
                left = len(found) - number
                prepared.notes.setdefault(index, []).append(
                    f"[the user sent {left} more attachment(s) than the {limits.max_count} a turn may carry; "
                    "they were not read]"
                )
                break
            taken += 1
            note = await _one(prepared, index, message, number, attachment, source, workspaces, workspace, limits,
                              vision, transcriber)  # fmt: skip
            if note:
                prepared.notes.setdefault(index, []).append(note)
    return prepared


async def _one(
    prepared: Prepared,
    index: int,
    message: InboundMessage,
    number: int,
    attachment: Attachment,
    source: AttachmentSource | None,
    workspaces: Workspaces,
    workspace: Path,
    limits: AttachmentLimits,
    vision: bool,
    transcriber: Transcriber | None,
) -> str:
    """Handle one attachment; returns the note the model reads about it (may be empty)."""
    described = _described(attachment)
    if attachment.size is not None and attachment.size > limits.max_bytes:
        return f"[the user sent {described}, which could not be read: too large (limit {_mb(limits.max_bytes)})]"
    if source is None:
        return f"[the user sent {described}, which could not be read: files are not fetched here]"
    try:
        fetched = await source.fetch(attachment, message.conversation, limits.max_bytes)
    except AttachmentError as err:
        reason = f"too large (limit {_mb(limits.max_bytes)})" if err.too_large else str(err) or "the platform refused"
        logger.info("attachment of %s not fetched: %s", message.id, "too large" if err.too_large else "refused")
        return f"[the user sent {described}, which could not be read: {reason}]"
    data = fetched.data
    if len(data) > limits.max_bytes:
        return f"[the user sent {described}, which could not be read: too large (limit {_mb(limits.max_bytes)})]"
    name = safe_name(attachment, fetched.name)
    stem = _UNSAFE.sub("_", message.id or "m")[-24:].strip("._") or "m"
    relative = f"{INBOX}/{stem}-{number}-{name}"
    try:
        await asyncio.to_thread(workspaces.store, workspace, workspace / relative, data, shown=relative)
    except ToolError as err:
        return f"[the user sent {described}, which could not be stored: {err}]"
    mime = _mime(attachment, fetched, name)
    size = f"{len(data):,} bytes"
    if attachment.kind in ("voice", "audio"):
        if transcriber is None:
            return f"[the user sent {described}, saved as {relative} ({size}); it was not transcribed: no "\
                "transcription provider is configured]"  # fmt: skip
        cached = workspace / f".transcripts/{stem}-{number}.txt"
        text = await asyncio.to_thread(_read_transcript, cached)
        if text is None:
            try:
                text = await transcriber.transcribe(name, data, mime or None)
            except AttachmentError as err:
                return f"[the user sent {described}, saved as {relative}; it could not be transcribed: {err}]"
            try:  # a retried turn reads it back instead of paying for the transcription again
                await asyncio.to_thread(workspaces.store, workspace, cached, text.encode(), shown=relative)
            except ToolError:
                logger.info("transcript of %s not cached: the workspace refused it", message.id)
        prepared.transcripts.setdefault(index, []).append(text.strip() or "(no speech recognised)")
        return ""
    if attachment.kind == "image":
        if vision and mime in VISION_MIME_TYPES and len(data) <= IMAGE_INLINE_BYTES:
            prepared.images.append(ImagePart(mime_type=mime, data=base64.b64encode(data).decode("ascii")))
            prepared.image_paths.append(relative)
            return f"[the user sent an image, shown to you above; saved as {relative}]"
        why = "you cannot see images" if not vision else "its format or size cannot be shown to you"
        return f"[the user sent an image, saved as {relative} ({size}); {why}]"
    return f"[the user sent {described}, saved in your workspace as {relative} ({mime or 'unknown type'}, {size})]"


def _read_transcript(path: Path) -> str | None:
    """The transcript an earlier attempt of this turn cached (``None``: none, or not a plain file)."""
    try:
        if path.is_symlink() or not path.is_file():
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


@dataclass(frozen=True)
class TurnInput:
    """What the model reads of a turn's messages once their attachments are in."""

    text: str | None
    """The user's message: each message's event text with its transcripts and attachment notes (``None``: no
    attachments, the plain event texts)."""
    attached: ChatMessage | None
    """The images, as a ``data`` message to show just before the user's (``None``: no image input)."""
    record: list[HistoryEntry]
    """What the history keeps of the attachments (transcripts and notes, never image bytes)."""


async def turn_input(
    messages: Sequence[InboundMessage],
    support: AttachmentSupport,
    workspaces: Workspaces,
    workspace: Path,
    vision: bool,
) -> TurnInput:
    """Prepare the attachments of ``messages`` (:func:`prepare_attachments`) and compose what the model reads.

    Without attachments nothing is done: the text is ``None`` (each message's event text) and nothing is recorded.
    """
    if not any(attachments_of(m) for m in messages):
        return TurnInput(text=None, attached=None, record=[])
    prepared = await prepare_attachments(
        messages,
        source=support.source,
        workspaces=workspaces,
        workspace=workspace,
        limits=support.limits,
        vision=vision,
        transcriber=support.transcriber,
    )
    texts = [prepared.text_for(i, event_text(m) or "") for i, m in enumerate(messages)]
    attached = None
    if prepared.images:
        listing = "Images the user sent with the next message: " + ", ".join(prepared.image_paths)
        attached = ChatMessage(
            role="user", content=data_block(listing, source="attachments"), trust="data", images=prepared.images
        )
    added = [line for i in range(len(messages)) for line in prepared.text_for(i, "").splitlines() if line.strip()]
    record = [HistoryEntry(role="user", text="\n".join(added), meta={"source": "attachments"})] if added else []
    return TurnInput(text="\n\n".join(t for t in texts if t), attached=attached, record=record)
