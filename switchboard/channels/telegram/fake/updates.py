"""What Telegram posts to a webhook (or answers ``getUpdates`` with): ``Update`` payloads, and the secret header.

Used by the tests, the benchmarks and ``switchboard simulate telegram``.
"""

from __future__ import annotations

import json
import time
from typing import Any

__all__ = ["SECRET_HEADER", "make_callback_query", "make_update", "sign_update"]

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"  # noqa: S105 - a header name, not a secret


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def make_update(
    text: str,
    chat_id: int,
    update_id: int,
    *,
    chat_type: str = "private",
    message_id: int = 10,
    user_id: int | None = None,
    first_name: str = "Ada",
    username: str | None = "ada",
    is_bot: bool = False,
    mention: str | None = None,
    reply_to_bot: str | None = None,
    bot_id: int = 100000,
    thread_id: int | None = None,
) -> dict[str, Any]:
    """An inbound ``Update`` with one text message, as Telegram posts it to a webhook.

    Args:
        text: The message text.
        chat_id: The chat (negative for groups, as on Telegram).
        update_id: Telegram's update id (the dedup key).
        chat_type: ``private``, ``group`` or ``supergroup``.
        message_id: The message's id within the chat.
        user_id: The sender (defaults to ``chat_id`` in private chats).
        first_name: The sender's first name.
        username: The sender's username.
        is_bot: Whether the sender is a bot.
        mention: A bot username to mention (``@name`` is put in front of the text with a ``mention`` entity).
        reply_to_bot: A bot username: the message replies to one of that bot's messages.
        bot_id: The replied-to bot's user id.
        thread_id: A forum topic id.
    """
    sender: dict[str, Any] = {"id": user_id if user_id is not None else abs(chat_id), "is_bot": is_bot}
    sender["first_name"] = first_name
    if username:
        sender["username"] = username
    chat: dict[str, Any] = {"id": chat_id, "type": chat_type}
    if chat_type == "private":
        chat["first_name"] = first_name
    else:
        chat["title"] = "Test group"
    message: dict[str, Any] = {"message_id": message_id, "from": sender, "chat": chat, "date": int(time.time())}
    if mention:
        handle = f"@{mention}"
        text = f"{handle} {text}"
        message["entities"] = [{"type": "mention", "offset": 0, "length": _utf16_len(handle)}]
    message["text"] = text
    if reply_to_bot:
        bot = {"id": bot_id, "is_bot": True, "first_name": "Bot", "username": reply_to_bot}
        message["reply_to_message"] = {
            "message_id": max(message_id - 1, 1),
            "from": bot,
            "chat": chat,
            "date": int(time.time()) - 5,
            "text": "An earlier answer",
        }
    if thread_id is not None:
        message["message_thread_id"] = thread_id
        message["is_topic_message"] = True
    return {"update_id": update_id, "message": message}


def make_callback_query(
    data: str,
    *,
    chat_id: int,
    update_id: int,
    message: dict[str, Any],
    bot: dict[str, Any],
    user_id: int | None = None,
    first_name: str = "Ada",
    query_id: str | None = None,
) -> dict[str, Any]:
    """The ``callback_query`` update of a tap on an inline-keyboard button of ``message`` (a bot message).

    Args:
        data: The button's ``callback_data``.
        chat_id: The chat the message is in.
        update_id: Telegram's update id.
        message: The tapped message's fields (``message_id``, ``text``, ``reply_markup``, ...).
        bot: The bot's ``User`` object (the message's sender).
        user_id: Who tapped (defaults to ``chat_id`` in private chats).
        first_name: The tapper's first name.
        query_id: The callback query id (what ``answerCallbackQuery`` takes).
    """
    tapper = {"id": user_id if user_id is not None else abs(chat_id), "is_bot": False, "first_name": first_name}
    chat: dict[str, Any] = {"id": chat_id, "type": "private" if chat_id > 0 else "supergroup"}
    full = {"from": bot, "chat": chat, "date": int(time.time()), **message}
    query = {"id": query_id or f"cq{update_id}", "from": tapper, "chat_instance": f"ci{chat_id}", "data": data}
    return {"update_id": update_id, "callback_query": {**query, "message": full}}


def sign_update(update: dict[str, Any], secret: str) -> tuple[bytes, dict[str, str]]:
    """The request body and headers Telegram sends for ``update`` with ``setWebhook(secret_token=secret)``."""
    body = json.dumps(update, ensure_ascii=False).encode()
    return body, {"Content-Type": "application/json", SECRET_HEADER: secret}
