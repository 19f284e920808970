"""Outbound webhooks against a real receiving HTTP server on loopback: signatures, retries, dead letters, dedup, SSRF.

Events come from the sessions' real event logs (messages ingested by the real ingest script; a worker's facts written
by the real fenced script).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestServer

from switchboard.core.events import ReplySent
from switchboard.errors import ConfigError
from switchboard.outbound.webhooks import SIGNATURE_HEADER, WebhookDispatcher, escaped_tenant, verify_signature
from switchboard.queue.eventlog import EventLog
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import GlobalKeys
from switchboard.queue.lease import Lease
from switchboard.settings import QueueSettings
from switchboard.settings.api import WebhookEndpoint, WebhookSettings
from tests.queue.conftest import make_message

SECRET = "whsec_test-secret"
ENV = {"HOOK_SECRET": SECRET}
FAST = WebhookSettings(poll_s=0.05, timeout_s=2.0, max_attempts=4, backoff_s=0.0, max_backoff_s=0.0)
_GLOBAL = GlobalKeys()


@dataclass
class Receiver:
    """A real HTTP server recording what it received; answers the statuses in ``script`` first, then 200."""

    script: list[int] = field(default_factory=list)
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append((dict(request.headers), await request.read()))
        return web.Response(status=self.script.pop(0) if self.script else 200)

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.received]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    found = Receiver()
    app = web.Application()
    app.router.add_post("/hooks", found.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    found.url = str(server.make_url("/hooks"))
    yield found
    await server.close()


def endpoint(
    url: str, *, events: tuple[str, ...] = ("message_received",), allow: tuple[str, ...] = ("127.0.0.0/8",)
) -> WebhookEndpoint:
    return WebhookEndpoint.model_validate(
        {"tenant": "default", "url": url, "events": events, "secret_env": "HOOK_SECRET", "allow_networks": allow}
    )


def dispatcher(
    redis: aioredis.Redis, *endpoints: WebhookEndpoint, settings: WebhookSettings = FAST
) -> WebhookDispatcher:
    return WebhookDispatcher(redis, endpoints, settings, ENV, owner="test-worker")


async def ingest(redis: aioredis.Redis, text: str, conversation: str = "c1") -> None:
    await Ingestor(redis, QueueSettings()).ingest(make_message(text, conversation=conversation))


async def passes(hooks: WebhookDispatcher, count: int) -> None:
    for _ in range(count):
        await hooks.run_once()


async def test_an_event_is_posted_signed_over_timestamp_and_raw_body(
    async_redis: aioredis.Redis, receiver: Receiver
) -> None:
    hooks = dispatcher(async_redis, endpoint(receiver.url))
    await hooks.run_once()  # delivery starts now: earlier events are not sent
    await ingest(async_redis, "hello")

    await hooks.run_once()
    await hooks.close()

    [(headers, raw)] = receiver.received
    body = json.loads(raw)
    assert body["type"] == "message_received" and body["tenant"] == "default"
    assert body["session"] == "default/assistant/telegram/default/c1" and body["data"]["chars"] == 5
    assert headers["Switchboard-Event-Id"] == body["id"] and body["id"].startswith("evt_")
    signature = headers[SIGNATURE_HEADER]
    timestamp = signature.split(",")[0].removeprefix("t=")
    expected = hmac.new(SECRET.encode(), f"{timestamp}.".encode() + raw, hashlib.sha256).hexdigest()
    assert signature == f"t={timestamp},v1={expected}"
    assert verify_signature(SECRET.encode(), signature, raw)
    assert not verify_signature(b"another secret", signature, raw)
    assert not verify_signature(SECRET.encode(), signature, raw + b" ")


async def test_a_failing_receiver_gets_the_same_event_again_until_it_answers_200(
    async_redis: aioredis.Redis, receiver: Receiver
) -> None:
    hooks = dispatcher(async_redis, endpoint(receiver.url))
    await hooks.run_once()
    await ingest(async_redis, "hello")
    receiver.script = [500, 500]

    await passes(hooks, 5)
    await hooks.close()

    assert len(receiver.received) == 3  # 500, 500, then 200: and nothing after it
    ids = {headers["Switchboard-Event-Id"] for headers, _ in receiver.received}
    assert len(ids) == 1
    assert all(verify_signature(SECRET.encode(), h[SIGNATURE_HEADER], b) for h, b in receiver.received)
    escaped = escaped_tenant("default")
    assert await async_redis.zcard(_GLOBAL.webhook_due(escaped)) == 0
    assert await async_redis.xlen(_GLOBAL.webhook_dead(escaped)) == 0


async def test_backoff_waits_longer_after_each_failure(async_redis: aioredis.Redis, receiver: Receiver) -> None:
    slow = FAST.model_copy(update={"backoff_s": 100.0, "max_backoff_s": 1000.0})
    hooks = dispatcher(async_redis, endpoint(receiver.url), settings=slow)
    await hooks.run_once()
    await ingest(async_redis, "hello")
    receiver.script = [503]

    await passes(hooks, 3)
    await hooks.close()

    assert len(receiver.received) == 1  # the retry is not due for 50-100 s
    [(_, due)] = await async_redis.zrange(_GLOBAL.webhook_due(escaped_tenant("default")), 0, -1, withscores=True)
    assert 45 <= due - time.time() <= 100


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_a_delivery_out_of_attempts_is_dead_lettered_and_visible(
    async_redis: aioredis.Redis, receiver: Receiver, status: int
) -> None:
    hooks = dispatcher(async_redis, endpoint(receiver.url))
    await hooks.run_once()
    await ingest(async_redis, "hello")
    receiver.script = [status] * 10

    await passes(hooks, 8)
    await hooks.close()

    assert len(receiver.received) == FAST.max_attempts
    [(_, dead)] = await async_redis.xrange(_GLOBAL.webhook_dead(escaped_tenant("default")))
    fields = {k.decode(): v.decode() for k, v in dead.items()}
    assert fields["reason"] == f"http_{status}" and fields["attempts"] == str(FAST.max_attempts)
    assert fields["type"] == "message_received" and fields["url"] == receiver.url


async def test_a_client_error_is_dead_lettered_at_once(async_redis: aioredis.Redis, receiver: Receiver) -> None:
    hooks = dispatcher(async_redis, endpoint(receiver.url))
    await hooks.run_once()
    await ingest(async_redis, "hello")
    receiver.script = [410]

    await passes(hooks, 3)
    await hooks.close()

    assert len(receiver.received) == 1
    assert await async_redis.xlen(_GLOBAL.webhook_dead(escaped_tenant("default"))) == 1


async def test_each_event_is_delivered_once_per_url_even_when_read_again(
    async_redis: aioredis.Redis, receiver: Receiver
) -> None:
    hooks = dispatcher(async_redis, endpoint(receiver.url), endpoint(receiver.url.replace("/hooks", "/hooks?copy=1")))
    await hooks.run_once()
    await ingest(async_redis, "one")
    await ingest(async_redis, "two", conversation="c2")
    await passes(hooks, 2)
    await async_redis.hdel(_GLOBAL.webhook_cursors(escaped_tenant("default")), "default/assistant/telegram/default/c1")

    await passes(hooks, 2)  # the lost cursor makes c1's log be read again: its event is not queued again
    await hooks.close()

    ids = [body["id"] for body in receiver.bodies()]
    assert len(ids) == 4 and len(set(ids)) == 2  # two events, each to both URLs, once


async def test_only_the_subscribed_kinds_of_the_tenants_own_sessions_are_sent(
    async_redis: aioredis.Redis, receiver: Receiver
) -> None:
    hooks = dispatcher(async_redis, endpoint(receiver.url, events=("reply_sent",)))
    await hooks.run_once()
    message = make_message("hi")
    await Ingestor(async_redis, QueueSettings()).ingest(message)
    other = make_message("hi").model_copy(deep=True)
    other = other.model_copy(update={"conversation": other.conversation.model_copy(update={"tenant": "other"})})
    await Ingestor(async_redis, QueueSettings()).ingest(other)
    for session in (message.session_key, other.session_key):
        lease = await Lease(async_redis, worker_id="w", lease_ms=60_000).acquire(session)
        assert lease is not None
        await EventLog(async_redis, lease, maxlen=100).append(ReplySent(message_id="m", chars=2))

    await passes(hooks, 2)
    await hooks.close()

    assert [(b["type"], b["session"]) for b in receiver.bodies()] == [("reply_sent", message.session_key)]


@pytest.mark.parametrize(
    ("url", "allow", "reason"),
    [
        ("http://127.0.0.1:{port}/hooks", (), "address_refused:loopback"),
        ("http://localhost:{port}/hooks", (), "address_refused:loopback"),
        ("http://[::ffff:127.0.0.1]:{port}/hooks", (), "address_refused:loopback_mapped"),
        ("http://169.254.169.254/latest/meta-data", ("169.254.0.0/16",), "address_refused:metadata"),
        ("http://10.1.2.3:{port}/hooks", ("127.0.0.0/8",), "address_refused:private"),
    ],
    ids=["loopback", "localhost", "mapped", "metadata", "private"],
)
async def test_private_addresses_are_refused_unless_allowed(
    async_redis: aioredis.Redis, receiver: Receiver, url: str, allow: tuple[str, ...], reason: str
) -> None:
    port = receiver.url.split(":")[2].split("/")[0]
    hooks = dispatcher(async_redis, endpoint(url.format(port=port), allow=allow))
    await hooks.run_once()
    await ingest(async_redis, "hello")

    await passes(hooks, 2)
    await hooks.close()

    assert receiver.received == []
    [(_, dead)] = await async_redis.xrange(_GLOBAL.webhook_dead(escaped_tenant("default")))
    assert dead[b"reason"].decode() == reason


def test_a_secret_env_that_is_not_set_stops_the_start() -> None:
    with pytest.raises(ConfigError, match="HOOK_SECRET, which is not set"):
        WebhookDispatcher(None, [endpoint("https://example.com/h")], FAST, {}, owner="w")  # type: ignore[arg-type]
