"""The fake Telegram Bot API itself: it serves the tests, `switchboard simulate` and the benchmarks, so it must
answer what Telegram answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.channels.test_telegram import BOT, SECRET, TOKEN
from tests.fakes.telegram_api import SECRET_HEADER, FakeTelegram, make_update, sign_update


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_fake_answers_with_telegrams_error_shapes(fake: FakeTelegram, http: aiohttp.ClientSession) -> None:
    async with http.post(f"{fake.base_url}/bot999:nope/getMe") as resp:
        assert resp.status == 401
        assert await resp.json() == {"ok": False, "error_code": 401, "description": "Unauthorized"}
    async with http.post(f"{fake.base_url}/bot{TOKEN}/sendTelepathy") as resp:
        assert resp.status == 404
        assert await resp.json() == {"ok": False, "error_code": 404, "description": "Not Found"}
    fake.fail_next(1, retry_after=7)
    async with http.post(f"{fake.base_url}/bot{TOKEN}/getMe") as resp:
        assert resp.status == 429
        assert await resp.json() == {
            "ok": False,
            "error_code": 429,
            "description": "Too Many Requests: retry after 7",
            "parameters": {"retry_after": 7},
        }
    async with http.get(f"{fake.base_url}/bot{TOKEN}/getMe") as resp:
        me = await resp.json()
    assert me["result"]["username"] == BOT and me["result"]["id"] == 123456
    assert [(c.method, c.status) for c in fake.calls] == [
        ("getMe", 401),
        ("sendTelepathy", 404),
        ("getMe", 429),
        ("getMe", 200),
    ]


async def test_fake_send_message_accepts_json_and_form_bodies(fake: FakeTelegram, http: aiohttp.ClientSession) -> None:
    url = f"{fake.base_url}/bot{TOKEN}/sendMessage"
    async with http.post(url, json={"chat_id": 42, "text": "<b>hi</b>", "parse_mode": "HTML"}) as resp:
        first = (await resp.json())["result"]
    form = {"chat_id": "42", "text": "plain", "reply_parameters": json.dumps({"message_id": 3})}
    async with http.post(url, data=form) as resp:
        second = (await resp.json())["result"]
    assert (first["message_id"], second["message_id"]) == (1, 2)
    assert first["chat"] == {"id": 42, "type": "private"} and first["text"] == "hi" and first["from"]["is_bot"]
    assert isinstance(first["date"], int)
    assert fake.sent(42)[1].params == {"chat_id": 42, "text": "plain", "reply_parameters": {"message_id": 3}}


@pytest.mark.parametrize(
    ("params", "description"),
    [
        ({"text": "<script>alert(1)</script>", "parse_mode": "HTML"}, 'Unsupported start tag "script"'),
        ({"text": "1 < 2", "parse_mode": "HTML"}, "Unescaped"),
        ({"text": "<b>open", "parse_mode": "HTML"}, "Can't find end tag"),
        ({"text": "<b><i>x</b></i>", "parse_mode": "HTML"}, "Can't find end tag"),
        ({"text": "&nbsp;x", "parse_mode": "HTML"}, "Unsupported HTML entity"),
        ({"text": "<a href='https://x.y'><code>x</code></a>", "parse_mode": "HTML"}, "inside a link"),
        ({"text": "x" * 4097}, "message is too long"),
        ({"text": "  "}, "message text is empty"),
    ],
)
async def test_fake_refuses_what_telegram_refuses(
    fake: FakeTelegram, http: aiohttp.ClientSession, params: dict[str, Any], description: str
) -> None:
    async with http.post(f"{fake.base_url}/bot{TOKEN}/sendMessage", json={"chat_id": 1, **params}) as resp:
        body = await resp.json()
    assert resp.status == 400 and body["ok"] is False and description in body["description"]
    assert fake.sent(1) == []


async def test_fake_counts_length_after_entity_parsing(fake: FakeTelegram, http: aiohttp.ClientSession) -> None:
    text = "<b>" + "&amp;" * 4096 + "</b>"
    async with http.post(
        f"{fake.base_url}/bot{TOKEN}/sendMessage", json={"chat_id": 1, "text": text, "parse_mode": "HTML"}
    ) as resp:
        assert resp.status == 200


async def test_fake_edits_messages(fake: FakeTelegram, http: aiohttp.ClientSession) -> None:
    base = f"{fake.base_url}/bot{TOKEN}"
    async with http.post(f"{base}/sendMessage", json={"chat_id": 5, "text": "draft"}) as resp:
        message_id = (await resp.json())["result"]["message_id"]
    async with http.post(
        f"{base}/editMessageText", json={"chat_id": 5, "message_id": message_id, "text": "final"}
    ) as resp:
        assert resp.status == 200 and (await resp.json())["result"]["text"] == "final"
    async with http.post(
        f"{base}/editMessageText", json={"chat_id": 5, "message_id": message_id, "text": "final"}
    ) as resp:
        assert resp.status == 400 and "message is not modified" in (await resp.json())["description"]
    async with http.post(f"{base}/editMessageText", json={"chat_id": 5, "message_id": 999, "text": "x"}) as resp:
        assert resp.status == 400 and "message to edit not found" in (await resp.json())["description"]


async def test_fake_webhook_methods(fake: FakeTelegram, http: aiohttp.ClientSession) -> None:
    base = f"{fake.base_url}/bot{TOKEN}"
    async with http.post(f"{base}/setWebhook", data={"url": "https://h/webhooks/telegram", "secret_token": "abc"}):
        pass
    async with http.post(f"{base}/getWebhookInfo") as resp:
        assert (await resp.json())["result"]["url"] == "https://h/webhooks/telegram"
    async with http.post(f"{base}/deleteWebhook") as resp:
        assert (await resp.json())["result"] is True
    async with http.post(f"{base}/getWebhookInfo") as resp:
        assert (await resp.json())["result"]["url"] == ""


async def test_fake_inspection_routes(fake: FakeTelegram, http: aiohttp.ClientSession) -> None:
    base = f"{fake.base_url}/bot{TOKEN}"
    for chat, text in [(1, "a"), (2, "b"), (1, "c")]:
        async with http.post(f"{base}/sendMessage", json={"chat_id": chat, "text": text}):
            pass
    async with http.get(f"{fake.base_url}/_fake/calls", params={"chat_id": "1"}) as resp:
        calls = await resp.json()
    assert [(c["seq"], c["method"], c["params"]["text"]) for c in calls] == [
        (1, "sendMessage", "a"),
        (3, "sendMessage", "c"),
    ]
    async with http.get(f"{fake.base_url}/_fake/calls", params={"since": "1"}) as resp:
        assert [c["params"]["text"] for c in await resp.json()] == ["b", "c"]

    async def later() -> None:
        async with http.post(f"{base}/sendMessage", json={"chat_id": 9, "text": "late"}):
            pass

    waiting = asyncio.ensure_future(http.get(f"{fake.base_url}/_fake/calls", params={"chat_id": "9", "wait": "20"}))
    await asyncio.sleep(0)
    await later()
    async with await waiting as resp:
        assert [c["params"]["text"] for c in await resp.json()] == ["late"]

    async with http.post(f"{fake.base_url}/_fake/rate_limit", json={"count": 1, "retry_after": 4}) as resp:
        assert resp.status == 200
    async with http.post(f"{base}/sendMessage", json={"chat_id": 9, "text": "x"}) as resp:
        assert resp.status == 429 and (await resp.json())["parameters"] == {"retry_after": 4}
    async with http.get(f"{fake.base_url}/_fake/calls", params={"chat_id": "9", "include_failed": "1"}) as resp:
        assert [c["status"] for c in await resp.json()] == [200, 429]


def test_sign_update_is_what_telegram_sends() -> None:
    update = make_update("héllo", chat_id=-5, update_id=77, chat_type="group", mention=BOT, thread_id=3)
    body, headers = sign_update(update, SECRET)
    assert json.loads(body) == update
    assert headers == {"Content-Type": "application/json", SECRET_HEADER: SECRET}
    message = update["message"]
    assert message["text"] == f"@{BOT} héllo"
    assert message["entities"] == [{"type": "mention", "offset": 0, "length": len(BOT) + 1}]
    assert message["message_thread_id"] == 3 and message["is_topic_message"] is True


async def test_fake_checks_keyboards_drafts_and_callback_answers(
    fake: FakeTelegram, http: aiohttp.ClientSession
) -> None:
    base = f"{fake.base_url}/bot{TOKEN}"
    too_long = {"inline_keyboard": [[{"text": "x", "callback_data": "é" * 33}]]}  # 66 bytes
    async with http.post(f"{base}/sendMessage", json={"chat_id": 5, "text": "?", "reply_markup": too_long}) as resp:
        assert resp.status == 400 and "BUTTON_DATA_INVALID" in (await resp.json())["description"]
    async with http.post(f"{base}/sendMessageDraft", json={"chat_id": -100, "draft_id": 1, "text": "x"}) as resp:
        assert resp.status == 400  # drafts only in private chats
    async with http.post(f"{base}/sendMessageDraft", json={"chat_id": 5, "draft_id": 0, "text": "x"}) as resp:
        assert resp.status == 400  # draft_id must be non-zero
    async with http.post(f"{base}/sendMessageDraft", json={"chat_id": 5, "draft_id": 9, "text": ""}) as resp:
        assert resp.status == 200  # an empty draft shows "Thinking…"
    async with http.post(f"{base}/answerCallbackQuery", json={"callback_query_id": "q1", "text": "ok"}) as resp:
        assert resp.status == 200
    async with http.post(f"{base}/answerCallbackQuery", json={"callback_query_id": "q1"}) as resp:
        assert resp.status == 400 and "query is too old" in (await resp.json())["description"]
    assert fake.state.drafts == [(5, 9, "")] and fake.state.answered == {"q1": "ok"}


async def test_fake_get_updates_long_polls_confirms_and_conflicts(
    fake: FakeTelegram, http: aiohttp.ClientSession
) -> None:
    base = f"{fake.base_url}/bot{TOKEN}"
    fake.push_update(make_update("a", chat_id=1, update_id=10))
    async with http.post(f"{base}/getUpdates", json={"timeout": 0}) as resp:
        assert [u["update_id"] for u in (await resp.json())["result"]] == [10]
    async with http.post(f"{base}/getUpdates", json={"offset": 10, "timeout": 0}) as resp:
        assert [u["update_id"] for u in (await resp.json())["result"]] == [10]  # not confirmed yet: again
    waiting = asyncio.ensure_future(http.post(f"{base}/getUpdates", json={"offset": 11, "timeout": 20}))
    await asyncio.sleep(0.1)
    fake.push_update(make_update("b", chat_id=1, update_id=11))
    async with await waiting as resp:
        assert [u["update_id"] for u in (await resp.json())["result"]] == [11]
    assert fake.state.confirmed == 11
    first = asyncio.ensure_future(http.post(f"{base}/getUpdates", json={"offset": 12, "timeout": 20}))
    await asyncio.sleep(0.1)
    async with http.post(f"{base}/getUpdates", json={"offset": 12, "timeout": 0}) as second:
        assert second.status == 200
    async with await first as resp:
        assert resp.status == 409 and "terminated by other getUpdates" in (await resp.json())["description"]
    assert fake.state.max_polls_in_flight == 2
    fake.state.webhook = {"url": "https://x.example/hook"}
    async with http.post(f"{base}/getUpdates", json={"timeout": 0}) as resp:
        assert resp.status == 409 and "webhook is active" in (await resp.json())["description"]


async def test_fake_serves_files_and_slow_answers(fake: FakeTelegram, http: aiohttp.ClientSession) -> None:
    stored = fake.store_file(b"bytes of a photo", name="p.jpg")
    async with http.post(f"{fake.base_url}/bot{TOKEN}/getFile", json={"file_id": stored.file_id}) as resp:
        info = (await resp.json())["result"]
    assert info["file_size"] == 16 and info["file_path"] == stored.file_path
    async with http.get(f"{fake.base_url}/file/bot{TOKEN}/{info['file_path']}") as resp:
        assert await resp.read() == b"bytes of a photo"
    async with http.get(f"{fake.base_url}/file/botWRONG/{info['file_path']}") as resp:
        assert resp.status == 401
    fake.delay_next(1, 0.2, method="getMe")
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with http.post(f"{fake.base_url}/bot{TOKEN}/getMe") as resp:
        assert resp.status == 200
    assert loop.time() - started >= 0.2  # the fake's own delay, not a threshold on the code under test
