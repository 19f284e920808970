"""A fake Telegram Bot API: a small aiohttp app speaking the real wire format, recording every call.

:class:`FakeTelegram` lists the methods it answers, its error shapes, failure injection and the inspection routes
``switchboard simulate`` and the benchmarks use. Also re-exported here from
:mod:`switchboard.channels.telegram.fake.updates`: :func:`make_update` builds inbound ``Update`` payloads and
:func:`sign_update` adds the secret-token header, as Telegram sends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from typing import Any

from aiohttp import web

from switchboard.channels.fakes import FakeServer
from switchboard.channels.telegram.fake.html import check_html
from switchboard.channels.telegram.fake.methods import MAX_DOCUMENT_BYTES, METHODS, error, ok, perform
from switchboard.channels.telegram.fake.state import FakeCall, FakeFile, FakeTelegramState, StoredFile, chat_matches
from switchboard.channels.telegram.fake.updates import SECRET_HEADER, make_callback_query, make_update, sign_update

__all__ = [
    "FAKE_STATE",
    "SECRET_HEADER",
    "FakeCall",
    "FakeFile",
    "FakeTelegram",
    "FakeTelegramState",
    "StoredFile",
    "check_html",
    "create_fake_telegram",
    "make_callback_query",
    "make_update",
    "sign_update",
]

_JSON_PARAMS = {"reply_parameters", "link_preview_options", "reply_markup", "entities", "allowed_updates"}
_INT_PARAMS = ("message_id", "message_thread_id", "draft_id", "offset", "limit", "timeout")

FAKE_STATE: web.AppKey[FakeTelegramState] = web.AppKey("fake_telegram_state", FakeTelegramState)


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
    for key in _INT_PARAMS:
        if isinstance(params.get(key), str) and params[key].lstrip("-").isdigit():
            params[key] = int(params[key])
    return params, uploads


async def _get_updates(state: FakeTelegramState, params: dict[str, Any]) -> web.Response:
    if state.webhook:
        return error(
            409,
            "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to "
            "delete the webhook first",
        )
    offset, limit, timeout = params.get("offset"), params.get("limit", 100), params.get("timeout", 0)
    if not isinstance(limit, int) or not isinstance(timeout, int) or not (offset is None or isinstance(offset, int)):
        return error(400, "Bad Request: wrong parameter in getUpdates")
    found = await state.get_updates(offset, limit, min(float(timeout), 50.0))
    if found is None:
        return error(
            409, "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
        )
    return ok(found)


async def _api(request: web.Request) -> web.Response:
    state = request.app[FAKE_STATE]
    method = request.match_info["method"]
    try:
        params, uploads = await _params(request)
    except ValueError:
        state.record(method, {}, 400)
        return error(400, "Bad Request: invalid request body")
    if state.token is not None and request.match_info["token"] != state.token:
        state.record(method, params, 401)
        return error(401, "Unauthorized")
    if method not in METHODS:
        state.record(method, params, 404)
        return error(404, "Not Found")
    planned = state.planned(method)
    if planned is not None and planned.delay:
        await asyncio.sleep(planned.delay)
    elif planned is not None:
        state.record(method, params, planned.status)
        if planned.retry_after is None:
            return error(planned.status, planned.description)
        seconds = int(planned.retry_after) if float(planned.retry_after).is_integer() else planned.retry_after
        return error(planned.status, planned.description, retry_after=seconds)
    if method == "getUpdates":
        response = await _get_updates(state, params)
    else:
        response = perform(state, method, params, uploads)
    state.record(method, params, response.status)
    return response


async def _download(request: web.Request) -> web.StreamResponse:
    state = request.app[FAKE_STATE]
    if state.token is not None and request.match_info["token"] != state.token:
        return error(401, "Unauthorized")
    path = request.match_info["path"]
    stored = next((f for f in state.stored.values() if f.file_path == path), None)
    if stored is None:
        return error(404, "Not Found")
    return web.Response(body=stored.content, content_type="application/octet-stream")


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
            and chat_matches(c, chat_id)
        ]

    deadline = time.monotonic() + wait
    found = matching()
    while not found and time.monotonic() < deadline:
        try:
            await state.changed(deadline - time.monotonic())
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
    app.router.add_get("/file/bot{token}/{path:.+}", _download)
    app.router.add_get("/_fake/calls", _calls)
    app.router.add_post("/_fake/rate_limit", _rate_limit)
    return app


class FakeTelegram(FakeServer):
    """Runs the fake on a loopback port: ``base_url = await fake.start()`` is the Bot API root to configure.

    It answers ``/bot<token>/<method>`` (JSON, form or query parameters) for ``getMe``, ``sendMessage``,
    ``editMessageText``, ``sendMessageDraft``, ``answerCallbackQuery``, ``sendChatAction``, ``getFile``,
    ``getUpdates`` (a long poll over a queue of updates: :meth:`FakeTelegram.push_update`), ``setWebhook``,
    ``deleteWebhook`` and ``getWebhookInfo``, and ``sendDocument`` / ``sendPhoto`` / ``sendVoice`` as
    ``multipart/form-data`` uploads (the file's name, type, size and bytes are kept in
    :attr:`FakeTelegramState.files`; the recorded call shows name, type and size); files are downloaded from
    ``/file/bot<token>/<file_path>``. Telegram's error shapes: 401 for a wrong token, 404 for an unknown method, 400
    for what Telegram refuses (see
    :mod:`~switchboard.channels.telegram.fake.methods`), 409 for a second ``getUpdates`` running at once or one while a
    webhook is set, 413 for a file over 50 MB, and, when told to, 429 with ``retry_after``, any other status (5xx),
    or a slow answer.
    Inspection routes serve ``switchboard simulate`` and the benchmarks:

    - ``GET /_fake/calls?since=<seq>&chat_id=<id>&method=sendMessage&wait=<s>`` → recorded successful calls
      (add ``include_failed=1`` for refused ones); ``wait`` long-polls until one matches;
    - ``POST /_fake/rate_limit`` with ``{"count": N, "retry_after": S, "method": "sendMessage"}``.
    """

    def __init__(self, token: str | None = None, *, username: str = "switchboard_test_bot") -> None:
        self.app = create_fake_telegram(token, username=username)
        self.state = self.app[FAKE_STATE]

    @property
    def calls(self) -> list[FakeCall]:
        """Every call received, in order."""
        return self.state.calls

    @property
    def files(self) -> list[FakeFile]:
        """Every file received with ``sendDocument`` / ``sendPhoto`` / ``sendVoice``, in order."""
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

    def delay_next(self, count: int, seconds: float, *, method: str | None = None) -> None:
        """Answer the next ``count`` calls (of ``method``, or any) only after ``seconds``."""
        self.state.delay_next(count, seconds, method=method)

    def sent(self, chat_id: int | str | None = None, method: str = "sendMessage") -> list[FakeCall]:
        """Successful calls of ``method``, optionally for one chat."""
        return self.state.sent(chat_id, method)

    def push_update(self, update: dict[str, Any]) -> int:
        """Queue an ``Update`` for ``getUpdates`` (long polling); returns its ``update_id``."""
        return self.state.push_update(update)

    def store_file(self, content: bytes, *, name: str = "file.bin", reported_size: int | None = -1) -> StoredFile:
        """Make ``content`` fetchable with ``getFile`` (as a file a user sent); -1 reports its true size."""
        return self.state.store_file(content, name=name, reported_size=reported_size)

    def press_button(self, chat_id: int, message_id: int, callback_data: str, update_id: int) -> dict[str, Any]:
        """The ``callback_query`` update Telegram sends when the chat's user taps a button of a message the bot sent.

        Raises:
            KeyError: no such message, or it has no button with that ``callback_data``.
        """
        markup = self.state.markups[(chat_id, message_id)]
        buttons = [b for row in markup["inline_keyboard"] for b in row if b.get("callback_data") == callback_data]
        if not buttons:
            raise KeyError(callback_data)
        text = self.state.messages[(chat_id, message_id)]
        message = {"message_id": message_id, "text": text, "reply_markup": markup}
        return make_callback_query(
            callback_data, chat_id=chat_id, update_id=update_id, message=message, bot=self.state.bot
        )

    async def closing(self) -> None:
        """Long polls waiting for updates end at once."""
        self.state.end_polls()
