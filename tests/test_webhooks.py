"""The webhook route through the real app: acknowledged means durably queued; bad input changes nothing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
from aiohttp import web
from aiohttp.test_utils import TestClient

from switchboard.channels.base import HttpAnswer
from switchboard.channels.telegram.fake.platform import FakeTelegram, make_update, sign_update
from switchboard.settings import load_settings
from switchboard.web import webhooks
from switchboard.web.app import create_app

SECRET = "webhook_secret-123"


@pytest.fixture
async def fake_tg() -> AsyncIterator[FakeTelegram]:
    fake = FakeTelegram(token="42:test")
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def client(base_env: dict[str, str], fake_tg: FakeTelegram, aiohttp_client: Any) -> TestClient:
    env = base_env | {
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": "42:test",
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": fake_tg.base_url,
        "SWITCHBOARD_QUEUE__INGEST_TIMEOUT_S": "1.0",
    }
    return await aiohttp_client(create_app(load_settings(env)))  # type: ignore[no-any-return]


def _snapshot(r: redis.Redis) -> list[bytes]:
    return sorted(r.keys("*"))


async def test_valid_update_is_queued_once_and_retry_is_deduplicated(
    client: TestClient, sync_redis: redis.Redis
) -> None:
    body, headers = sign_update(make_update("hello", chat_id=5, update_id=1001), SECRET)
    first = await client.post("/webhooks/telegram", data=body, headers=headers)
    assert first.status == 200
    inboxes = sync_redis.keys("sb:*:inbox")
    assert len(inboxes) == 1 and sync_redis.llen(inboxes[0]) == 1
    retry = await client.post("/webhooks/telegram", data=body, headers=headers)
    assert retry.status == 200
    assert sync_redis.llen(inboxes[0]) == 1
    metrics = await (await client.get("/metrics")).text()
    assert 'switchboard_messages_accepted_total{channel="telegram"} 1.0' in metrics
    assert 'switchboard_messages_deduplicated_total{channel="telegram"} 1.0' in metrics


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"X-Telegram-Bot-Api-Secret-Token": "wrong"}, 401),
        ({"X-Telegram-Bot-Api-Secret-Token": SECRET.upper()}, 401),
    ],
)
async def test_bad_secret_is_refused_and_writes_nothing(
    client: TestClient, sync_redis: redis.Redis, headers: dict[str, str], status: int
) -> None:
    before = _snapshot(sync_redis)
    body = json.dumps(make_update("hi", chat_id=5, update_id=7)).encode()
    resp = await client.post("/webhooks/telegram", data=body, headers=headers | {"Content-Type": "application/json"})
    assert resp.status in (401, 403)
    assert (await resp.json())["error"]["code"] == "bad_signature"
    assert _snapshot(sync_redis) == before


@pytest.mark.parametrize("body", [b"{not json", b"[]", b'{"update_id": "x"}', b"\xff\xfe"])
async def test_malformed_body_is_400_and_writes_nothing(
    client: TestClient, sync_redis: redis.Redis, body: bytes
) -> None:
    before = _snapshot(sync_redis)
    resp = await client.post("/webhooks/telegram", data=body, headers={"X-Telegram-Bot-Api-Secret-Token": SECRET})
    assert resp.status == 400
    assert _snapshot(sync_redis) == before


def _chunks(body: bytes) -> AsyncIterator[bytes]:
    """``body`` sent chunked (no ``Content-Length`` to refuse it by)."""

    async def stream() -> AsyncIterator[bytes]:
        for at in range(0, len(body), 65536):
            yield body[at : at + 65536]

    return stream()


@pytest.mark.parametrize("path", ["/webhooks/telegram", "/webhooks/telegram/default"])
@pytest.mark.parametrize("chunked", [False, True])
async def test_oversized_body_is_413_before_parsing(
    client: TestClient, sync_redis: redis.Redis, path: str, chunked: bool
) -> None:
    """On the direct plain route and the dispatched account route alike, with a ``Content-Length`` or chunked."""
    before = _snapshot(sync_redis)
    big = b'{"update_id": 1, "pad": "' + b"x" * (1024 * 1024 + 10) + b'"}'
    data: Any = _chunks(big) if chunked else big
    resp = await client.post(path, data=data, headers={"X-Telegram-Bot-Api-Secret-Token": "not-checked"})
    assert resp.status == 413
    assert (await resp.json())["error"]["code"] == "body_too_large"
    assert _snapshot(sync_redis) == before


async def test_a_chunked_update_is_accepted_like_any_other(client: TestClient, sync_redis: redis.Redis) -> None:
    body, headers = sign_update(make_update("chunked hello", chat_id=8, update_id=1003), SECRET)
    resp = await client.post("/webhooks/telegram", data=_chunks(body * 1), headers=headers)
    assert (resp.status, await resp.json()) == (200, {"ok": True})
    assert len(sync_redis.keys("sb:*:inbox")) == 1


async def test_the_plain_and_the_account_route_reach_the_same_adapter(
    client: TestClient, sync_redis: redis.Redis
) -> None:
    """``/webhooks/telegram`` (a plain route per channel of the table) is ``/webhooks/telegram/default``."""
    body, headers = sign_update(make_update("hello", chat_id=6, update_id=1002), SECRET)
    first = await client.post("/webhooks/telegram/default", data=body, headers=headers)
    assert first.status == 200 and await first.json() == {"ok": True}
    retry = await client.post("/webhooks/telegram", data=body, headers=headers)
    assert retry.status == 200
    inboxes = sync_redis.keys("sb:*:inbox")
    assert len(inboxes) == 1 and sync_redis.llen(inboxes[0]) == 1
    metrics = await (await client.get("/metrics")).text()
    assert 'switchboard_messages_deduplicated_total{channel="telegram"} 1.0' in metrics
    wrong = await client.get("/webhooks/telegram")
    assert wrong.status == 405 and wrong.headers["Allow"] == "POST"


async def test_unknown_channel_and_web_via_webhook_are_404(client: TestClient) -> None:
    for path in ("/webhooks/slack", "/webhooks/telegram/other", "/webhooks/web", "/webhooks/nosuch"):
        resp = await client.post(path, data=b"{}")
        assert resp.status == 404, path
        assert "switchboard check" in (await resp.json())["error"]["message"]


async def test_redis_not_confirming_gives_503_in_time(client: TestClient, sync_redis: redis.Redis) -> None:
    body, headers = sign_update(make_update("paused", chat_id=9, update_id=2002), SECRET)
    sync_redis.execute_command("CLIENT", "PAUSE", "3000", "WRITE")
    try:
        started = time.monotonic()
        resp = await client.post("/webhooks/telegram", data=body, headers=headers)
        elapsed = time.monotonic() - started
    finally:
        sync_redis.execute_command("CLIENT", "UNPAUSE")
    assert resp.status == 503
    assert elapsed < 2.5
    # the platform retries; the retry is accepted exactly once
    await asyncio.sleep(0.1)
    again = await client.post("/webhooks/telegram", data=body, headers=headers)
    assert again.status == 200
    assert sum(sync_redis.llen(k) for k in sync_redis.keys("sb:*:inbox")) == 1


async def test_healthz_counts_live_workers(client: TestClient, sync_redis: redis.Redis) -> None:
    resp = await client.get("/healthz")
    assert resp.status == 200
    assert await resp.json() == {"status": "ok", "redis": True, "workers": 0}
    sync_redis.zadd("sb:workers", {"w1": time.time() * 1000, "stale": (time.time() - 3600) * 1000})
    assert (await (await client.get("/healthz")).json())["workers"] == 1


async def test_a_long_channel_name_is_not_echoed_back(client: TestClient) -> None:
    resp = await client.post("/webhooks/" + "c" * 7_000, data=b"{}")
    assert resp.status == 404
    text = await resp.text()
    assert len(text) < 400 and "c" * 100 not in text


@pytest.mark.parametrize("depth", [2_000, 100_000])
async def test_a_signed_nesting_bomb_is_400_with_one_short_log_line(
    client: TestClient, sync_redis: redis.Redis, caplog: pytest.LogCaptureFixture, depth: int
) -> None:
    before = _snapshot(sync_redis)
    headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
    resp = await client.post("/webhooks/telegram", data=b"[" * depth, headers=headers)
    assert resp.status == 400
    assert [r for r in caplog.records if r.exc_info] == []
    assert len([r for r in caplog.records if r.name.startswith(("switchboard", "aiohttp"))]) <= 1
    assert _snapshot(sync_redis) == before


async def test_a_method_the_channel_does_not_take_is_405_before_the_adapter_sees_it(
    client: TestClient, sync_redis: redis.Redis
) -> None:
    before = _snapshot(sync_redis)
    resp = await client.get("/webhooks/telegram", headers={"X-Telegram-Bot-Api-Secret-Token": SECRET})
    assert resp.status == 405 and resp.headers["Allow"] == "POST"
    assert (await resp.json())["error"]["code"] == "method_not_allowed"
    assert _snapshot(sync_redis) == before


@pytest.mark.parametrize(
    ("answer", "content_type"),
    [(HttpAnswer(200, b"", None), None), (HttpAnswer(200, b'{"type":1}'), "application/json")],
)
async def test_the_adapters_answer_is_sent_as_it_is(
    aiohttp_client: Any, answer: HttpAnswer, content_type: str | None
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return webhooks._answer(request.app, request, answer)

    app = web.Application()
    app.router.add_get("/", handler)
    resp = await (await aiohttp_client(app)).get("/")
    assert resp.status == answer.status and await resp.read() == answer.body
    assert resp.headers.get("Content-Type") == content_type


async def test_a_chunked_body_over_the_cap_that_arrived_whole_is_413(
    base_env: dict[str, str], fake_tg: FakeTelegram, aiohttp_client: Any, sync_redis: redis.Redis
) -> None:
    """Head and whole chunked body in one write: the body is complete before the route reads it, and still capped."""
    env = base_env | {
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": "42:test",
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": fake_tg.base_url,
        "SWITCHBOARD_QUEUE__MAX_BODY_BYTES": "2048",
    }
    client = await aiohttp_client(create_app(load_settings(env)))
    before = _snapshot(sync_redis)
    body, _headers = sign_update(make_update("x" * 3000, chat_id=9, update_id=1004), SECRET)
    head = (
        f"POST /webhooks/telegram HTTP/1.1\r\nHost: x\r\nX-Telegram-Bot-Api-Secret-Token: {SECRET}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    writer.write(head.encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    async with asyncio.timeout(10):
        answer = await reader.read(-1)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 413 ") and b'"body_too_large"' in answer
    assert _snapshot(sync_redis) == before
