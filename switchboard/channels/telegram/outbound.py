"""⑤ for Telegram: every send action as Bot API calls, resuming multi-part sends where an attempt stopped.

Markdown is rendered to Telegram HTML and split after rendering; each part is paced by the shared buckets and
recorded as sent, so a retry on any worker resumes at the next part. Link previews are off, so Telegram never fetches
a link the model wrote. Streaming uses ``sendMessageDraft`` in private chats, edits elsewhere; choices are inline
keyboards whose ``callback_data`` is the option id.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

from switchboard.channels.base import Receipt, SendContext
from switchboard.channels.parts import SentParts
from switchboard.channels.render.actions import action_markdown
from switchboard.channels.render.telegram import (
    markdown_to_html,
    render_messages,
    split_html,
    visible_text,
)
from switchboard.channels.telegram.api import BotApi, BotApiRefusal, Upload
from switchboard.channels.telegram.files import upload_file
from switchboard.core.actions import AckChoice, EditText, OfferChoice, SendError, SendFile, SendVoice, StreamText
from switchboard.core.messages import ConversationRef
from switchboard.errors import DeliveryError

__all__ = ["MAX_BUTTONS", "MAX_BUTTON_LABEL", "MAX_CALLBACK_DATA", "MAX_CAPTION_LENGTH", "TelegramSender", "is_private"]

logger = logging.getLogger(__name__)

_CHANNEL: Final = "telegram"
_ERROR_TEXT_LIMIT: Final = 1000
_NO_PREVIEW: Final = {"is_disabled": True}
_INTEGER: Final = re.compile(r"-?\d+")
MAX_CAPTION_LENGTH: Final = 1024
"""Telegram's caption limit (``telegram.constants.MessageLimit.CAPTION_LENGTH``)."""
MAX_CALLBACK_DATA: Final = 64
"""``callback_data`` is 1–64 bytes."""
MAX_BUTTONS: Final = 100
"""Buttons in one inline keyboard."""
MAX_BUTTON_LABEL: Final = 64
_ACK_TEXT_LIMIT: Final = 200
_EMPTY_PREVIEW: Final = "…"


def is_private(conversation: ConversationRef) -> bool:
    """A one-to-one chat with a user (drafts work there; groups have tighter send limits)."""
    kind = conversation.extra.get("chat_type")
    if kind is not None:
        return kind == "private"
    chat = conversation.extra.get("chat_id") or conversation.conversation
    return bool(_INTEGER.fullmatch(chat)) and not chat.startswith("-")


def _route(conversation: ConversationRef) -> tuple[int | str, int | None, int | None]:
    chat = conversation.extra.get("chat_id") or conversation.conversation
    thread = conversation.extra.get("message_thread_id") or conversation.thread
    reply = conversation.extra.get("reply_to_message_id")
    chat_id: int | str = int(chat) if _INTEGER.fullmatch(chat) else chat
    thread_id, reply_id = (int(v) if v and v.isdigit() else None for v in (thread, reply))
    return chat_id, thread_id, reply_id


def _reply(reply_to: int | None) -> dict[str, Any] | None:
    return {"message_id": reply_to, "allow_sending_without_reply": True} if reply_to is not None else None


def _draft_id(key: str) -> int:
    """A non-zero 31-bit draft id, the same for every retry of one send."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % (2**31 - 1) + 1


def _message_id(message: Any, method: str) -> str:
    try:
        return str(message["message_id"])
    except (KeyError, TypeError):
        raise DeliveryError(f"telegram answered {method} without a message", channel=_CHANNEL) from None


def _keyboard(action: OfferChoice) -> dict[str, Any] | None:
    """The inline keyboard for a choice, or ``None`` when an option cannot be a button (then numbered text)."""
    if not action.options or len(action.options) > MAX_BUTTONS:
        return None
    if any(len(option.id.encode()) > MAX_CALLBACK_DATA for option in action.options):
        return None
    rows = [[{"text": option.label[:MAX_BUTTON_LABEL], "callback_data": option.id}] for option in action.options]
    return {"inline_keyboard": rows}


class TelegramSender:
    """Performs send actions for one bot through its :class:`BotApi` (obtained lazily: a token may be missing).

    Args:
        client: Returns the account's Bot API client.
    """

    def __init__(self, client: Callable[[], BotApi]) -> None:
        self._client = client

    # text ------------------------------------------------------------------------------------------

    async def text(self, markdown: str, conversation: ConversationRef, send: SendContext) -> Receipt:
        """The agent's Markdown as HTML messages."""
        return await self.parts(render_messages(markdown), conversation, send, "HTML")

    async def error(self, action: SendError, conversation: ConversationRef, send: SendContext) -> Receipt:
        """A short plain message saying what failed."""
        text = action.message.strip()[:_ERROR_TEXT_LIMIT] or "Sorry, something went wrong."
        return await self.parts([text], conversation, send, None)

    async def parts(
        self,
        parts: list[str],
        conversation: ConversationRef,
        send: SendContext,
        parse_mode: str | None,
        *,
        markup: dict[str, Any] | None = None,
        offset: int = 0,
        done: SentParts | None = None,
    ) -> Receipt:
        """Send ``parts`` in order, the first as a reply, ``markup`` on the last; resume after ``send.sent``.

        ``offset`` counts parts of the same send that came before these (a file before its caption's rest);
        ``done`` lists the ids sent so far when this attempt already sent some of them.
        """
        sent = SentParts(send) if done is None else done
        if not parts:
            return sent.receipt(offset) if offset else sent.receipt(offset, skipped="empty")
        chat_id, thread, reply_to = _route(conversation)

        async def post(index: int, part: str) -> str:
            await send.pace()
            reply = _reply(reply_to) if index + offset == 0 else None
            keyboard = markup if index == len(parts) - 1 else None
            return await self._send_one(part, chat_id, thread, reply, parse_mode, keyboard)

        await sent.send(parts, post, offset=offset)
        return sent.receipt(offset + len(parts))

    async def _send_one(
        self,
        text: str,
        chat_id: int | str,
        thread: int | None,
        reply: dict[str, Any] | None,
        parse_mode: str | None,
        markup: dict[str, Any] | None = None,
    ) -> str:
        """One ``sendMessage``; returns the new message's id."""
        params: dict[str, Any] = {
            "chat_id": chat_id,
            "text": text,
            "parse_mode": parse_mode,
            "message_thread_id": thread,
            "reply_parameters": reply,
            "link_preview_options": _NO_PREVIEW,
            "reply_markup": markup,
        }
        return _message_id(await self._html_call("sendMessage", params), "sendMessage")

    async def _html_call(self, method: str, params: dict[str, Any]) -> Any:
        """``method`` with HTML; if Telegram's parser disagrees with our renderer, the words still arrive."""
        api = self._client()
        try:
            return await api.call(method, params)
        except BotApiRefusal as exc:
            if params.get("parse_mode") is None or exc.status != 400 or "can't parse entities" not in exc.description:
                raise
            logger.warning("telegram refused the rendered HTML (%s); sending the part as plain text", exc.description)
            return await api.call(method, {**params, "text": visible_text(params["text"]), "parse_mode": None})

    # edits and streams -----------------------------------------------------------------------------

    async def edit(self, action: EditText, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Replace a sent message's text (the first rendered part: the caller keeps within the limit)."""
        rendered = render_messages(action.text) or [_EMPTY_PREVIEW]
        await send.pace()
        await self._edit(action.message_id, rendered[0], conversation)
        return Receipt(platform_ids=(action.message_id,), parts=1)

    async def _edit(self, message_id: str, html: str, conversation: ConversationRef) -> None:
        chat_id, _, _ = _route(conversation)
        params: dict[str, Any] = {
            "chat_id": chat_id,
            "message_id": int(message_id) if message_id.isdigit() else message_id,
        }
        params |= {"text": html, "parse_mode": "HTML", "link_preview_options": _NO_PREVIEW}
        try:
            await self._html_call("editMessageText", params)
        except BotApiRefusal as exc:
            if exc.status != 400 or "message is not modified" not in exc.description:
                raise  # the same text again is no failure: the message already shows it

    async def stream(self, action: StreamText, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Open or update a draft (private chats), or make the complete reply permanent (``final``).

        Where there are no drafts (groups), or Telegram refuses one, the receipt has no handle: the streaming
        policy then streams by editing a preview message instead.
        """
        if action.final:
            return await self.text(action.text, conversation, send)
        if action.handle is None and not is_private(conversation):
            return Receipt(parts=0)
        draft = int(action.handle) if action.handle and action.handle.isdigit() else _draft_id(send.idempotency_key)
        rendered = render_messages(action.text)
        chat_id, thread, _ = _route(conversation)
        params = {"chat_id": chat_id, "draft_id": draft, "text": rendered[-1] if rendered else "", "parse_mode": "HTML"}
        await send.pace()
        try:
            await self._html_call("sendMessageDraft", {**params, "message_thread_id": thread})
        except BotApiRefusal as exc:
            if exc.status != 400 or action.handle is not None:
                raise
            logger.info("telegram refused a message draft (%s); streaming by edits", exc.description)
            return Receipt(parts=0)
        return Receipt(parts=0, handle=str(draft))

    # choices, files, acks --------------------------------------------------------------------------

    async def choice(self, action: OfferChoice, conversation: ConversationRef, send: SendContext) -> Receipt:
        """An inline keyboard (one option a row, ``callback_data`` = option id), else numbered options."""
        keyboard = _keyboard(action)
        if keyboard is None:
            return await self.text(action_markdown(action), conversation, send)
        parts = render_messages(action.question) if action.question.strip() else ["Please choose:"]
        return await self.parts(parts, conversation, send, "HTML", markup=keyboard)

    async def ack(self, action: AckChoice, send: SendContext) -> Receipt:
        """``answerCallbackQuery``: stops the button's spinner; a query too old to answer is no failure."""
        params = {"callback_query_id": action.ack_ref, "text": action.text[:_ACK_TEXT_LIMIT] or None}
        await send.pace()
        try:
            await self._client().call("answerCallbackQuery", params)
        except BotApiRefusal as exc:
            if exc.status != 400:
                raise
            logger.info("telegram did not take a click acknowledgement: %s", exc.description)
            return Receipt(parts=0, detail={"ack": "expired"})
        return Receipt(parts=0, detail={"ack": "answered"})

    async def typing(self, conversation: ConversationRef, send: SendContext) -> Receipt:
        """``sendChatAction(typing)``: shown for up to 5 s or until the next message."""
        chat_id, thread, _ = _route(conversation)
        await send.pace()
        params = {"chat_id": chat_id, "action": "typing", "message_thread_id": thread}
        await self._client().call("sendChatAction", params)
        return Receipt(parts=0, detail={"action": "typing"})

    async def voice(self, action: SendVoice, conversation: ConversationRef, send: SendContext) -> Receipt:
        """``sendVoice``: the OGG/Opus audio as a voice note (no caption: the text reply went out before it)."""
        done = SentParts(send)
        if done.ids:
            return done.receipt()
        chat_id, thread, _ = _route(conversation)
        params: dict[str, Any] = {"chat_id": chat_id, "message_thread_id": thread}
        if action.duration_s is not None:
            params["duration"] = str(max(round(action.duration_s), 1))
        data = base64.b64decode(action.audio)
        await send.pace()
        message = await self._client().upload("sendVoice", params, Upload("voice", "reply.ogg", data, action.mime_type))
        await done.record(_message_id(message, "sendVoice"))
        return done.receipt(method="sendVoice", bytes=str(len(data)))

    async def file(self, action: SendFile, conversation: ConversationRef, send: SendContext) -> Receipt:
        """The workspace file as a photo or a document with its caption.

        A caption over 1,024 characters keeps its first part on the file; the rest follows as messages.
        """
        caption = split_html(markdown_to_html(action.caption), MAX_CAPTION_LENGTH) if action.caption else []
        detail: dict[str, str] = {}
        done = SentParts(send)
        if not done.ids:
            data = await send.read_file(action.path)
            if action.mime_type:
                data = replace(data, mime_type=action.mime_type)
            chat_id, thread, reply_to = _route(conversation)
            params: dict[str, Any] = {
                "chat_id": chat_id,
                "message_thread_id": thread,
                "caption": caption[0] if caption else None,
                "parse_mode": "HTML" if caption else None,
                "reply_parameters": _reply(reply_to),
            }
            await send.pace()
            method, message, size = await upload_file(self._client(), data, params)
            await done.record(_message_id(message, method))
            detail = {"method": method, "bytes": str(size)}
        receipt = await self.parts(caption[1:], conversation, send, "HTML", offset=1, done=done)
        return Receipt(platform_ids=receipt.platform_ids, parts=receipt.parts, detail=detail)
