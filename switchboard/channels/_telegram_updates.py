"""Telegram ``Update`` → inbound events: what reaches the agent, and as what.

The same reader serves the webhook (one ``Update`` per request) and long polling (``getUpdates`` batches).
``update_id`` is the dedup key. What becomes an event:

- ``message`` → :class:`Posted` (text or caption, with photos, documents, voice notes, audio and video by
  ``file_id``), or :class:`CommandIssued` when it starts with a bot command (``/stop``, ``/ask …``);
- ``edited_message`` → :class:`MessageEdited` (same addressing rules as a message);
- ``callback_query`` (a tap on an inline-keyboard button the bot sent) → :class:`ChoiceSelected` carrying the
  button's ``callback_data`` (the option id), the message that carried it and the query id to acknowledge.

Private chats reach the agent on every message; groups only when the bot is mentioned (``@username``, a
``text_mention``, ``/command@username``), replied to, or sent a bare command (Telegram delivers those to every
bot of the group even in privacy mode). A button tap always reaches it: only the bot's own messages carry its
buttons. Forum topics are their own sessions (``thread`` = ``message_thread_id``). Channel posts, the bot's own
messages, stickers and service messages parse to nothing (no error, so Telegram stops retrying them).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from switchboard.core.messages import (
    Attachment,
    ChoiceSelected,
    CommandIssued,
    ConversationRef,
    InboundEvent,
    InboundMessage,
    MessageEdited,
    Posted,
    Sender,
    trusted,
)

__all__ = ["UpdateReader", "WireUpdate", "utf16_len"]

_CHANNEL: Literal["telegram"] = "telegram"
# Telegram's ``ChatType`` / ``MessageEntityType`` values as plain strings (enum member access costs on every update)
_PRIVATE, _CHANNEL_CHAT = "private", "channel"
_MENTION, _TEXT_MENTION, _BOT_COMMAND = "mention", "text_mention", "bot_command"
_POSTED = Posted()
"""A message without files (events are frozen, so every such message shares one)."""


@functools.lru_cache(maxsize=4096)
def _sender(user_id: int, name: str | None) -> Sender:
    """The sender of a user's messages (frozen, so one is shared by their messages: validating one costs more)."""
    return Sender(id=str(user_id), name=name, is_bot=False)


class _Wire(BaseModel):
    """Shape checks for the fields we rely on (python-telegram-bot's ``de_json`` checks no types).

    Other fields are skipped, not kept: nothing reads them, and keeping them costs every update a dictionary per object.
    """

    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)


class _WireUser(_Wire):
    id: int
    is_bot: bool
    first_name: str
    last_name: str | None = None
    username: str | None = None

    @property
    def full_name(self) -> str:
        return f"{self.first_name} {self.last_name}" if self.last_name else self.first_name


class _WireChat(_Wire):
    id: int
    type: str


class _WireEntity(_Wire):
    type: str
    offset: int = Field(ge=0)
    length: int = Field(ge=0)
    user: _WireUser | None = None


class _WireFile(_Wire):
    """A ``PhotoSize``, ``Document``, ``Voice``, ``Audio``, ``Video`` or ``VideoNote``: what fetching needs."""

    file_id: str = Field(min_length=1)
    file_size: int | None = Field(None, ge=0)
    file_name: str | None = None
    mime_type: str | None = None
    width: int | None = None
    height: int | None = None


class _WireReply(_Wire):
    """The replied-to message (Telegram never nests a further ``reply_to_message`` in it)."""

    from_: _WireUser | None = Field(None, alias="from")
    forum_topic_created: dict[str, Any] | None = None


class _WireButton(_Wire):
    text: str
    callback_data: str | None = None


class _WireMarkup(_Wire):
    inline_keyboard: list[list[_WireButton]] = Field(default_factory=list)


class _WireMessage(_Wire):
    message_id: int
    date: int
    chat: _WireChat
    from_: _WireUser | None = Field(None, alias="from")
    text: str | None = None
    caption: str | None = None
    entities: list[_WireEntity] | None = None
    caption_entities: list[_WireEntity] | None = None
    message_thread_id: int | None = None
    is_topic_message: bool | None = None
    reply_to_message: _WireReply | None = None
    forum_topic_created: dict[str, Any] | None = None
    photo: list[_WireFile] | None = None
    document: _WireFile | None = None
    voice: _WireFile | None = None
    audio: _WireFile | None = None
    video: _WireFile | None = None
    video_note: _WireFile | None = None
    reply_markup: _WireMarkup | None = None


class _WireCallback(_Wire):
    id: str = Field(min_length=1)
    from_: _WireUser = Field(alias="from")
    data: str | None = None
    message: _WireMessage | None = None
    """Absent for a button on an inline-mode message (not ours); an old message may come as a stub."""


class WireUpdate(_Wire):
    """One ``Update``: the kinds the gateway reads (others are allowed and ignored)."""

    update_id: int = Field(ge=0)
    message: _WireMessage | None = None
    edited_message: _WireMessage | None = None
    callback_query: _WireCallback | None = None


def _utf16(text: str) -> bytes:
    return text.encode("utf-16-le", "surrogatepass")


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units (how Telegram counts text and entity offsets)."""
    return len(_utf16(text)) // 2


def _strip_ranges(text: str, ranges: list[tuple[int, int, bool]]) -> str:
    """Remove UTF-16 ``(offset, length, tidy)`` ranges (Telegram counts entities in UTF-16).

    With ``tidy``, a comma or colon and one space right after the range go too (``@bot, hi`` → ``hi``).
    """
    units = _utf16(text)
    for offset, length, tidy in sorted(ranges, reverse=True):
        start, end = offset * 2, (offset + length) * 2
        if tidy and units[end : end + 2] in (b",\x00", b":\x00", b";\x00"):
            end += 2
        if tidy and units[end : end + 2] == b" \x00":
            end += 2
        units = units[:start] + units[end:]
    return units.decode("utf-16-le", "ignore").strip()


def _attachments(message: _WireMessage) -> tuple[Attachment, ...]:
    """The files a message carries, by ``file_id`` (the largest size of a photo)."""
    found: list[Attachment] = []
    if message.photo:
        largest = max(message.photo, key=lambda p: ((p.width or 0) * (p.height or 0), p.file_size or 0))
        found.append(Attachment(kind="image", ref=largest.file_id, mime_type="image/jpeg", size=largest.file_size))
    kinds: tuple[tuple[Literal["document", "voice", "audio", "video"], _WireFile | None], ...] = (
        ("document", message.document),
        ("voice", message.voice),
        ("audio", message.audio),
        ("video", message.video),
        ("video", message.video_note),
    )
    for kind, wire in kinds:
        if wire is not None:
            found.append(
                Attachment(
                    kind=kind, ref=wire.file_id, name=wire.file_name, mime_type=wire.mime_type, size=wire.file_size
                )
            )
    return tuple(found)


def _button_label(message: _WireMessage, data: str) -> str | None:
    for row in message.reply_markup.inline_keyboard if message.reply_markup else ():
        for button in row:
            if button.callback_data == data:
                return button.text
    return None


class UpdateReader:
    """Turns ``Update`` objects into inbound message drafts for one bot (its id and username decide mentions).

    Args:
        account: The account name the drafts carry.
        bot_id: The bot's user id (from its token), if known.
        username: The bot's ``@username`` without ``@``, if known.
        require_mention: Group messages count only when they address the bot (else every one does).
        agent: The agent the account routes to, and
        tenant: its tenant (see ``BuildContext``; empty: the ingest router fills both in, with a copy of the draft).
    """

    def __init__(
        self,
        account: str,
        *,
        bot_id: int | None,
        username: str | None,
        require_mention: bool = True,
        agent: str = "",
        tenant: str = "default",
    ) -> None:
        self.account = account
        self.agent = agent
        self.tenant = tenant
        self.bot_id = bot_id
        self.username = username
        self.require_mention = require_mention

    def read(self, update: WireUpdate) -> list[InboundMessage]:
        """Zero or one draft for one ``Update``."""
        draft: InboundMessage | None = None
        if update.message is not None:
            draft = self._message(update.update_id, update.message, edited=False)
        elif update.edited_message is not None:
            draft = self._message(update.update_id, update.edited_message, edited=True)
        elif update.callback_query is not None:
            draft = self._callback(update.update_id, update.callback_query)
        return [draft] if draft is not None else []

    def _is_own(self, user: _WireUser) -> bool:
        return user.is_bot or (self.bot_id is not None and user.id == self.bot_id)

    def _message(self, update_id: int, message: _WireMessage, *, edited: bool) -> InboundMessage | None:
        user, chat = message.from_, message.chat
        if user is None or self._is_own(user) or chat.type == _CHANNEL_CHAT:
            return None
        has_text = message.text is not None
        text = (message.text if has_text else message.caption) or ""
        entities = (message.entities if has_text else message.caption_entities) or []
        attachments = () if edited else _attachments(message)
        if not text.strip() and not attachments:
            return None  # a sticker, a service message, an empty edit
        mentions = self._mentions(text, entities)
        command = self._command(text, entities)
        replied = self._replies_to_bot(message)
        bare_command = command is not None and command[2] is None
        addressed = mentions or replied or bare_command or not self.require_mention
        if chat.type != _PRIVATE and not addressed:
            return None
        if command is not None and command[2] is not None and not self._is_for_us(command[2]):
            return None  # /command@another_bot
        event: InboundEvent
        if edited:
            event = MessageEdited(original_id=str(message.message_id))
        elif command is not None:
            name, length, _ = command
            text = _strip_ranges(text, [(0, length, False), *[m for m in mentions if m[0] >= length]])
            event = CommandIssued(name=name, attachments=attachments)
            return self._draft(update_id, message, user, text, event, mentioned=bool(mentions), replied=replied)
        else:
            event = Posted(attachments=attachments) if attachments else _POSTED
        if mentions:
            text = _strip_ranges(text, mentions)
        if not text.strip() and not attachments:
            return None  # a bare mention with nothing to say
        return self._draft(update_id, message, user, text, event, mentioned=bool(mentions), replied=replied)

    def _callback(self, update_id: int, query: _WireCallback) -> InboundMessage | None:
        message = query.message
        if query.data is None or message is None or self._is_own(query.from_):
            return None  # a game button, or a button on an inline-mode message
        event = ChoiceSelected(option_id=query.data, offer_message_id=str(message.message_id), ack_ref=query.id)
        label = _button_label(message, query.data) or query.data
        return self._draft(update_id, message, query.from_, label, event, mentioned=False, replied=False)

    def _draft(
        self,
        update_id: int,
        message: _WireMessage,
        user: _WireUser,
        text: str,
        event: InboundEvent,
        *,
        mentioned: bool,
        replied: bool,
    ) -> InboundMessage:
        chat = message.chat
        thread = str(message.message_thread_id) if message.is_topic_message and message.message_thread_id else None
        extra = {"chat_id": str(chat.id), "reply_to_message_id": str(message.message_id), "chat_type": chat.type}
        if thread:
            extra["message_thread_id"] = thread
        # Every value below is a str/bool/None taken from the validated wire model (or an event model): the draft is
        # built without validating it again (tests/channels/test_fast_drafts.py checks it against validation).
        conversation = trusted(
            ConversationRef,
            tenant=self.tenant,
            agent=self.agent,
            channel=_CHANNEL,
            account=self.account,
            conversation=str(chat.id),
            thread=thread,
            extra=extra,
        )
        return trusted(
            InboundMessage,
            id="",
            dedup_key=str(update_id),
            conversation=conversation,
            sender=_sender(user.id, user.full_name or user.username),
            text=text,
            event=event,
            platform_message_id=str(message.message_id),
            received_at=time.time(),
            meta={"chat_type": str(chat.type), "mentioned": mentioned, "replied_to_bot": replied},
        )

    def _is_for_us(self, target: str) -> bool:
        return bool(self.username) and target.lower() == (self.username or "").lower()

    def _command(self, text: str, entities: list[_WireEntity]) -> tuple[str, int, str | None] | None:
        """``(name, UTF-16 length, @target)`` of a bot command that opens the text, if any."""
        first = next((e for e in entities if e.offset == 0 and e.type == _BOT_COMMAND), None)
        if first is None:
            return None
        value = _utf16(text)[: first.length * 2].decode("utf-16-le", "ignore")
        command, _, target = value[1:].partition("@")
        if not command:
            return None
        return command.lower(), first.length, target or None

    def _mentions(self, text: str, entities: list[_WireEntity]) -> list[tuple[int, int, bool]]:
        """UTF-16 ranges of the text that address this bot (to be stripped from what the agent reads)."""
        found: list[tuple[int, int, bool]] = []
        if not entities:
            return found  # most messages: no need to re-encode the text
        username = (self.username or "").lower()
        units = _utf16(text)
        for entity in entities:
            value = units[entity.offset * 2 : (entity.offset + entity.length) * 2].decode("utf-16-le", "ignore")
            by_name = entity.type == _MENTION and username and value[1:].lower() == username
            by_id = entity.type == _TEXT_MENTION and entity.user and entity.user.id == self.bot_id
            if by_name or by_id:
                found.append((entity.offset, entity.length, True))
            elif entity.type == _BOT_COMMAND and "@" in value and username:
                command, _, target = value.partition("@")
                if target.lower() == username:
                    skip = len(_utf16(command)) // 2
                    found.append((entity.offset + skip, entity.length - skip, False))
        return found

    def _replies_to_bot(self, message: _WireMessage) -> bool:
        reply = message.reply_to_message
        if reply is None or reply.from_ is None or not reply.from_.is_bot:
            return False
        if reply.forum_topic_created is not None:
            return False  # every message in a forum topic "replies" to the topic's opening message
        if self.bot_id is not None:
            return reply.from_.id == self.bot_id
        if self.username:
            return (reply.from_.username or "").lower() == self.username.lower()
        return True  # identity unknown: in privacy mode Telegram only delivers replies to this bot's messages
