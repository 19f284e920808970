"""The built-in web chat channel: turns posted chat messages into ``InboundMessage``s and send actions into events.

The web chat has no platform API: a send action becomes one entry on the session's web stream, through an injected
publisher, so this module knows nothing of Redis or the queue (``docs/ARCHITECTURE.md`` §4). The web tier
authenticates the bearer token (it needs Redis for that) and hands the adapter the session key it maps to. Entries
and posts are the web chat API's (``docs/channels/web-chat.md``).
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, assert_never
from urllib.parse import unquote

from switchboard.channels.base import (
    OK_JSON,
    Capabilities,
    FileData,
    Inbound,
    Listener,
    RawRequest,
    Receipt,
    SendContext,
)
from switchboard.channels.registry import ReadUpload
from switchboard.core.actions import (
    AckChoice,
    Action,
    EditText,
    OfferChoice,
    SendError,
    SendFile,
    SendText,
    SendTyping,
    SendVoice,
    SetStatus,
    SettleChoices,
    ShowToolCall,
    StreamDelta,
    StreamText,
)
from switchboard.core.messages import (
    Attachment,
    ChoiceSelected,
    ConversationRef,
    InboundMessage,
    Posted,
    Sender,
    trusted,
)
from switchboard.errors import AttachmentError, BodyTooLargeError, DeliveryError, MalformedBodyError
from switchboard.types import SessionKey

__all__ = [
    "CAPABILITIES",
    "MAX_ATTACHMENTS",
    "MAX_CLIENT_ID_CHARS",
    "MAX_FILE_BYTES",
    "MAX_TEXT_BYTES",
    "ChatPost",
    "Publish",
    "WebChannel",
    "parse_post",
    "split_session_key",
]

logger = logging.getLogger(__name__)

MAX_TEXT_BYTES = 32 * 1024
"""Longest chat message text, in UTF-8 bytes (docs/ARCHITECTURE.md §10: over 32 KiB is 413)."""
MAX_CLIENT_ID_CHARS = 200
"""Longest ``client_id`` a page may send."""
MAX_ATTACHMENTS: Final = 10
"""Most upload ids one chat post may name (the web tier applies ``SWITCHBOARD_ATTACHMENTS__MAX_COUNT`` too)."""
APPROVAL_HEADING: Final = "Approval needed before this runs."
"""An approval's text on the web chat: its card carries the details the other channels' text spells out."""
MAX_UPLOAD_ID_CHARS: Final = 64
MAX_CHOICE_ID_CHARS: Final = 64
"""Longest option id (``Choice.id``)."""
MAX_FILE_BYTES: Final = 256 * 1024
"""Largest file the web chat shows (inline in its stream entry, as base64); a larger one is refused to the agent."""
CAPABILITIES: Final = Capabilities(
    max_text=MAX_TEXT_BYTES * 4,
    streaming="transport",
    buttons=10,
    button_label=80,
    files=True,
    voice=True,
    statuses=True,
    tool_activity=True,
)
"""The web chat streams on its own transport (SSE ``delta`` events), shows buttons, whether the agent is running and
each tool call as a card; it has no edits."""

Publish = Callable[[SessionKey, str, dict[str, Any]], Awaitable[str]]
"""Append one event (session, type, data) to the session's web stream; returns the stream entry id."""


@dataclass(frozen=True, slots=True)
class ChatPost:
    """The validated body of ``POST /api/chat/messages``."""

    text: str
    client_id: str | None = None
    choice: str | None = None
    """The option id of a clicked button (``text`` is then its label, or the id when the page sent none)."""
    attachments: tuple[str, ...] = ()
    """Upload ids of files the page uploaded for this message, in order (no duplicates)."""


def _encodable(value: str) -> bool:
    """Whether UTF-8 can encode it: JSON may escape lone surrogates that no encoder accepts further down."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _upload_ids(raw: object, max_count: int) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(
        isinstance(item, str) and 0 < len(item) <= MAX_UPLOAD_ID_CHARS and item.isascii() and item.isalnum()
        for item in raw
    ):
        raise MalformedBodyError('"attachments" must be a list of upload ids', channel="web")
    if len(raw) > max_count:
        raise MalformedBodyError(f"at most {max_count} attachments per message", channel="web")
    if len(set(raw)) != len(raw):
        raise MalformedBodyError('"attachments" names an upload twice', channel="web")
    return tuple(raw)


def parse_post(body: bytes, *, max_attachments: int = MAX_ATTACHMENTS) -> ChatPost:
    """Validate a chat message body: JSON ``{"text", "client_id"?, "attachments"?}`` or ``{"choice", ...}``.

    Raises:
        MalformedBodyError: not JSON, not an object, ``text`` missing or empty (without a ``choice`` or
            attachments) or not a string, bad ``client_id``, ``choice`` or ``attachments`` (more than
            ``max_attachments``, a repeated id, or with a ``choice``).
        BodyTooLargeError: ``text`` is over :data:`MAX_TEXT_BYTES`.
    """
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: a nesting bomb (thousands of ``[``), still only a 400
        raise MalformedBodyError("body is not valid JSON", channel="web") from None
    if not isinstance(raw, dict):
        raise MalformedBodyError('body must be a JSON object like {"text": "hello"}', channel="web")
    choice = raw.get("choice")
    if choice is not None:
        if not isinstance(choice, str) or not choice or len(choice) > MAX_CHOICE_ID_CHARS:
            raise MalformedBodyError(
                f'"choice" must be an option id of 1-{MAX_CHOICE_ID_CHARS} characters', channel="web"
            )
        if not choice.isprintable() or not _encodable(choice):
            raise MalformedBodyError('"choice" must be printable', channel="web")
    attachments = _upload_ids(raw.get("attachments"), min(max_attachments, MAX_ATTACHMENTS))
    if attachments and choice is not None:
        raise MalformedBodyError('a "choice" carries no attachments', channel="web")
    text = raw.get("text", choice if choice is not None else ("" if attachments else None))
    if not isinstance(text, str):
        raise MalformedBodyError('"text" is required and must be a string', channel="web")
    if (not text or text.isspace()) and attachments:
        text = ""
    elif not text or text.isspace():
        raise MalformedBodyError('"text" must not be empty', channel="web")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise MalformedBodyError('"text" contains invalid Unicode (a lone surrogate escape)', channel="web") from None
    if size > MAX_TEXT_BYTES:
        raise BodyTooLargeError(f'"text" is over {MAX_TEXT_BYTES // 1024} KiB', channel="web")
    client_id = raw.get("client_id")
    if client_id is not None:
        if not isinstance(client_id, str) or not client_id or not _encodable(client_id):
            raise MalformedBodyError('"client_id" must be a non-empty string when given', channel="web")
        if len(client_id) > MAX_CLIENT_ID_CHARS or not client_id.isprintable():
            raise MalformedBodyError(
                f'"client_id" must be at most {MAX_CLIENT_ID_CHARS} printable characters', channel="web"
            )
    return ChatPost(text=text, client_id=client_id, choice=choice, attachments=attachments)


@functools.lru_cache(maxsize=4096)
def split_session_key(session: SessionKey) -> ConversationRef:
    """The conversation a web chat session key names (the inverse of ``ConversationRef.session_key``).

    Cached (the result is immutable): a busy session is parsed once, not once per message.

    Raises:
        ValueError: the key is not a web chat session key.
    """
    parts = [unquote(p) for p in session.split("/")]
    if len(parts) != 5 or parts[2] != "web":
        raise ValueError(f"not a web chat session key: {session!r}")
    tenant, agent, _, account, conversation = parts
    return ConversationRef(tenant=tenant, agent=agent, channel="web", account=account, conversation=conversation)


_POSTED: Final = Posted()


@functools.lru_cache(maxsize=4096)
def _sender(conversation: str) -> Sender:
    """The (frozen) sender of a session's messages: the session itself (a web chat has one user per session)."""
    return trusted(Sender, id=conversation, name=None, is_bot=False)


class WebChannel:
    """The built-in web chat (one account, ``default``); it streams replies token by token on its own SSE."""

    def __init__(
        self, publish: Publish | None, *, account: str = "default", read_upload: ReadUpload | None = None
    ) -> None:
        """Create the adapter.

        Args:
            publish: appends an event to a session's web stream (``WebStreamPublisher.publish`` in production);
                ``None`` in a process that only ingests (``perform`` then refuses).
            account: the account name; the web chat has only ``default``.
            read_upload: reads an upload back (``UploadStore.read`` in a worker); ``None``: :meth:`fetch` refuses.
        """
        self._publish = publish
        self._account = account
        self._read_upload = read_upload

    @property
    def name(self) -> Literal["web"]:
        """``web``."""
        return "web"

    @property
    def account(self) -> str:
        """The account name (``default``)."""
        return self._account

    @property
    def capabilities(self) -> Capabilities:
        """Streams on its own transport, shows buttons and small files; no edits."""
        return CAPABILITIES

    async def verify(self, request: RawRequest) -> None:
        """Nothing to verify here: the web tier has already matched the bearer token to ``query["session"]``."""

    async def receive(self, request: RawRequest) -> Inbound:
        """Turn an authenticated chat post into one message draft (a message, or a choice clicked).

        ``request.query["session"]`` is the session key the web tier resolved from the bearer token; the draft
        keeps that session's agent and tenant.

        Attachments are looked up by the web tier (it holds Redis), which then calls :meth:`inbound` itself: a post
        naming upload ids is refused here.

        Raises:
            MalformedBodyError: bad body, no resolved session on the request, or upload ids.
            BodyTooLargeError: text over 32 KiB.
        """
        session = request.query.get("session")
        if not session:
            raise MalformedBodyError("no web chat session resolved for this request", channel="web")
        try:
            conversation = split_session_key(SessionKey(session))
        except ValueError as err:
            raise MalformedBodyError(str(err), channel="web") from None
        post = parse_post(request.body)
        if post.attachments:
            raise MalformedBodyError("attachments are looked up by the web chat's API", channel="web")
        return Inbound(messages=(self.inbound(conversation, post),), answer=OK_JSON)

    def inbound(
        self, conversation: ConversationRef, post: ChatPost, attachments: tuple[Attachment, ...] = ()
    ) -> InboundMessage:
        """Build the message draft for a chat post (``attachments``: its uploads, looked up in the session).

        The dedup key is the page's ``client_id`` (scoped to the session by the queue's key layout), or a fresh
        uuid when the page sent none, so that every post without one is a new message.
        """
        event: Posted | ChoiceSelected
        if post.choice is not None:
            event = ChoiceSelected(option_id=post.choice)
        else:
            event = Posted(attachments=attachments) if attachments else _POSTED
        # Every value is a str checked by parse_post, or a model: built without validating it again
        # (tests/channels/test_fast_drafts.py checks it against validation).
        return trusted(
            InboundMessage,
            id="",
            dedup_key=post.client_id or uuid.uuid4().hex,
            conversation=conversation,
            sender=_sender(conversation.conversation),
            text=post.text,
            event=event,
            platform_message_id=post.client_id,
            received_at=time.time(),
            meta={"client_id": post.client_id} if post.client_id else {},
        )

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Publish one send action as a web stream event (typing and click acknowledgements publish nothing).

        Raises:
            DeliveryError: no publisher in this process; an edit (the web chat has none); a file that cannot be
                read or is over :data:`MAX_FILE_BYTES` (not retryable: the agent is told, not the user misled).
        """
        event: tuple[str, dict[str, Any]] | None
        match action:
            case SendFile():
                event = "message", await self._file_event(action, send)
            case StreamText():
                event = self._stream_event(action)
            case _:
                event = self.event_for(action)
        if event is None:
            return Receipt(parts=0)
        if self._publish is None:
            raise DeliveryError("this process has no web stream publisher", channel="web", retryable=False)
        entry_id = await self._publish(conversation.session_key, event[0], event[1])
        handle = (action.handle or action.reply_to or entry_id) if isinstance(action, StreamText) else None
        return Receipt(platform_ids=(entry_id,), handle=handle)

    @staticmethod
    def _stream_event(action: StreamText) -> tuple[str, dict[str, Any]]:
        """A native stream shown the web chat's way: the new text as a ``delta``, the whole reply at the end."""
        if action.final:
            return "message", {"text": action.text, "reply_to": action.reply_to}
        return "delta", {"text": action.text[action.sent :], "reply_to": action.reply_to}

    @staticmethod
    async def _file_event(action: SendFile, send: SendContext) -> dict[str, Any]:
        data: FileData = await send.read_file(action.path)
        if len(data.data) > MAX_FILE_BYTES:
            raise DeliveryError(
                f"the web chat shows files up to {MAX_FILE_BYTES // 1024} KiB; {data.name} is larger: tell the user "
                "what it holds instead",
                channel="web",
                retryable=False,
            )
        file = {
            "name": data.name,
            "mime_type": data.mime_type or action.mime_type or "application/octet-stream",
            "data": base64.b64encode(data.data).decode("ascii"),
            "size": len(data.data),
        }
        return {"text": action.caption, "reply_to": action.reply_to, "file": file}  # the page shows the name

    @staticmethod
    def _voice_event(action: SendVoice) -> dict[str, Any]:
        """The spoken reply as an audio file card (the page gives audio a player); refused over the size cap."""
        size = len(action.audio) * 3 // 4 - action.audio[-2:].count("=")
        if size > MAX_FILE_BYTES:
            raise DeliveryError(
                f"the web chat shows files up to {MAX_FILE_BYTES // 1024} KiB; the spoken reply is larger",
                channel="web",
                retryable=False,
            )
        file = {"name": "reply.ogg", "mime_type": action.mime_type, "data": action.audio, "size": size}
        return {"text": "", "reply_to": action.reply_to, "file": file, "voice": True}

    @staticmethod
    def event_for(action: Action) -> tuple[str, dict[str, Any]] | None:
        """The ``(type, data)`` web stream event for an action, or ``None`` when the page shows nothing for it.

        Raises:
            DeliveryError: an edit (the web chat declares no edits); a file (published by :meth:`perform`, which
                reads it first).
        """
        reply_to = action.reply_to
        match action:
            case StreamDelta():
                return "delta", {"text": action.text, "reply_to": reply_to}
            case SendText() if action.notice:
                return "message", {"text": action.text, "reply_to": reply_to, "notice": True}
            case SendText():
                return "message", {"text": action.text, "reply_to": reply_to}
            case SetStatus():
                data: dict[str, Any] = {"status": action.status}
                if reply_to:
                    data["reply_to"] = reply_to
                return "status", data
            case SendError():
                return "reply_error", {"reply_to": reply_to, "code": action.code, "message": action.message}
            case SendTyping():
                return None  # status "running" already shows the typing indicator
            case AckChoice():
                return None  # the click's POST was answered 202: nothing left to acknowledge
            case OfferChoice():  # the buttons are the options: the text is the question alone
                choices = [{"id": option.id, "label": option.label} for option in action.options]
                offer: dict[str, Any] = {"text": action.question, "reply_to": reply_to, "choices": choices}
                if action.approval is not None:  # the card shows what, why and until when: the text heads it
                    offer["approval"] = action.approval.model_dump(mode="json")
                    offer["text"] = APPROVAL_HEADING
                return "message", offer
            case ShowToolCall():
                return "tool", action.model_dump(mode="json", exclude={"kind"})
            case SettleChoices():
                settled = {"ids": list(action.ids), "chosen": action.chosen, "label": action.label, "by": action.by}
                return "choices_settled", settled
            case StreamText():
                return WebChannel._stream_event(action)
            case EditText():
                raise DeliveryError(
                    "the web chat cannot edit a sent message (its capabilities declare no edits)",
                    channel="web",
                    retryable=False,
                )
            case SendFile():
                raise DeliveryError("a file is published by perform, which reads it", channel="web", retryable=False)
            case SendVoice():
                return "message", WebChannel._voice_event(action)
            case _:
                assert_never(action)

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FileData:
        """Read an upload back (``attachment.ref`` is its id) for the conversation whose message carried it.

        Only that session's uploads are reachable: the store keys them by the session.

        Raises:
            AttachmentError: gone (uploads expire), over ``limit`` bytes (refused before reading), or no reader in
                this process.
        """
        if self._read_upload is None:
            raise AttachmentError("this process cannot read web chat uploads", channel="web")
        return await self._read_upload(conversation.session_key, attachment.ref, limit)

    def listener(self) -> Listener | None:
        """The web chat receives by HTTP only."""
        return None

    async def start(self) -> None:
        """Nothing to look up."""

    async def aclose(self) -> None:
        """Nothing to release: the publisher's Redis client belongs to the caller."""
