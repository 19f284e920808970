"""Telegram ``Update`` → inbound events: what reaches the agent, and as what.

The same reader serves the webhook and long polling; ``update_id`` is the dedup key. Messages, edits and button taps
become events; private chats reach the agent on every message, groups as the account's ``group_replies`` say (when the
bot is mentioned or replied to, or always; unaddressed messages kept as context or ignored, see
:mod:`switchboard.core.groups`), and ``/command@another_bot`` never. Anything else parses to nothing, with no
error, so Telegram stops retrying it (details: ``docs/channels/telegram.md``).
"""

from __future__ import annotations

import functools
import time
from typing import Annotated, Any, Literal, NotRequired

from pydantic import ConfigDict, Field, TypeAdapter, with_config
from typing_extensions import TypedDict

from switchboard.core.groups import GroupRule
from switchboard.core.messages import (
    Attachment,
    ChoiceSelected,
    CommandIssued,
    Contact,
    ConversationRef,
    InboundEvent,
    InboundMessage,
    Location,
    MessageEdited,
    Posted,
    Sender,
    SharedPart,
    trusted,
)

__all__ = ["WIRE_UPDATE", "UpdateReader", "WireUpdate", "utf16_len"]

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


_WIRE = ConfigDict(strict=True, extra="ignore")
"""Shape checks for the fields we rely on (python-telegram-bot's ``de_json`` checks no types). Other fields are
skipped. The wire types are typed dictionaries, not models: pydantic-core checks them as strictly and returns plain
``dict`` objects, which costs an update much less than building a model per object (a measurable part of a webhook's
CPU). A key that may be absent is read with ``get``; the sender is under ``from_`` (``from`` on the wire)."""
_Count = Annotated[int, Field(ge=0)]


@with_config(_WIRE)
class _WireUser(TypedDict):
    id: int
    is_bot: bool
    first_name: str
    last_name: NotRequired[str | None]
    username: NotRequired[str | None]


def _full_name(user: _WireUser) -> str:
    last = user.get("last_name")
    return f"{user['first_name']} {last}" if last else user["first_name"]


@with_config(_WIRE)
class _WireChat(TypedDict):
    id: int
    type: str


@with_config(_WIRE)
class _WireEntity(TypedDict):
    type: str
    offset: _Count
    length: _Count
    user: NotRequired[_WireUser | None]


@with_config(_WIRE)
class _WireFile(TypedDict):
    """A ``PhotoSize``, ``Document``, ``Voice``, ``Audio``, ``Video`` or ``VideoNote``: what fetching needs."""

    file_id: Annotated[str, Field(min_length=1)]
    file_size: NotRequired[_Count | None]
    file_name: NotRequired[str | None]
    mime_type: NotRequired[str | None]
    width: NotRequired[int | None]
    height: NotRequired[int | None]


@with_config(_WIRE)
class _WireLocation(TypedDict):
    latitude: Annotated[float, Field(ge=-90, le=90)]  # no NaN, infinity or place off the globe: a 400
    longitude: Annotated[float, Field(ge=-180, le=180)]


@with_config(_WIRE)
class _WireVenue(TypedDict):
    location: _WireLocation
    title: str
    address: str


@with_config(_WIRE)
class _WireContact(TypedDict):
    phone_number: str
    first_name: str
    last_name: NotRequired[str | None]


@with_config(_WIRE)
class _WireReply(TypedDict):
    """The replied-to message (Telegram never nests a further ``reply_to_message`` in it)."""

    from_: NotRequired[Annotated[_WireUser | None, Field(alias="from")]]
    forum_topic_created: NotRequired[dict[str, Any] | None]


@with_config(_WIRE)
class _WireButton(TypedDict):
    text: str
    callback_data: NotRequired[str | None]


@with_config(_WIRE)
class _WireMarkup(TypedDict):
    inline_keyboard: NotRequired[list[list[_WireButton]]]


@with_config(_WIRE)
class _WireMessage(TypedDict):
    message_id: int
    date: int
    chat: _WireChat
    from_: NotRequired[Annotated[_WireUser | None, Field(alias="from")]]
    text: NotRequired[str | None]
    caption: NotRequired[str | None]
    entities: NotRequired[list[_WireEntity] | None]
    caption_entities: NotRequired[list[_WireEntity] | None]
    message_thread_id: NotRequired[int | None]
    is_topic_message: NotRequired[bool | None]
    reply_to_message: NotRequired[_WireReply | None]
    forum_topic_created: NotRequired[dict[str, Any] | None]
    photo: NotRequired[list[_WireFile] | None]
    document: NotRequired[_WireFile | None]
    voice: NotRequired[_WireFile | None]
    audio: NotRequired[_WireFile | None]
    video: NotRequired[_WireFile | None]
    video_note: NotRequired[_WireFile | None]
    location: NotRequired[_WireLocation | None]
    venue: NotRequired[_WireVenue | None]
    contact: NotRequired[_WireContact | None]
    reply_markup: NotRequired[_WireMarkup | None]


@with_config(_WIRE)
class _WireCallback(TypedDict):
    id: Annotated[str, Field(min_length=1)]
    from_: Annotated[_WireUser, Field(alias="from")]
    data: NotRequired[str | None]
    message: NotRequired[_WireMessage | None]
    """Absent for a button on an inline-mode message (not ours); an old message may come as a stub."""


@with_config(_WIRE)
class WireUpdate(TypedDict):
    """One ``Update``: the kinds the gateway reads (others are allowed and ignored)."""

    update_id: _Count
    message: NotRequired[_WireMessage | None]
    edited_message: NotRequired[_WireMessage | None]
    callback_query: NotRequired[_WireCallback | None]


WIRE_UPDATE: TypeAdapter[WireUpdate] = TypeAdapter(WireUpdate)
"""Validates an ``Update`` (``validate_json`` for a webhook body, ``validate_python`` for a ``getUpdates`` item)."""


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


_FILE_KINDS: tuple[
    tuple[Literal["document", "voice", "audio", "video"], Literal["document", "voice", "audio", "video", "video_note"]],
    ...,
] = (
    ("document", "document"),
    ("voice", "voice"),
    ("audio", "audio"),
    ("video", "video"),
    ("video", "video_note"),
)
"""The attachment kind of each single-file field of a message."""


def _attachments(message: _WireMessage) -> tuple[Attachment, ...]:
    """The files a message carries, by ``file_id`` (the largest size of a photo)."""
    found: list[Attachment] = []
    photo = message.get("photo")
    if photo:
        largest = max(photo, key=lambda p: ((p.get("width") or 0) * (p.get("height") or 0), p.get("file_size") or 0))
        size = largest.get("file_size")
        found.append(Attachment(kind="image", ref=largest["file_id"], mime_type="image/jpeg", size=size))
    for kind, key in _FILE_KINDS:
        wire = message.get(key)
        if wire is not None:
            found.append(
                Attachment(
                    kind=kind,
                    ref=wire["file_id"],
                    name=wire.get("file_name"),
                    mime_type=wire.get("mime_type"),
                    size=wire.get("file_size"),
                )
            )
    return tuple(found)


def _shared(message: _WireMessage) -> tuple[SharedPart, ...]:
    """The place (a venue, else a bare location) or contact card a message shares, if any."""
    venue, location, contact = message.get("venue"), message.get("location"), message.get("contact")
    if venue is not None:
        where = venue["location"]
        place = Location(
            latitude=where["latitude"],
            longitude=where["longitude"],
            name=venue["title"] or None,
            address=venue["address"] or None,
        )
        return (place,)
    if location is not None:
        return (Location(latitude=location["latitude"], longitude=location["longitude"]),)
    if contact is not None:
        last = contact.get("last_name")
        name = f"{contact['first_name']} {last}" if last else contact["first_name"]
        return (
            Contact(name=name or "(no name)", phones=(contact["phone_number"],) if contact["phone_number"] else ()),
        )
    return ()


def _button_label(message: _WireMessage, data: str) -> str | None:
    markup = message.get("reply_markup")
    for row in markup.get("inline_keyboard", ()) if markup else ():
        for button in row:
            if button.get("callback_data") == data:
                return button["text"]
    return None


class UpdateReader:
    """Turns ``Update`` objects into inbound message drafts for one bot (its id and username decide mentions).

    Args:
        account: The account name the drafts carry.
        bot_id: The bot's user id (from its token), if known.
        username: The bot's ``@username`` without ``@``, if known.
        require_mention: Group messages count only when they address the bot (else every one does); used when
            ``groups`` is not given.
        groups: The account's group behaviour (``group_replies``).
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
        groups: GroupRule | None = None,
        agent: str = "",
        tenant: str = "default",
    ) -> None:
        self.account = account
        self.agent = agent
        self.tenant = tenant
        self.bot_id = bot_id
        self.username = username
        self.groups = groups if groups is not None else GroupRule(answer="mention" if require_mention else "always")

    def read(self, update: WireUpdate) -> list[InboundMessage]:
        """Zero or one draft for one ``Update``."""
        draft: InboundMessage | None = None
        if (message := update.get("message")) is not None:
            draft = self._message(update["update_id"], message, edited=False)
        elif (edited := update.get("edited_message")) is not None:
            draft = self._message(update["update_id"], edited, edited=True)
        elif (query := update.get("callback_query")) is not None:
            draft = self._callback(update["update_id"], query)
        return [draft] if draft is not None else []

    def _is_own(self, user: _WireUser) -> bool:
        return user["is_bot"] or (self.bot_id is not None and user["id"] == self.bot_id)

    def _message(self, update_id: int, message: _WireMessage, *, edited: bool) -> InboundMessage | None:
        user, chat = message.get("from_"), message["chat"]
        if user is None or self._is_own(user) or chat["type"] == _CHANNEL_CHAT:
            return None
        text = message.get("text")
        if text is not None:
            entities = message.get("entities") or []
        else:
            text, entities = message.get("caption") or "", message.get("caption_entities") or []
        attachments = () if edited else _attachments(message)
        shared = () if edited else _shared(message)  # an edited location is a live location moving: not a message
        if not text.strip() and not attachments and not shared:
            return None  # a sticker, a service message, an empty edit
        mentions = self._mentions(text, entities)
        command = self._command(text, entities)
        replied = self._replies_to_bot(message)
        group = chat["type"] != _PRIVATE
        if group and not self.groups.answers(addressed=bool(mentions) or replied, conversations=(str(chat["id"]),)):
            if self.groups.keep is None or edited or not text.strip():
                return None
            return self._draft(update_id, message, user, text, _POSTED, mentioned=False, replied=False, keep=True)
        if command is not None and command[2] is not None and not self._is_for_us(command[2]):
            return None  # /command@another_bot
        event: InboundEvent
        if edited:
            event = MessageEdited(original_id=str(message["message_id"]))
        elif command is not None:
            name, length, _ = command
            text = _strip_ranges(text, [(0, length, False), *[m for m in mentions if m[0] >= length]])
            event = CommandIssued(name=name, attachments=attachments)
            return self._draft(update_id, message, user, text, event, mentioned=bool(mentions), replied=replied)
        else:
            event = Posted(attachments=attachments, shared=shared) if attachments or shared else _POSTED
        if mentions:
            text = _strip_ranges(text, mentions)
        if not text.strip() and not attachments and not shared:
            return None  # a bare mention with nothing to say
        return self._draft(update_id, message, user, text, event, mentioned=bool(mentions), replied=replied)

    def _callback(self, update_id: int, query: _WireCallback) -> InboundMessage | None:
        message, data, user = query.get("message"), query.get("data"), query["from_"]
        if data is None or message is None or self._is_own(user):
            return None  # a game button, or a button on an inline-mode message
        event = ChoiceSelected(option_id=data, offer_message_id=str(message["message_id"]), ack_ref=query["id"])
        label = _button_label(message, data) or data
        return self._draft(update_id, message, user, label, event, mentioned=False, replied=False)

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
        keep: bool = False,
    ) -> InboundMessage:
        chat, message_id, topic = message["chat"], str(message["message_id"]), message.get("message_thread_id")
        thread = str(topic) if topic and message.get("is_topic_message") else None
        chat_id, chat_type = str(chat["id"]), chat["type"]
        extra = {"chat_id": chat_id, "reply_to_message_id": message_id, "chat_type": chat_type}
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
            conversation=chat_id,
            thread=thread,
            extra=extra,
        )
        return trusted(
            InboundMessage,
            id="",
            dedup_key=str(update_id),
            conversation=conversation,
            sender=_sender(user["id"], _full_name(user) or user.get("username")),
            text=text,
            event=event,
            platform_message_id=message_id,
            received_at=time.time(),
            meta=self._meta(chat_type, mentioned=mentioned, replied=replied, keep=keep),
        )

    def _meta(self, chat_type: str, *, mentioned: bool, replied: bool, keep: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {"chat_type": chat_type, "mentioned": mentioned, "replied_to_bot": replied}
        if self.groups.keep is not None and chat_type != _PRIVATE:
            meta.update(self.groups.marks(kept=keep))
        return meta

    def _is_for_us(self, target: str) -> bool:
        return bool(self.username) and target.lower() == (self.username or "").lower()

    def _command(self, text: str, entities: list[_WireEntity]) -> tuple[str, int, str | None] | None:
        """``(name, UTF-16 length, @target)`` of a bot command that opens the text, if any."""
        first = next((e for e in entities if e["offset"] == 0 and e["type"] == _BOT_COMMAND), None)
        if first is None:
            return None
        length = first["length"]
        value = _utf16(text)[: length * 2].decode("utf-16-le", "ignore")
        command, _, target = value[1:].partition("@")
        if not command:
            return None
        return command.lower(), length, target or None

    def _mentions(self, text: str, entities: list[_WireEntity]) -> list[tuple[int, int, bool]]:
        """UTF-16 ranges of the text that address this bot (to be stripped from what the agent reads)."""
        found: list[tuple[int, int, bool]] = []
        if not entities:
            return found  # most messages: no need to re-encode the text
        username = (self.username or "").lower()
        units = _utf16(text)
        for entity in entities:
            kind, offset, length, mentioned = entity["type"], entity["offset"], entity["length"], entity.get("user")
            value = units[offset * 2 : (offset + length) * 2].decode("utf-16-le", "ignore")
            by_name = kind == _MENTION and username and value[1:].lower() == username
            by_id = kind == _TEXT_MENTION and mentioned and mentioned["id"] == self.bot_id
            if by_name or by_id:
                found.append((offset, length, True))
            elif kind == _BOT_COMMAND and "@" in value and username:
                command, _, target = value.partition("@")
                if target.lower() == username:
                    skip = len(_utf16(command)) // 2
                    found.append((offset + skip, length - skip, False))
        return found

    def _replies_to_bot(self, message: _WireMessage) -> bool:
        reply = message.get("reply_to_message")
        author = reply.get("from_") if reply is not None else None
        if reply is None or author is None or not author["is_bot"]:
            return False
        if reply.get("forum_topic_created") is not None:
            return False  # every message in a forum topic "replies" to the topic's opening message
        if self.bot_id is not None:
            return author["id"] == self.bot_id
        if self.username:
            return (author.get("username") or "").lower() == self.username.lower()
        return True  # identity unknown: in privacy mode Telegram only delivers replies to this bot's messages
