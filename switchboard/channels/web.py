"""The built-in web chat channel: turns posted chat messages into ``InboundMessage``s and send actions into events.

The web chat has no platform API to call. A send action becomes one entry on the session's web stream (the
Redis stream the page reads over SSE); the publisher that writes it is injected, so this module knows nothing of
Redis or the queue (docs/ARCHITECTURE.md §4). Each entry has a ``type`` and a JSON ``data`` object, as the web chat
API names them (README, "Web chat"):

=============== ===========================================================================
``status``      ``{"status": "queued" | "running" | "idle", "reply_to"?}``
``delta``       ``{"text": "…", "reply_to": "<message id>"}``
``message``     ``{"text": "…", "reply_to": "<message id>"}`` (Markdown)
``reply_error`` ``{"reply_to": "…", "code": "…", "message": "…"}`` (never ``error``: ``EventSource`` fires that itself)
=============== ===========================================================================

The web tier authenticates the bearer token itself (it needs Redis for that) and then hands the adapter a
:class:`~switchboard.channels.base.RawRequest` whose ``query["session"]`` holds the session key the token maps to.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, assert_never
from urllib.parse import unquote

from switchboard.channels._markdown import action_markdown
from switchboard.channels.base import HandshakeReply, RawRequest, Receipt
from switchboard.core.actions import (
    Action,
    OfferChoice,
    SendError,
    SendFile,
    SendText,
    SendTyping,
    SetStatus,
    StreamDelta,
)
from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.errors import BodyTooLargeError, DeliveryError, MalformedBodyError
from switchboard.types import ChannelName, SessionKey

__all__ = [
    "MAX_CLIENT_ID_CHARS",
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

Publish = Callable[[SessionKey, str, dict[str, Any]], Awaitable[str]]
"""Append one event (session, type, data) to the session's web stream; returns the stream entry id."""


@dataclass(frozen=True, slots=True)
class ChatPost:
    """The validated body of ``POST /api/chat/messages``."""

    text: str
    client_id: str | None = None


def _encodable(value: str) -> bool:
    """Whether UTF-8 can encode it: JSON may escape lone surrogates that no encoder accepts further down."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_post(body: bytes) -> ChatPost:
    """Validate a chat message body: JSON ``{"text": str, "client_id"?: str}``.

    Raises:
        MalformedBodyError: not JSON, not an object, ``text`` missing, empty or not a string, bad ``client_id``.
        BodyTooLargeError: ``text`` is over :data:`MAX_TEXT_BYTES`.
    """
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: a nesting bomb (thousands of ``[``), still only a 400
        raise MalformedBodyError("body is not valid JSON", channel="web") from None
    if not isinstance(raw, dict):
        raise MalformedBodyError('body must be a JSON object like {"text": "hello"}', channel="web")
    text = raw.get("text")
    if not isinstance(text, str):
        raise MalformedBodyError('"text" is required and must be a string', channel="web")
    if not text or text.isspace():
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
    return ChatPost(text=text, client_id=client_id)


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


class WebChannel:
    """The built-in web chat (one account, ``default``); it streams replies token by token."""

    name: ClassVar[ChannelName] = "web"
    streams: ClassVar[bool] = True

    def __init__(
        self, publish: Publish | None, *, agent: str = "assistant", tenant: str = "default", account: str = "default"
    ) -> None:
        """Create the adapter.

        Args:
            publish: appends an event to a session's web stream (``WebStreamPublisher.publish`` in production);
                ``None`` in a process that only ingests (``perform`` then refuses).
            agent: the agent a new web chat session talks to unless it names another.
            tenant: the tenant of new web chat sessions.
            account: the account name; the web chat has only ``default``.
        """
        self._publish = publish
        self.agent = agent
        self.tenant = tenant
        self.account = account

    def conversation(self, conversation_id: str, *, agent: str | None = None) -> ConversationRef:
        """The conversation of a (new) web chat session with this id."""
        return ConversationRef(
            tenant=self.tenant,
            agent=agent or self.agent,
            channel="web",
            account=self.account,
            conversation=conversation_id,
        )

    def handshake(self, request: RawRequest) -> HandshakeReply | None:
        """The web chat has no handshakes."""
        return None

    def verify(self, request: RawRequest) -> None:
        """Nothing to verify here: the web tier has already matched the bearer token to ``query["session"]``."""

    def parse(self, request: RawRequest) -> list[InboundMessage]:
        """Turn an authenticated chat post into one message draft.

        ``request.query["session"]`` is the session key the web tier resolved from the bearer token.

        Raises:
            MalformedBodyError: bad body, or no resolved session on the request.
            BodyTooLargeError: text over 32 KiB.
        """
        session = request.query.get("session")
        if not session:
            raise MalformedBodyError("no web chat session resolved for this request", channel="web")
        try:
            conversation = split_session_key(SessionKey(session))
        except ValueError as err:
            raise MalformedBodyError(str(err), channel="web") from None
        return [self.inbound(conversation, parse_post(request.body))]

    def inbound(self, conversation: ConversationRef, post: ChatPost) -> InboundMessage:
        """Build the message draft for a posted chat message.

        The dedup key is the page's ``client_id`` (scoped to the session by the queue's key layout), or a fresh
        uuid when the page sent none, so that every post without one is a new message.
        """
        return InboundMessage(
            dedup_key=post.client_id or uuid.uuid4().hex,
            conversation=conversation,
            sender=Sender(id=conversation.conversation),
            text=post.text,
            platform_message_id=post.client_id,
            meta={"client_id": post.client_id} if post.client_id else {},
        )

    async def perform(self, action: Action, conversation: ConversationRef, *, idempotency_key: str) -> Receipt:
        """Publish one send action as a web stream event (``SendTyping`` publishes nothing)."""
        event = self.event_for(action)
        if event is None:
            return Receipt(parts=0)
        if self._publish is None:
            raise DeliveryError("this process has no web stream publisher", channel="web", retryable=False)
        entry_id = await self._publish(conversation.session_key, event[0], event[1])
        return Receipt(platform_ids=(entry_id,))

    @staticmethod
    def event_for(action: Action) -> tuple[str, dict[str, Any]] | None:
        """The ``(type, data)`` web stream event for an action, or ``None`` when the page shows nothing for it.

        Raises:
            DeliveryError: a file (the web chat cannot receive files yet; the agent is told, not the user misled).
        """
        reply_to = action.reply_to
        match action:
            case StreamDelta():
                return "delta", {"text": action.text, "reply_to": reply_to}
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
            case OfferChoice():
                return "message", {"text": action_markdown(action), "reply_to": reply_to}
            case SendFile():
                raise DeliveryError(
                    "the web chat cannot receive files yet: tell the user what the file holds instead",
                    channel="web",
                    retryable=False,
                )
            case _:
                assert_never(action)

    async def aclose(self) -> None:
        """Nothing to release: the publisher's Redis client belongs to the caller."""
