"""① and ⑤ for Telegram: the webhook secret, ``Update`` → ``InboundMessage``, sends through the Bot API.

Telegram signs nothing: ``setWebhook(secret_token=…)`` makes it echo a shared secret, compared here in
constant time on bytes before the body is read. ``update_id`` is the dedup key. Private chats reach the
agent on every text message; groups only when the bot is mentioned (``@username``, a ``text_mention``,
``/command@username``) or replied to. Edited messages, channel posts, button taps and media without a
caption parse to nothing (not handled yet; no error, so Telegram stops retrying them).

python-telegram-bot's types normalise what comes in; sends are plain JSON POSTs on one aiohttp pool for the
adapter's life (:mod:`~switchboard.channels._botapi`) against the configurable Bot API root; files go up as
``multipart/form-data`` (``sendPhoto`` / ``sendDocument``, :mod:`~switchboard.channels._telegram_files`). Choices
are shown as numbered options. Markdown is
rendered to Telegram HTML and split after rendering. Link previews are off, so Telegram never fetches a link
the model wrote on its own.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, assert_never

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from telegram import MessageEntity, User
from telegram.constants import ChatType, MessageEntityType

from switchboard.channels._botapi import BotApi, BotApiRefusal
from switchboard.channels._markdown import (
    action_markdown,
    markdown_to_html,
    render_messages,
    split_html,
    visible_text,
)
from switchboard.channels._telegram_files import upload_file
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
from switchboard.errors import ConfigError, DeliveryError, MalformedBodyError, SignatureError
from switchboard.settings import TelegramSettings

__all__ = ["MAX_CAPTION_LENGTH", "SECRET_HEADER", "TelegramChannel"]

logger = logging.getLogger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"  # noqa: S105 - a header name, not a secret
_CHANNEL: Literal["telegram"] = "telegram"
_ERROR_TEXT_LIMIT = 1000
_PROGRESS_KEEP = 2048
_NO_PREVIEW = {"is_disabled": True}
_INTEGER = re.compile(r"-?\d+")
MAX_CAPTION_LENGTH = 1024
"""Telegram's caption limit (``telegram.constants.MessageLimit.CAPTION_LENGTH``)."""
# python-telegram-bot 22 warns (PTBDeprecationWarning) whenever it builds a time period as an int; opting in
# to the future timedelta behaviour is the documented way to stop that (the variable is read on every use).
os.environ.setdefault("PTB_TIMEDELTA", "true")


class _Wire(BaseModel):
    """Shape checks for the fields we rely on (python-telegram-bot's ``de_json`` checks no types)."""

    model_config = ConfigDict(strict=True, extra="allow", populate_by_name=True)


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


class _WireReply(_Wire):
    """The replied-to message (Telegram never nests a further ``reply_to_message`` in it)."""

    from_: _WireUser | None = Field(None, alias="from")
    forum_topic_created: dict[str, Any] | None = None


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


class _WireUpdate(_Wire):
    update_id: int = Field(ge=0)
    message: _WireMessage | None = None


def _header_values(headers: Mapping[str, str], name: str) -> list[str]:
    getall = getattr(headers, "getall", None)
    if callable(getall):
        return [str(v) for v in getall(name, [])]
    return [v for k, v in headers.items() if k.lower() == name.lower()]


def _utf16(text: str) -> bytes:
    return text.encode("utf-16-le", "surrogatepass")


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


class TelegramChannel:
    """One Telegram bot account.

    Args:
        settings: The account's ``SWITCHBOARD_TELEGRAM__*`` block.
        agent: The agent this account talks to.
        tenant: The tenant the account belongs to.
        account: The account name (``default`` for the env-configured bot).
    """

    name: ClassVar[Literal["telegram"]] = "telegram"
    streams: ClassVar[bool] = False

    def __init__(
        self, settings: TelegramSettings, *, agent: str, tenant: str = "default", account: str = "default"
    ) -> None:
        self._settings = settings
        self._agent, self._tenant, self._account = agent, tenant, account
        self._username = (settings.bot_username or "").lstrip("@") or None
        token = settings.bot_token.get_secret_value() if settings.bot_token else ""
        prefix = token.split(":", 1)[0]
        self._bot_id: int | None = int(prefix) if prefix.isdigit() else None
        self._api: BotApi | None = None
        self._progress: OrderedDict[str, tuple[str, list[str]]] = OrderedDict()

    @property
    def bot_username(self) -> str | None:
        """The bot's ``@username`` (without ``@``), configured or learnt with ``getMe``."""
        return self._username

    @property
    def bot_id(self) -> int | None:
        """The bot's user id (the digits before ``:`` in its token, confirmed by ``getMe``)."""
        return self._bot_id

    # ① inbound -----------------------------------------------------------------------------------

    def handshake(self, request: RawRequest) -> HandshakeReply | None:
        """Telegram has no handshake."""
        return None

    def verify(self, request: RawRequest) -> None:
        """Check ``X-Telegram-Bot-Api-Secret-Token`` against the configured secret (constant time, raw bytes).

        Raises:
            SignatureError: 401 when the header is missing, 403 when it is wrong, repeated, or no secret is set.
        """
        expected = self._settings.secret_token
        if expected is None:
            raise SignatureError(
                f"telegram account {self._account!r} refuses every webhook until a secret is configured: set "
                "SWITCHBOARD_TELEGRAM__SECRET_TOKEN and pass the same value as secret_token to setWebhook",
                channel=_CHANNEL,
                status=403,
            )
        values = _header_values(request.headers, SECRET_HEADER)
        if not values:
            raise SignatureError(f"missing {SECRET_HEADER} header", channel=_CHANNEL, status=401)
        given = values[0].encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, expected.get_secret_value().encode()) or len(values) != 1:
            raise SignatureError(f"wrong {SECRET_HEADER} header", channel=_CHANNEL, status=403)

    def parse(self, request: RawRequest) -> list[InboundMessage]:
        """Normalise one ``Update``: zero or one message draft.

        Raises:
            MalformedBodyError: the body is not JSON or not a Telegram ``Update``.
        """
        try:  # one pass over the bytes: pydantic-core parses and checks the shape together
            wire = _WireUpdate.model_validate_json(request.body)
        except ValidationError as err:
            first = err.errors()[0]
            if first["type"] == "json_invalid":
                raise MalformedBodyError("body is not JSON", channel=_CHANNEL) from None
            if first["type"] == "model_type" and not first["loc"]:
                raise MalformedBodyError("body must be a JSON object (a Telegram Update)", channel=_CHANNEL) from None
            where = ".".join(str(p) for p in first["loc"])[:200] or "body"
            raise MalformedBodyError(f"not a Telegram Update: {where}: {first['msg']}", channel=_CHANNEL) from None
        message = wire.message
        if message is None:
            return []  # edited_message, callback_query, channel_post, ...: not handled yet
        text: str | None = message.text if message.text is not None else message.caption
        wire_entities = message.entities if message.text is not None else message.caption_entities
        if text is None or message.from_ is None:
            return []  # a sticker, a photo without caption, a service message
        user, chat = message.from_, message.chat
        # python-telegram-bot's MessageEntity for the mention rules (its full Message costs ~70 µs to build)
        entities = tuple(
            MessageEntity(
                type=e.type,
                offset=e.offset,
                length=e.length,
                user=User(id=e.user.id, first_name=e.user.first_name, is_bot=e.user.is_bot) if e.user else None,
            )
            for e in wire_entities or ()
        )
        draft = self._normalise(wire.update_id, message, text, user, chat, entities)
        return [draft] if draft is not None else []

    def _normalise(
        self,
        update_id: int,
        message: _WireMessage,
        text: str,
        user: _WireUser,
        chat: _WireChat,
        entities: tuple[MessageEntity, ...],
    ) -> InboundMessage | None:
        if user.is_bot or (self._bot_id is not None and user.id == self._bot_id) or chat.type == ChatType.CHANNEL:
            return None
        mentions = self._mentions(text, entities)
        replied = self._replies_to_bot(message)
        if chat.type != ChatType.PRIVATE and not (mentions or replied):
            return None
        if mentions:
            text = _strip_ranges(text, mentions)
        if not text.strip():
            return None
        thread = str(message.message_thread_id) if message.is_topic_message and message.message_thread_id else None
        extra = {"chat_id": str(chat.id), "reply_to_message_id": str(message.message_id)}
        if thread:
            extra["message_thread_id"] = thread
        conversation = ConversationRef(
            tenant=self._tenant,
            agent=self._agent,
            channel=_CHANNEL,
            account=self._account,
            conversation=str(chat.id),
            thread=thread,
            extra=extra,
        )
        return InboundMessage(
            dedup_key=str(update_id),
            conversation=conversation,
            sender=Sender(id=str(user.id), name=user.full_name or user.username, is_bot=False),
            text=text,
            platform_message_id=str(message.message_id),
            meta={"chat_type": str(chat.type), "mentioned": bool(mentions), "replied_to_bot": replied},
        )

    def _mentions(self, text: str, entities: tuple[MessageEntity, ...]) -> list[tuple[int, int, bool]]:
        """UTF-16 ranges of the text that address this bot (to be stripped from what the agent reads)."""
        found: list[tuple[int, int, bool]] = []
        username = (self._username or "").lower()
        units = _utf16(text)
        for entity in entities:
            value = units[entity.offset * 2 : (entity.offset + entity.length) * 2].decode("utf-16-le", "ignore")
            by_name = entity.type == MessageEntityType.MENTION and username and value[1:].lower() == username
            by_id = entity.type == MessageEntityType.TEXT_MENTION and entity.user and entity.user.id == self._bot_id
            if by_name or by_id:
                found.append((entity.offset, entity.length, True))
            elif entity.type == MessageEntityType.BOT_COMMAND and "@" in value and username:
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
        if self._bot_id is not None:
            return reply.from_.id == self._bot_id
        if self._username:
            return (reply.from_.username or "").lower() == self._username.lower()
        return True  # identity unknown: in privacy mode Telegram only delivers replies to this bot's messages

    # ⑤ outbound ----------------------------------------------------------------------------------

    def _client(self) -> BotApi:
        if self._api is None:
            if self._settings.bot_token is None:
                raise DeliveryError(
                    f"telegram account {self._account!r} has no bot token: set SWITCHBOARD_TELEGRAM__BOT_TOKEN",
                    channel=_CHANNEL,
                    retryable=False,
                )
            self._api = BotApi(self._settings.bot_token.get_secret_value(), self._settings.api_base_url)
        return self._api

    async def start(self) -> None:
        """Learn the bot's id and username with ``getMe`` (once, at start-up; failures only logged).

        Without a username, group messages reach the agent only as replies to the bot.
        """
        if self._settings.bot_token is None:
            return
        try:
            me = await self._client().call("getMe", {})
            bot_id, username = me["id"], me.get("username")
        except (DeliveryError, KeyError, TypeError) as exc:
            logger.warning(
                "telegram account %s: getMe failed (%s); group mentions are %s",
                self._account,
                type(exc).__name__,
                "matched by the configured username" if self._username else "not recognised, only replies",
            )
            return
        if isinstance(bot_id, int):
            self._bot_id = bot_id
        self._username = self._username or (username if isinstance(username, str) else None)

    async def set_webhook(self, url: str) -> None:
        """Point Telegram at ``url`` with this account's secret token (``setWebhook``).

        Raises:
            ConfigError: no secret token is configured.
            DeliveryError: Telegram refused or could not be reached.
        """
        if self._settings.secret_token is None:
            raise ConfigError("set SWITCHBOARD_TELEGRAM__SECRET_TOKEN before registering a webhook", field="telegram")
        secret = self._settings.secret_token.get_secret_value()
        await self._client().call("setWebhook", {"url": url, "secret_token": secret})

    async def perform(self, action: Action, conversation: ConversationRef, *, idempotency_key: str) -> Receipt:
        """Carry out one send action in the conversation.

        Raises:
            RateLimitedError: Telegram answered 429; retry after ``retry_after`` seconds.
            DeliveryError: ``retryable`` for network trouble and 5xx, not for 4xx.
        """
        match action:
            case SendText():
                return await self._send(render_messages(action.text), conversation, idempotency_key, "HTML")
            case SendTyping():
                chat_id, thread, _ = self._route(conversation)
                params = {"chat_id": chat_id, "action": "typing", "message_thread_id": thread}
                await self._client().call("sendChatAction", params)
                return Receipt(parts=0, detail={"action": "typing"})
            case SetStatus() | StreamDelta():
                return Receipt(parts=0)
            case SendError():
                text = action.message.strip()[:_ERROR_TEXT_LIMIT] or "Sorry, something went wrong."
                return await self._send([text], conversation, idempotency_key, None)
            case SendFile():
                return await self._send_file(action, conversation, idempotency_key)
            case OfferChoice():
                # Button taps arrive as callback queries, which this adapter does not read yet: numbered options.
                markdown = action_markdown(action)
                return await self._send(render_messages(markdown), conversation, idempotency_key, "HTML")
            case _:
                assert_never(action)

    async def _send_file(self, action: SendFile, conversation: ConversationRef, key: str) -> Receipt:
        """The file as a photo or a document (see :mod:`~switchboard.channels._telegram_files`), with its caption.

        A caption longer than Telegram's 1,024 characters keeps its first part on the file; the rest follows
        as messages.
        """
        caption_parts = split_html(markdown_to_html(action.caption), MAX_CAPTION_LENGTH) if action.caption else []
        chat_id, thread, reply_to = self._route(conversation)
        params: dict[str, Any] = {
            "chat_id": chat_id,
            "message_thread_id": thread,
            "caption": caption_parts[0] if caption_parts else None,
            "parse_mode": "HTML" if caption_parts else None,
            "reply_parameters": (
                {"message_id": reply_to, "allow_sending_without_reply": True} if reply_to is not None else None
            ),
        }
        method, message, size = await upload_file(self._client(), Path(action.path), action.mime_type, params)
        ids = (str(message["message_id"]),)
        detail = {"method": method, "bytes": str(size)}
        if len(caption_parts) <= 1:
            return Receipt(platform_ids=ids, parts=1, detail=detail)
        rest = await self._send(caption_parts[1:], conversation, f"{key}:caption", "HTML")
        return Receipt(platform_ids=ids + rest.platform_ids, parts=1 + rest.parts, detail=detail)

    @staticmethod
    def _route(conversation: ConversationRef) -> tuple[int | str, int | None, int | None]:
        chat = conversation.extra.get("chat_id") or conversation.conversation
        thread = conversation.extra.get("message_thread_id") or conversation.thread
        reply = conversation.extra.get("reply_to_message_id")
        chat_id: int | str = int(chat) if _INTEGER.fullmatch(chat) else chat
        thread_id, reply_id = (int(v) if v and v.isdigit() else None for v in (thread, reply))
        return chat_id, thread_id, reply_id

    async def _send(self, parts: list[str], conversation: ConversationRef, key: str, parse_mode: str | None) -> Receipt:
        """Send ``parts`` in order, the first as a reply; a retry with the same key resumes after the last sent."""
        if not parts:
            return Receipt(parts=0, detail={"skipped": "empty"})
        digest = hashlib.sha256("\x00".join([parse_mode or "", *parts]).encode()).hexdigest()
        known = self._progress.get(key)
        if known is not None and known[0] != digest:
            raise DeliveryError(
                f"idempotency key {key!r} was already used for a different message", channel=_CHANNEL, retryable=False
            )
        sent = known[1] if known is not None else []
        self._progress[key] = (digest, sent)
        self._progress.move_to_end(key)
        while len(self._progress) > _PROGRESS_KEEP:
            self._progress.popitem(last=False)
        chat_id, thread, reply_to = self._route(conversation)
        for index in range(len(sent), len(parts)):
            reply = (
                {"message_id": reply_to, "allow_sending_without_reply": True}
                if index == 0 and reply_to is not None
                else None
            )
            sent.append(await self._send_one(parts[index], chat_id, thread, reply, parse_mode))
        return Receipt(platform_ids=tuple(sent), parts=len(parts))

    async def _send_one(
        self, text: str, chat_id: int | str, thread: int | None, reply: dict[str, Any] | None, parse_mode: str | None
    ) -> str:
        """One ``sendMessage``; returns the new message's id."""
        api = self._client()
        params: dict[str, Any] = {
            "chat_id": chat_id,
            "text": text,
            "parse_mode": parse_mode,
            "message_thread_id": thread,
            "reply_parameters": reply,
            "link_preview_options": _NO_PREVIEW,
        }
        try:
            message = await api.call("sendMessage", params)
        except BotApiRefusal as exc:
            if parse_mode is None or exc.status != 400 or "can't parse entities" not in exc.description.lower():
                raise
            # Our renderer should never get here; if Telegram's parser disagrees, the words still arrive.
            logger.warning("telegram refused the rendered HTML (%s); sending the part as plain text", exc.description)
            message = await api.call("sendMessage", {**params, "text": visible_text(text), "parse_mode": None})
        try:
            return str(message["message_id"])
        except (KeyError, TypeError):
            raise DeliveryError("telegram answered sendMessage without a message", channel=_CHANNEL) from None

    async def aclose(self) -> None:
        """Close the Bot API connection pool."""
        api, self._api = self._api, None
        if api is not None:
            await api.aclose()
