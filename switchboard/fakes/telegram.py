"""A fake Telegram Bot API: a small aiohttp app speaking the real wire format, recording every call.

It answers ``/bot<token>/<method>`` (JSON, form or query parameters) for ``getMe``, ``sendMessage``,
``sendChatAction``, ``editMessageText``, ``setWebhook``, ``deleteWebhook`` and ``getWebhookInfo``, and
``sendDocument`` / ``sendPhoto`` as ``multipart/form-data`` uploads (the file's name, type, size and bytes are
kept in :attr:`FakeTelegramState.files`; the recorded call shows name, type and size), with Telegram's error
shapes: 401 for a wrong token, 404 for an unknown method, 400 for text or a caption that Telegram's HTML parser
would refuse or that is over 4,096 (caption: 1,024) characters, for a missing file or a photo over 10 MB,
413 for a file over 50 MB, and 429 with ``retry_after`` when told to.
Inspection routes serve ``switchboard simulate`` and the benchmarks:

- ``GET /_fake/calls?since=<seq>&chat_id=<id>&method=sendMessage&wait=<s>`` → recorded successful calls
  (add ``include_failed=1`` for refused ones); ``wait`` long-polls until one matches;
- ``POST /_fake/rate_limit`` with ``{"count": N, "retry_after": S, "method": "sendMessage"}``.

Also re-exported here from :mod:`switchboard.fakes.telegram_updates`: :func:`make_update` builds inbound
``Update`` payloads and :func:`sign_update` adds the secret-token header, as Telegram sends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from switchboard.fakes.telegram_html import check_html
from switchboard.fakes.telegram_updates import SECRET_HEADER, make_update, sign_update

__all__ = [
    "FAKE_STATE",
    "SECRET_HEADER",
    "FakeCall",
    "FakeFile",
    "FakeTelegram",
    "FakeTelegramState",
    "check_html",
    "create_fake_telegram",
    "make_update",
    "sign_update",
]

_CHAT_ACTIONS = {"typing", "upload_photo", "record_video", "upload_video", "record_voice", "upload_voice"}
_CHAT_ACTIONS |= {"upload_document", "choose_sticker", "find_location", "record_video_note", "upload_video_note"}
_JSON_PARAMS = {"reply_parameters", "link_preview_options", "reply_markup", "entities", "allowed_updates"}
_METHODS = {"getMe", "sendMessage", "sendChatAction", "editMessageText", "setWebhook", "deleteWebhook"}
_METHODS |= {"getWebhookInfo", "sendDocument", "sendPhoto"}
MAX_TEXT = 4096
MAX_CAPTION = 1024
MAX_PHOTO_BYTES = 10 * 1000 * 1000
MAX_DOCUMENT_BYTES = 50 * 1000 * 1000
_UPLOAD_FIELDS = {"sendDocument": "document", "sendPhoto": "photo"}


@dataclass(slots=True)
class FakeCall:
    """One call the fake received."""

    seq: int
    method: str
    params: dict[str, Any]
    time: float
    status: int = 200

    def to_json(self) -> dict[str, Any]:
        """The call as served by ``/_fake/calls``."""
        return {"seq": self.seq, "method": self.method, "params": self.params, "time": self.time, "status": self.status}


@dataclass(frozen=True, slots=True)
class FakeFile:
    """A file uploaded with ``sendDocument`` or ``sendPhoto``."""

    method: str
    chat_id: Any
    message_id: int
    filename: str
    content_type: str
    content: bytes
    caption: str | None = None

    @property
    def size(self) -> int:
        """Bytes received."""
        return len(self.content)


@dataclass(slots=True)
class _Planned:
    method: str | None
    status: int
    description: str
    retry_after: float | None
    skip: int = 0
    """Matching calls to let through first."""


@dataclass
class FakeTelegramState:
    """What the fake remembers: the calls it received and the messages it "sent"."""

    token: str | None
    bot: dict[str, Any]
    calls: list[FakeCall] = field(default_factory=list)
    messages: dict[tuple[Any, int], str] = field(default_factory=dict)
    files: list[FakeFile] = field(default_factory=list)
    """Files received with ``sendDocument`` / ``sendPhoto``, in order."""
    webhook: dict[str, Any] = field(default_factory=dict)
    plan: list[_Planned] = field(default_factory=list)
    """Answers to give instead of the real ones, in order."""
    _ids: dict[Any, int] = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def fail_next(self, count: int, *, retry_after: float = 1, method: str | None = None, after: int = 0) -> None:
        """Answer ``count`` calls (of ``method``, or any) with 429 and ``retry_after``, after ``after`` got through."""
        shown = int(retry_after) if float(retry_after).is_integer() else retry_after
        description = f"Too Many Requests: retry after {shown}"
        self.plan.append(_Planned(method, 429, description, retry_after, after))
        self.plan.extend(_Planned(method, 429, description, retry_after) for _ in range(count - 1))

    def refuse_next(self, count: int, *, status: int, description: str, method: str | None = None) -> None:
        """Answer the next ``count`` calls (of ``method``, or any) with ``status`` and ``description``."""
        self.plan.extend(_Planned(method, status, description, None) for _ in range(count))

    def planned(self, method: str) -> _Planned | None:
        """The planned answer for this call, if any (consumed)."""
        for index, entry in enumerate(self.plan):
            if entry.method is None or entry.method == method:
                if entry.skip:
                    entry.skip -= 1
                    return None
                return self.plan.pop(index)
        return None

    def sent(self, chat_id: int | str | None = None, method: str = "sendMessage") -> list[FakeCall]:
        """Successful calls of ``method``, optionally for one chat."""
        return [c for c in self.calls if c.method == method and c.status == 200 and _chat_matches(c, chat_id)]

    def record(self, method: str, params: dict[str, Any], status: int) -> FakeCall:
        """Remember one call and wake long-polling readers of ``/_fake/calls``."""
        call = FakeCall(len(self.calls) + 1, method, params, time.time(), status)
        self.calls.append(call)
        self._changed.set()
        self._changed = asyncio.Event()
        return call

    def next_message_id(self, chat_id: Any) -> int:
        """The next ``message_id`` in a chat (ids are per chat on Telegram)."""
        self._ids[chat_id] = self._ids.get(chat_id, 0) + 1
        return self._ids[chat_id]


FAKE_STATE: web.AppKey[FakeTelegramState] = web.AppKey("fake_telegram_state", FakeTelegramState)


def _chat_matches(call: FakeCall, chat_id: int | str | None) -> bool:
    return chat_id is None or str(call.params.get("chat_id")) == str(chat_id)


def _ok(result: Any) -> web.Response:
    return web.json_response({"ok": True, "result": result})


def _error(status: int, description: str, **parameters: Any) -> web.Response:
    body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
    if parameters:
        body["parameters"] = parameters
    return web.json_response(body, status=status)


async def _params(request: web.Request) -> tuple[dict[str, Any], dict[str, web.FileField]]:
    params: dict[str, Any] = dict(request.query)
    uploads: dict[str, web.FileField] = {}
    if request.can_read_body:
        if request.content_type == "application/json":
            body = await request.json()
            params.update(body if isinstance(body, dict) else {})
        else:
            for key, value in (await request.post()).items():
                if isinstance(value, str):
                    params[key] = value
                elif isinstance(value, web.FileField):
                    uploads[key] = value
    for key in _JSON_PARAMS & params.keys():
        if isinstance(params[key], str):
            with contextlib.suppress(ValueError):
                params[key] = json.loads(params[key])
    chat_id = params.get("chat_id")
    if isinstance(chat_id, str) and re.fullmatch(r"-?\d+", chat_id):
        params["chat_id"] = int(chat_id)
    for key in ("message_id", "message_thread_id"):
        if isinstance(params.get(key), str) and params[key].lstrip("-").isdigit():
            params[key] = int(params[key])
    return params, uploads


def _upload(
    state: FakeTelegramState, method: str, params: dict[str, Any], uploads: dict[str, web.FileField]
) -> web.Response:
    """``sendDocument`` / ``sendPhoto`` with the file as a multipart field."""
    name = _UPLOAD_FIELDS[method]
    upload = uploads.get(name)
    if upload is None:
        return _error(400, f"Bad Request: there is no {name} in the request")
    content = upload.file.read()
    params[name] = {"filename": upload.filename, "content_type": upload.content_type, "size": len(content)}
    if len(content) > MAX_DOCUMENT_BYTES:
        return _error(413, "Request Entity Too Large")
    if method == "sendPhoto" and len(content) > MAX_PHOTO_BYTES:
        return _error(400, "Bad Request: PHOTO_SAVE_FILE_INVALID")
    caption = params.get("caption")
    if caption is not None:
        visible = str(caption)
        if str(params.get("parse_mode", "")).upper() == "HTML":
            try:
                visible = check_html(visible)
            except ValueError as err:
                return _error(400, f"Bad Request: can't parse entities: {err}")
        if len(visible.encode("utf-16-le")) // 2 > MAX_CAPTION:
            return _error(400, "Bad Request: message caption is too long")
    message_id = state.next_message_id(params["chat_id"])
    state.files.append(
        FakeFile(method, params["chat_id"], message_id, upload.filename, upload.content_type, content, caption)
    )
    message = _message(state, params, "", message_id)
    del message["text"]
    if caption is not None:
        message["caption"] = caption
    kind = {"file_id": f"file-{len(state.files)}", "file_unique_id": f"u{len(state.files)}", "file_size": len(content)}
    message[name] = [kind] if method == "sendPhoto" else {**kind, "file_name": upload.filename}
    return _ok(message)


def _checked_text(params: dict[str, Any]) -> str:
    """The visible text of a ``sendMessage``/``editMessageText``; ``ValueError`` with Telegram's wording."""
    text = params.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("Bad Request: message text is empty")
    visible = text
    if str(params.get("parse_mode", "")).upper() == "HTML":
        try:
            visible = check_html(text)
        except ValueError as err:
            raise ValueError(f"Bad Request: can't parse entities: {err}") from None
    if not visible.strip():
        raise ValueError("Bad Request: message text is empty")
    if len(visible.encode("utf-16-le")) // 2 > MAX_TEXT:
        raise ValueError("Bad Request: message is too long")
    return visible


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
    return message


def _perform(
    state: FakeTelegramState, method: str, params: dict[str, Any], uploads: dict[str, web.FileField]
) -> web.Response:
    if method == "getMe":
        return _ok(state.bot)
    if method == "setWebhook":
        state.webhook = {"url": params.get("url", ""), "secret_token": params.get("secret_token")}
        return _ok(True)
    if method == "deleteWebhook":
        state.webhook = {}
        return _ok(True)
    if method == "getWebhookInfo":
        info = {"url": state.webhook.get("url", ""), "has_custom_certificate": False, "pending_update_count": 0}
        return _ok(info)
    if "chat_id" not in params or params["chat_id"] in ("", None):
        return _error(400, "Bad Request: chat_id is empty")
    if method == "sendChatAction":
        if params.get("action") not in _CHAT_ACTIONS:
            return _error(400, "Bad Request: wrong parameter action in request")
        return _ok(True)
    if method in _UPLOAD_FIELDS:
        return _upload(state, method, params, uploads)
    try:
        text = _checked_text(params)
    except ValueError as err:
        return _error(400, str(err))
    if method == "sendMessage":
        message_id = state.next_message_id(params["chat_id"])
    else:  # editMessageText
        message_id = params.get("message_id", 0)
        key = (params["chat_id"], message_id)
        if key not in state.messages:
            return _error(400, "Bad Request: message to edit not found")
        if state.messages[key] == params["text"]:
            return _error(
                400,
                "Bad Request: message is not modified: specified new message content and reply "
                "markup are exactly the same as a current content and reply markup of the message",
            )
    state.messages[(params["chat_id"], message_id)] = params["text"]
    return _ok(_message(state, params, text, message_id))


async def _api(request: web.Request) -> web.Response:
    state = request.app[FAKE_STATE]
    method = request.match_info["method"]
    try:
        params, uploads = await _params(request)
    except ValueError:
        state.record(method, {}, 400)
        return _error(400, "Bad Request: invalid request body")
    if state.token is not None and request.match_info["token"] != state.token:
        state.record(method, params, 401)
        return _error(401, "Unauthorized")
    if method not in _METHODS:
        state.record(method, params, 404)
        return _error(404, "Not Found")
    planned = state.planned(method)
    if planned is not None:
        state.record(method, params, planned.status)
        if planned.retry_after is None:
            return _error(planned.status, planned.description)
        seconds = int(planned.retry_after) if float(planned.retry_after).is_integer() else planned.retry_after
        return _error(planned.status, planned.description, retry_after=seconds)
    response = _perform(state, method, params, uploads)
    state.record(method, params, response.status)
    return response


async def _calls(request: web.Request) -> web.Response:
    state = request.app[FAKE_STATE]
    query = request.query
    try:
        since = int(query.get("since", "0"))
        wait = min(float(query.get("wait", "0")), 30.0)
    except ValueError:
        return web.json_response({"error": "since must be an integer and wait a number"}, status=400)
    method = query.get("method", "sendMessage")
    include_failed = query.get("include_failed") in ("1", "true")
    chat_id = query.get("chat_id")

    def matching() -> list[FakeCall]:
        return [
            c
            for c in state.calls[since:]
            if c.seq > since
            and (method == "*" or c.method == method)
            and (include_failed or c.status == 200)
            and _chat_matches(c, chat_id)
        ]

    deadline = time.monotonic() + wait
    found = matching()
    while not found and time.monotonic() < deadline:
        try:
            await asyncio.wait_for(state._changed.wait(), deadline - time.monotonic())
        except TimeoutError:
            break
        found = matching()
    return web.json_response([c.to_json() for c in found])


async def _rate_limit(request: web.Request) -> web.Response:
    body = await request.json()
    request.app[FAKE_STATE].fail_next(
        int(body.get("count", 1)), retry_after=float(body.get("retry_after", 1)), method=body.get("method")
    )
    return web.json_response({"ok": True})


def _bot_id(token: str | None) -> int:
    prefix = (token or "").split(":", 1)[0]
    return int(prefix) if prefix.isdigit() else 100000


def create_fake_telegram(token: str | None = None, *, username: str = "switchboard_test_bot") -> web.Application:
    """The fake Bot API as an aiohttp application. ``token=None`` accepts any token."""
    app = web.Application(client_max_size=MAX_DOCUMENT_BYTES + 2**20)  # over 50 MB answers 413 itself
    bot = {
        "id": _bot_id(token),
        "is_bot": True,
        "first_name": "Switchboard Test Bot",
        "username": username,
        "can_join_groups": True,
        "can_read_all_group_messages": False,
        "supports_inline_queries": False,
    }
    app[FAKE_STATE] = FakeTelegramState(token=token, bot=bot)
    app.router.add_route("*", "/bot{token}/{method}", _api)
    app.router.add_get("/_fake/calls", _calls)
    app.router.add_post("/_fake/rate_limit", _rate_limit)
    return app


class FakeTelegram:
    """Runs the fake on a loopback port: ``base_url = await fake.start()`` is the Bot API root to configure."""

    def __init__(self, token: str | None = None, *, username: str = "switchboard_test_bot") -> None:
        self.app = create_fake_telegram(token, username=username)
        self.state = self.app[FAKE_STATE]
        self.base_url = ""
        self._runner: web.AppRunner | None = None

    @property
    def calls(self) -> list[FakeCall]:
        """Every call received, in order."""
        return self.state.calls

    @property
    def files(self) -> list[FakeFile]:
        """Every file received with ``sendDocument`` / ``sendPhoto``, in order."""
        return self.state.files

    @property
    def bot(self) -> dict[str, Any]:
        """The bot's ``User`` object, as ``getMe`` returns it."""
        return self.state.bot

    def fail_next(self, count: int, *, retry_after: float = 1, method: str | None = None, after: int = 0) -> None:
        """Answer ``count`` calls (of ``method``, or any) with 429 and ``retry_after``, after ``after`` got through."""
        self.state.fail_next(count, retry_after=retry_after, method=method, after=after)

    def refuse_next(self, count: int, *, status: int, description: str, method: str | None = None) -> None:
        """Answer the next ``count`` calls (of ``method``, or any) with ``status`` and ``description``."""
        self.state.refuse_next(count, status=status, description=description, method=method)

    def sent(self, chat_id: int | str | None = None, method: str = "sendMessage") -> list[FakeCall]:
        """Successful calls of ``method``, optionally for one chat."""
        return self.state.sent(chat_id, method)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port`` (0 picks a free port) and return the base URL."""
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound_host, bound_port = self._runner.addresses[0][:2]
        self.base_url = f"http://{bound_host}:{bound_port}"
        return self.base_url

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeTelegram:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
