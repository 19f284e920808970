"""The fake Bot API's methods: what each answers, with Telegram's checks and error wording.

``sendMessage`` / ``editMessageText`` (HTML checked strictly, 4,096 UTF-16 units after parsing, inline keyboards
with ``callback_data`` of 1–64 bytes), ``sendMessageDraft`` (private chats only, non-zero ``draft_id``),
``answerCallbackQuery`` (once per query, notice ≤ 200 characters), ``sendDocument`` / ``sendPhoto`` / ``sendVoice``
(multipart uploads, 10 MB photos, 50 MB files), ``getFile`` (files up to 20 MB), ``sendChatAction``, ``getMe`` and the
webhook methods. ``getUpdates`` is in :mod:`switchboard.channels.telegram.fake.platform` (it waits).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from aiohttp import web

from switchboard.channels.telegram.fake.html import check_html
from switchboard.channels.telegram.fake.state import FakeFile, FakeTelegramState

__all__ = [
    "MAX_CAPTION",
    "MAX_DOCUMENT_BYTES",
    "MAX_FETCH_BYTES",
    "MAX_PHOTO_BYTES",
    "MAX_TEXT",
    "METHODS",
    "error",
    "ok",
    "perform",
]

_CHAT_ACTIONS = {"typing", "upload_photo", "record_video", "upload_video", "record_voice", "upload_voice"}
_CHAT_ACTIONS |= {"upload_document", "choose_sticker", "find_location", "record_video_note", "upload_video_note"}
METHODS = {"getMe", "sendMessage", "sendChatAction", "editMessageText", "setWebhook", "deleteWebhook"}
METHODS |= {"getWebhookInfo", "sendDocument", "sendPhoto", "getUpdates", "getFile", "sendMessageDraft"}
METHODS |= {"answerCallbackQuery", "setMyCommands", "getMyCommands", "sendVoice"}
MAX_TEXT = 4096
MAX_CAPTION = 1024
MAX_PHOTO_BYTES = 10 * 1000 * 1000
MAX_DOCUMENT_BYTES = 50 * 1000 * 1000
MAX_FETCH_BYTES = 20 * 1000 * 1000
_UPLOAD_FIELDS = {"sendDocument": "document", "sendPhoto": "photo", "sendVoice": "voice"}
_NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply "
    "markup are exactly the same as a current content and reply markup of the message"
)


def ok(result: Any) -> web.Response:
    """``{"ok": true, "result": …}``."""
    return web.json_response({"ok": True, "result": result})


def error(status: int, description: str, **parameters: Any) -> web.Response:
    """A Bot API error answer."""
    body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
    if parameters:
        body["parameters"] = parameters
    return web.json_response(body, status=status)


def _units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _visible(params: dict[str, Any], text: str) -> str:
    """The text a reader sees; ``ValueError`` with Telegram's wording when its HTML parser refuses it."""
    if str(params.get("parse_mode", "")).upper() != "HTML":
        return text
    try:
        return check_html(text)
    except ValueError as err:
        raise ValueError(f"Bad Request: can't parse entities: {err}") from None


def _checked_text(params: dict[str, Any]) -> str:
    """The visible text of a ``sendMessage``/``editMessageText``; ``ValueError`` with Telegram's wording."""
    text = params.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("Bad Request: message text is empty")
    visible = _visible(params, text)
    if not visible.strip():
        raise ValueError("Bad Request: message text is empty")
    if _units(visible) > MAX_TEXT:
        raise ValueError("Bad Request: message is too long")
    return visible


def _checked_markup(params: dict[str, Any]) -> dict[str, Any] | None:
    """An inline keyboard as Telegram checks it; ``ValueError`` for bad button data."""
    markup = params.get("reply_markup")
    if markup is None:
        return None
    rows = markup.get("inline_keyboard") if isinstance(markup, dict) else None
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        raise ValueError("Bad Request: can't parse reply keyboard markup JSON object")
    buttons = [button for row in rows for button in row]
    if len(buttons) > 100 or any(len(row) > 8 for row in rows):
        raise ValueError("Bad Request: too many buttons")
    for button in buttons:
        data = button.get("callback_data") if isinstance(button, dict) else None
        if not isinstance(button, dict) or not isinstance(button.get("text"), str) or not button["text"]:
            raise ValueError("Bad Request: BUTTON_TEXT_INVALID")
        if not isinstance(data, str) or not 1 <= len(data.encode()) <= 64:
            raise ValueError("Bad Request: BUTTON_DATA_INVALID")
    return {"inline_keyboard": rows}


def _message(state: FakeTelegramState, params: dict[str, Any], text: str, message_id: int) -> dict[str, Any]:
    chat_id = params["chat_id"]
    is_private = isinstance(chat_id, int) and chat_id > 0
    message: dict[str, Any] = {
        "message_id": message_id,
        "from": state.bot,
        "chat": {"id": chat_id, "type": "private" if is_private else "supergroup"},
        "date": int(time.time()),
        "text": text,
    }
    if params.get("message_thread_id"):
        message["message_thread_id"] = params["message_thread_id"]
        message["is_topic_message"] = True
    markup = state.markups.get((chat_id, message_id))
    if markup is not None:
        message["reply_markup"] = markup
    return message


def _upload(
    state: FakeTelegramState, method: str, params: dict[str, Any], uploads: dict[str, web.FileField]
) -> web.Response:
    """``sendDocument`` / ``sendPhoto`` with the file as a multipart field."""
    name = _UPLOAD_FIELDS[method]
    upload = uploads.get(name)
    if upload is None:
        return error(400, f"Bad Request: there is no {name} in the request")
    content = upload.file.read()
    params[name] = {"filename": upload.filename, "content_type": upload.content_type, "size": len(content)}
    if len(content) > MAX_DOCUMENT_BYTES:
        return error(413, "Request Entity Too Large")
    if method == "sendPhoto" and len(content) > MAX_PHOTO_BYTES:
        return error(400, "Bad Request: PHOTO_SAVE_FILE_INVALID")
    caption = params.get("caption")
    if caption is not None:
        try:
            visible = _visible(params, str(caption))
        except ValueError as err:
            return error(400, str(err))
        if _units(visible) > MAX_CAPTION:
            return error(400, "Bad Request: message caption is too long")
    message_id = state.next_message_id(params["chat_id"])
    state.files.append(
        FakeFile(method, params["chat_id"], message_id, upload.filename, upload.content_type, content, caption)
    )
    stored = state.store_file(content, name=upload.filename)
    message = _message(state, params, "", message_id)
    del message["text"]
    if caption is not None:
        message["caption"] = caption
    kind = {"file_id": stored.file_id, "file_unique_id": f"u{stored.file_id}", "file_size": len(content)}
    if method == "sendPhoto":
        message[name] = [kind]
    elif method == "sendVoice":  # a voice note has no file name: a duration and its type
        message[name] = {**kind, "duration": int(params.get("duration") or 0), "mime_type": upload.content_type}
    else:
        message[name] = {**kind, "file_name": upload.filename}
    return ok(message)


def _get_file(state: FakeTelegramState, params: dict[str, Any]) -> web.Response:
    stored = state.stored.get(str(params.get("file_id", "")))
    if stored is None:
        return error(400, "Bad Request: invalid file_id")
    if len(stored.content) > MAX_FETCH_BYTES:
        return error(400, "Bad Request: file is too big")
    info: dict[str, Any] = {"file_id": stored.file_id, "file_unique_id": f"u{stored.file_id}"}
    info["file_path"] = stored.file_path
    if stored.reported_size is not None:
        info["file_size"] = stored.reported_size
    return ok(info)


def _draft(state: FakeTelegramState, params: dict[str, Any]) -> web.Response:
    chat_id, draft_id, text = params["chat_id"], params.get("draft_id"), params.get("text", "")
    if not isinstance(chat_id, int) or chat_id <= 0:
        return error(400, "Bad Request: TEXTDRAFT_PEER_INVALID")
    if isinstance(draft_id, str) and draft_id.lstrip("-").isdigit():
        draft_id = int(draft_id)
    if not isinstance(draft_id, int) or draft_id == 0:
        return error(400, "Bad Request: parameter draft_id must be non-zero")
    try:
        visible = _visible(params, str(text))
    except ValueError as err:
        return error(400, str(err))
    if _units(visible) > MAX_TEXT:
        return error(400, "Bad Request: message is too long")
    state.drafts.append((chat_id, draft_id, str(text)))
    return ok(True)


def _answer_callback(state: FakeTelegramState, params: dict[str, Any]) -> web.Response:
    query = params.get("callback_query_id")
    text = params.get("text")
    if not isinstance(query, str) or not query:
        return error(400, "Bad Request: query_id is empty")
    if query in state.answered:
        return error(400, "Bad Request: query is too old and response timeout expired or query ID is invalid")
    if isinstance(text, str) and len(text) > 200:
        return error(400, "Bad Request: MESSAGE_TOO_LONG")
    state.answered[query] = text if isinstance(text, str) else None
    return ok(True)


def _text_message(state: FakeTelegramState, method: str, params: dict[str, Any]) -> web.Response:
    try:
        text = _checked_text(params)
        markup = _checked_markup(params)
    except ValueError as err:
        return error(400, str(err))
    chat_id = params["chat_id"]
    if method == "sendMessage":
        message_id = state.next_message_id(chat_id)
    else:  # editMessageText
        message_id = params.get("message_id", 0)
        key = (chat_id, message_id)
        if key not in state.messages:
            return error(400, "Bad Request: message to edit not found")
        if state.messages[key] == params["text"] and markup == state.markups.get(key):
            return error(400, _NOT_MODIFIED)
    state.messages[(chat_id, message_id)] = params["text"]
    if markup is not None:
        state.markups[(chat_id, message_id)] = markup
    return ok(_message(state, params, text, message_id))


_COMMAND_NAME = re.compile(r"^[a-z0-9_]{1,32}$")
_SCOPES = {"default", "all_private_chats", "all_group_chats", "all_chat_administrators", "chat", "chat_member"}


def _decoded(value: Any) -> Any:
    """A structured parameter as Telegram reads it: JSON in a form or query string, as is in a JSON body."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _scope_key(params: dict[str, Any]) -> str:
    scope = _decoded(params.get("scope")) or {"type": "default"}
    return json.dumps({**scope, "language_code": params.get("language_code", "")}, sort_keys=True)


def _set_commands(state: FakeTelegramState, params: dict[str, Any]) -> web.Response:
    """``setMyCommands``, checked as Telegram checks it.

    At most 100 commands, names of 1-32 ``a-z0-9_``, descriptions of 1-256 characters, a known scope (``chat``
    scopes need a ``chat_id``).
    """
    commands = _decoded(params.get("commands"))
    if not isinstance(commands, list) or len(commands) > 100:
        return error(400, "Bad Request: can't parse commands JSON object")
    for entry in commands:
        if not isinstance(entry, dict) or not _COMMAND_NAME.match(str(entry.get("command", ""))):
            return error(400, "Bad Request: BOT_COMMAND_INVALID")
        if not 1 <= len(str(entry.get("description", "")).strip()) <= 256:
            return error(400, "Bad Request: BOT_COMMAND_DESCRIPTION_INVALID")
    scope = _decoded(params.get("scope")) or {"type": "default"}
    if not isinstance(scope, dict) or scope.get("type") not in _SCOPES:
        return error(400, "Bad Request: wrong scope type")
    if scope["type"] in ("chat", "chat_member") and not scope.get("chat_id"):
        return error(400, "Bad Request: chat not found")
    state.commands[_scope_key(params)] = [
        {"command": entry["command"], "description": entry["description"]} for entry in commands
    ]
    return ok(True)


def perform(
    state: FakeTelegramState, method: str, params: dict[str, Any], uploads: dict[str, web.FileField]
) -> web.Response:
    """Answer one call of ``method`` (anything but ``getUpdates``)."""
    if method == "getMe":
        return ok(state.bot)
    if method == "setWebhook":
        state.webhook = {"url": params.get("url", ""), "secret_token": params.get("secret_token")}
        return ok(True)
    if method == "deleteWebhook":
        state.webhook = {}
        if str(params.get("drop_pending_updates", "")).lower() == "true" or params.get("drop_pending_updates") is True:
            state.updates = []
        return ok(True)
    if method == "getWebhookInfo":
        pending = 0 if state.webhook else len(state.updates)
        info = {"url": state.webhook.get("url", ""), "has_custom_certificate": False, "pending_update_count": pending}
        return ok(info)
    if method == "setMyCommands":
        return _set_commands(state, params)
    if method == "getMyCommands":
        return ok(state.commands.get(_scope_key(params), []))
    if method == "getFile":
        return _get_file(state, params)
    if method == "answerCallbackQuery":
        return _answer_callback(state, params)
    if "chat_id" not in params or params["chat_id"] in ("", None):
        return error(400, "Bad Request: chat_id is empty")
    if method == "sendChatAction":
        if params.get("action") not in _CHAT_ACTIONS:
            return error(400, "Bad Request: wrong parameter action in request")
        return ok(True)
    if method == "sendMessageDraft":
        return _draft(state, params)
    if method in _UPLOAD_FIELDS:
        return _upload(state, method, params, uploads)
    return _text_message(state, method, params)
