"""The tenant-tagged families run on a real cluster through redis-py's cluster client (issue #26).

Each transaction below (the access approval, the outbound webhooks' four, the MCP client removal's two steps) and
each script (the access check, the stream ticket, the open-stream caps, the sender meter) is sent through
``redis.asyncio.RedisCluster``: a cross-slot ``MULTI`` or script would be refused by the client (``CrossSlot…``) or
the server (``CROSSSLOT``). The stores are typed for ``redis.asyncio.Redis``; the cluster client is passed as is,
which is what a cluster deployment's client would do (its commands are the same).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestServer
from redis.cluster import key_slot
from redis.exceptions import RedisClusterException

from switchboard.core.events import MessageReceived
from switchboard.core.messages import session_key
from switchboard.outbound.webhooks import WebhookDispatcher, escaped_tenant
from switchboard.queue import scripts
from switchboard.queue.access import PairingStore, code_digest, new_code
from switchboard.queue.eventlog import encode_event
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.limits import issue_stream_ticket, new_stream_ticket, stream_ticket_key
from switchboard.queue.mcpclients import McpClientStore
from switchboard.queue.streamslots import StreamSlots
from switchboard.settings.api import WebhookEndpoint, WebhookSettings

pytestmark = pytest.mark.cluster

TENANT = "acme"
SESSION = session_key(TENANT, "assistant", "telegram", "bot1", "chat-4242")
G = GlobalKeys()


@pytest.fixture
async def cluster(cluster_url: str) -> AsyncIterator[Any]:
    client = aioredis.RedisCluster.from_url(cluster_url)
    yield client
    await client.aclose()


async def test_pairing_check_and_approval_run_on_the_cluster(cluster: Any) -> None:
    who = "telegram:4242"
    code = new_code()
    digest = code_digest(code)
    now = time.time()
    record = {"principal": who, "session": SESSION, "expires_at": now + 600}
    reply = await scripts.ACCESS_CHECK(
        cluster,
        [
            G.access_paired(TENANT),
            G.access_pending(TENANT, who),
            G.access_code(TENANT, digest),
            G.access_notice(TENANT, who),
            G.access_requests(TENANT),
        ],
        [who, digest, json.dumps(record), 600, 60, now],
    )
    assert int(reply[0]) == 2  # a code issued

    paired = await PairingStore(cluster).approve(TENANT, code, "op")

    assert paired is not None and paired.principal == who and paired.session == SESSION
    assert json.loads(await cluster.hget(G.access_paired(TENANT), who))["by"] == "op"
    assert not await cluster.exists(G.access_pending(TENANT, who))
    assert not await cluster.exists(G.access_notice(TENANT, who))
    assert await cluster.zcard(G.access_requests(TENANT)) == 0
    events = await cluster.xrange(SessionKeys(SESSION).events)
    assert [fields[b"kind"] for _, fields in events] == [b"access_paired"]
    assert await PairingStore(cluster).revoke(TENANT, who, "op")


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[str, list[int]]]:
    """A real HTTP server answering the statuses in its list first, then 200."""
    statuses: list[int] = []

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=statuses.pop(0) if statuses else 200)

    app = web.Application()
    app.router.add_post("/hooks", handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url("/hooks")), statuses
    await server.close()


def _endpoint(url: str, allow: tuple[str, ...]) -> WebhookEndpoint:
    return WebhookEndpoint.model_validate(
        {"tenant": TENANT, "url": url, "events": ("message_received",), "secret_env": "S", "allow_networks": allow}
    )


async def test_the_webhook_transactions_run_on_the_cluster(cluster: Any, receiver: tuple[str, list[int]]) -> None:
    url, statuses = receiver
    settings = WebhookSettings(poll_s=0.05, timeout_s=2.0, max_attempts=3, backoff_s=0.0, max_backoff_s=0.0)
    endpoints = [_endpoint(url, ("127.0.0.0/8",)), _endpoint(url, ())]  # the second's address is refused
    hooks = WebhookDispatcher(cluster, endpoints, settings, {"S": "secret"}, owner="w")
    event = MessageReceived(message_id="m1", channel="telegram", sender="4242", chars=2)
    await cluster.xadd(SessionKeys(SESSION).events, {"kind": event.kind, "data": encode_event(event)})
    entries = await cluster.xrange(SessionKeys(SESSION).events)
    escaped = escaped_tenant(TENANT)
    targets = hooks.targets[TENANT]
    statuses.append(503)
    try:
        assert await hooks._queue(TENANT, escaped, SESSION, entries, targets) == 2  # MULTI 1: queue and cursor
        assert await hooks.deliver_due(TENANT, targets) == 0  # MULTI 2: a retry (503); MULTI 3: dead (refused)
        assert await hooks.deliver_due(TENANT, targets) == 1  # MULTI 4: delivered
    finally:
        await hooks.close()
    assert await cluster.hlen(G.webhook_deliveries(escaped)) == 0
    assert await cluster.zcard(G.webhook_due(escaped)) == 0
    assert await cluster.zcard(G.webhook_sent(escaped)) == 1
    assert await cluster.xlen(G.webhook_dead(escaped)) == 1
    assert await cluster.hget(G.webhook_cursors(escaped), SESSION) == entries[-1][0]


async def test_an_mcp_client_is_removed_on_the_cluster(cluster: Any) -> None:
    store = McpClientStore(cluster)
    client = await store.add(TENANT, "desk", "ab" * 32)
    assert await store.find(client.sha256) == client
    assert await store.remove(TENANT, "desk")
    assert await store.find(client.sha256) is None
    assert await store.of_tenant(TENANT) == []
    assert not await store.remove(TENANT, "desk")


async def test_a_stale_mcp_index_entry_admits_nothing_and_is_removed(cluster: Any) -> None:
    """A crash between the removal's two steps leaves the index entry without its token."""
    store = McpClientStore(cluster)
    client = await store.add(TENANT, "desk", "cd" * 32)
    await cluster.delete(G.mcp_client(client.sha256))  # the first step only
    assert await store.find(client.sha256) is None
    [listed] = await store.of_tenant(TENANT)
    assert (listed.name, listed.created_at) == ("desk", 0.0)
    with pytest.raises(ValueError, match="remove it first"):
        await store.add(TENANT, "desk", "ef" * 32)
    assert await store.remove(TENANT, "desk")
    assert await store.of_tenant(TENANT) == []


async def test_web_chat_tickets_stream_caps_and_the_sender_meter_run_on_the_cluster(cluster: Any) -> None:
    ticket = new_stream_ticket(SESSION)
    assert await issue_stream_ticket(cluster, SESSION, "hash1", "token-hash", ttl_s=30, per_ttl=10) == 0
    key = stream_ticket_key(ticket, "hash1")
    assert key is not None and await cluster.getdel(key) == b"token-hash"

    slots = StreamSlots(cluster)
    held = await slots.acquire(SESSION, "203.0.113.7", per_session=1, per_address=2)
    assert not isinstance(held, str)
    assert await slots.acquire(SESSION, "203.0.113.7", per_session=1, per_address=2) == "session"
    await slots.refresh()
    assert await cluster.zcard(held.address_key) == 1 and await cluster.zcard(held.session_key) == 1
    await slots.release(held)
    assert await cluster.zcard(held.address_key) == 0

    meter = [G.sender_rate(f"{TENANT}/telegram/bot1/4242")]
    assert await scripts.SENDER_METER(cluster, meter, [1, 60_000, "take"]) == 0
    assert await scripts.SENDER_METER(cluster, meter, [1, 60_000, "take"]) > 0
    assert await scripts.SENDER_METER(cluster, meter, [1, 60_000, "give"]) == 1
    assert await scripts.SENDER_METER(cluster, meter, [1, 60_000, "take"]) == 0


async def test_the_cluster_client_refuses_a_transaction_across_slots(cluster: Any) -> None:
    """The control: what the tests above would meet if the tags were missing (the old names were in several slots)."""
    old = ["sb:access:acme:paired", "sb:access:acme:requests"]
    assert key_slot(old[0].encode()) != key_slot(old[1].encode())
    with pytest.raises(RedisClusterException):
        async with cluster.pipeline(transaction=True) as pipe:
            pipe.hset(old[0], "a", "1")
            pipe.zadd(old[1], {"a": 1})
            await pipe.execute()
    assert key_slot(G.access_paired(TENANT).encode()) == key_slot(G.access_requests(TENANT).encode())
