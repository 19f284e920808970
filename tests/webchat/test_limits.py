"""Abuse limits through the real app: 429 with Retry-After and nothing written; platforms 200 with the drop logged."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from switchboard.channels.telegram.fake.platform import FakeTelegram, make_update, sign_update
from switchboard.core.events import EventAdapter, MessageDropped
from switchboard.queue.connection import async_client
from switchboard.settings import LimitsSettings, load_settings
from switchboard.web.app import create_app

SECRET = "webhook_secret-123"
MakeClient = Callable[..., Awaitable[TestClient[Any, Any]]]
_OFF = {f"SWITCHBOARD_LIMITS__{name.upper()}": "0" for name in LimitsSettings.model_fields}


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = async_client(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def gateway(base_env: dict[str, str], aiohttp_client: Any) -> MakeClient:
    """A factory of real apps on the suite's Redis: every limit off unless the test sets it."""

    async def make(**env: str) -> TestClient[Any, Any]:
        return await aiohttp_client(create_app(load_settings(base_env | _OFF | env)))  # type: ignore[no-any-return]

    return make


async def _xrange(redis: aioredis.Redis, key: Any) -> list[Any]:
    entries: list[Any] = await redis.xrange(key)  # type: ignore[assignment]
    return entries


async def _dump(redis: aioredis.Redis) -> dict[Any, Any]:
    return {key: await redis.dump(key) for key in sorted(await redis.keys("*"))}


async def _new_session(client: TestClient[Any, Any], **headers: str) -> ClientResponse:
    return await client.post("/api/chat/sessions", headers=headers)


async def _token(client: TestClient[Any, Any]) -> str:
    resp = await _new_session(client)
    assert resp.status == 201, await resp.text()
    return str((await resp.json())["token"])


async def _post(client: TestClient[Any, Any], token: str, text: str) -> ClientResponse:
    return await client.post("/api/chat/messages", json={"text": text}, headers={"Authorization": f"Bearer {token}"})


async def _assert_limited(resp: ClientResponse) -> None:
    assert resp.status == 429, await resp.text()
    assert int(resp.headers["Retry-After"]) >= 1
    assert (await resp.json())["error"]["code"] == "rate_limited"


async def test_messages_over_the_session_rate_get_429_and_write_nothing(
    gateway: MakeClient, redis_client: aioredis.Redis
) -> None:
    client = await gateway(SWITCHBOARD_LIMITS__MESSAGES_PER_SESSION_PER_MINUTE="2")
    token = await _token(client)
    for i in range(2):
        assert (await _post(client, token, f"m{i}")).status == 202
    before = await _dump(redis_client)
    resp = await _post(client, token, "one too many")
    await _assert_limited(resp)
    assert int(resp.headers["Retry-After"]) <= 30
    assert await _dump(redis_client) == before
    metrics = await (await client.get("/metrics")).text()
    assert 'switchboard_requests_rejected_total{channel="web",reason="rate_limited"} 1.0' in metrics


async def test_a_full_inbox_gets_429_and_writes_nothing(gateway: MakeClient, redis_client: aioredis.Redis) -> None:
    client = await gateway(SWITCHBOARD_LIMITS__INBOX_DEPTH="1")
    token = await _token(client)
    assert (await _post(client, token, "waiting")).status == 202
    before = await _dump(redis_client)
    await _assert_limited(await _post(client, token, "no room"))
    assert await _dump(redis_client) == before


async def test_sessions_per_address_get_429_and_write_nothing(
    gateway: MakeClient, redis_client: aioredis.Redis
) -> None:
    client = await gateway(SWITCHBOARD_LIMITS__SESSIONS_PER_ADDRESS_PER_HOUR="2")
    for _ in range(2):
        assert (await _new_session(client)).status == 201
    before = await _dump(redis_client)
    resp = await _new_session(client)
    await _assert_limited(resp)
    assert int(resp.headers["Retry-After"]) > 60  # two an hour: the next one is half an hour away
    assert await _dump(redis_client) == before


async def test_forwarded_for_from_an_untrusted_peer_is_ignored(gateway: MakeClient) -> None:
    client = await gateway(SWITCHBOARD_LIMITS__SESSIONS_PER_ADDRESS_PER_HOUR="1")
    assert (await _new_session(client, **{"X-Forwarded-For": "203.0.113.1"})).status == 201
    await _assert_limited(await _new_session(client, **{"X-Forwarded-For": "203.0.113.2"}))


async def test_forwarded_for_from_a_trusted_proxy_names_the_client(gateway: MakeClient) -> None:
    client = await gateway(
        SWITCHBOARD_LIMITS__SESSIONS_PER_ADDRESS_PER_HOUR="1", SWITCHBOARD_TRUSTED_PROXIES="127.0.0.1,::1"
    )
    assert (await _new_session(client, **{"X-Forwarded-For": "203.0.113.1"})).status == 201
    assert (await _new_session(client, **{"X-Forwarded-For": "203.0.113.2"})).status == 201
    await _assert_limited(await _new_session(client, **{"X-Forwarded-For": "203.0.113.1"}))
    # a client prepending a fresh address of its own is still counted by the hop the proxy saw
    await _assert_limited(await _new_session(client, **{"X-Forwarded-For": "198.51.100.77, 203.0.113.2"}))


async def test_two_app_instances_share_the_counters(gateway: MakeClient) -> None:
    env = {
        "SWITCHBOARD_LIMITS__SESSIONS_PER_ADDRESS_PER_HOUR": "2",
        "SWITCHBOARD_LIMITS__MESSAGES_PER_SESSION_PER_MINUTE": "1",
    }
    one, two = await gateway(**env), await gateway(**env)
    token = await _token(one)
    assert (await _new_session(two)).status == 201
    await _assert_limited(await _new_session(one))
    await _assert_limited(await _new_session(two))
    assert (await _post(two, token, "first")).status == 202
    await _assert_limited(await _post(one, token, "second"))


async def test_limits_of_zero_are_off(gateway: MakeClient, redis_client: aioredis.Redis) -> None:
    client = await gateway()
    tokens = [await _token(client) for _ in range(3)]
    statuses = [(await _post(client, tokens[0], f"m{i}")).status for i in range(120)]
    assert statuses == [202] * 120
    assert not await redis_client.keys("sb:rate:*") and not await redis_client.keys("*:rate")


async def test_a_platform_sender_over_its_rate_gets_200_and_the_drop_is_recorded(
    gateway: MakeClient, redis_client: aioredis.Redis
) -> None:
    fake = FakeTelegram(token="42:test")
    await fake.start()
    try:
        client = await gateway(
            SWITCHBOARD_LIMITS__MESSAGES_PER_SENDER_PER_MINUTE="1",
            SWITCHBOARD_TELEGRAM__BOT_TOKEN="42:test",
            SWITCHBOARD_TELEGRAM__SECRET_TOKEN=SECRET,
            SWITCHBOARD_TELEGRAM__API_BASE_URL=fake.base_url,
        )
        first_body, headers = sign_update(make_update("hi", chat_id=5, update_id=1, user_id=77), SECRET)
        assert (await client.post("/webhooks/telegram", data=first_body, headers=headers)).status == 200
        inboxes = await redis_client.keys("sb:*:inbox")
        queued = {key: await redis_client.lrange(key, 0, -1) for key in inboxes}
        drains = {key: await redis_client.lrange(key, 0, -1) for key in await redis_client.keys("sb:*:drainq")}
        # the same user in another chat: over the per-sender rate
        body, headers = sign_update(make_update("again", chat_id=6, update_id=2, user_id=77), SECRET)
        resp = await client.post("/webhooks/telegram", data=body, headers=headers)
        assert resp.status == 200
        assert {key: await redis_client.lrange(key, 0, -1) for key in await redis_client.keys("sb:*:inbox")} == queued
        assert {key: await redis_client.lrange(key, 0, -1) for key in await redis_client.keys("sb:*:drainq")} == drains
        logs = {}
        for key in await redis_client.keys("sb:*:events"):
            logs[key] = [EventAdapter.validate_json(f[b"data"]) for _id, f in await _xrange(redis_client, key)]
        dropped = [facts for facts in logs.values() if any(isinstance(f, MessageDropped) for f in facts)]
        assert len(logs) == 2 and len(dropped) == 1 and len(dropped[0]) == 1  # chat 6's log holds only the drop
        fact = dropped[0][0]
        assert isinstance(fact, MessageDropped)
        assert (fact.reason, fact.channel, fact.sender) == ("sender_rate", "telegram", "77")
        # the platform's retry of the accepted update is still a duplicate, not a drop
        retry = await client.post("/webhooks/telegram", data=first_body, headers=headers)
        assert retry.status == 200
        metrics = await (await client.get("/metrics")).text()
        assert 'switchboard_requests_rejected_total{channel="telegram",reason="rate_limited"} 1.0' in metrics
        assert 'switchboard_messages_accepted_total{channel="telegram"} 1.0' in metrics
        assert 'switchboard_messages_deduplicated_total{channel="telegram"} 1.0' in metrics
    finally:
        await fake.stop()
