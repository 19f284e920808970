"""Delivery reports from the platforms: facts in their sessions' event logs and counts in /metrics, never messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from switchboard.channels.base import DeliveryStatus, Inbound
from switchboard.channels.web.adapter import WebChannel
from switchboard.core.messages import ConversationRef
from switchboard.errors import QueueUnavailableError
from switchboard.queue.keys import SessionKeys
from switchboard.queue.stats import read_stats
from switchboard.types import SessionKey
from switchboard.web.metrics import Metrics
from tests.queue.test_router import _config, _router


def _status(account: str, status: str, platform_id: str = "wamid.1", error: str = "") -> DeliveryStatus:
    conv = ConversationRef(channel="telegram", account=account, conversation="c1")
    return DeliveryStatus(conv, status, platform_id, error)  # type: ignore[arg-type]


async def test_reports_become_facts_of_their_session_and_counts_never_messages(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, tmp_path: Path
) -> None:
    metrics = Metrics(["telegram"])
    router = _router(async_redis, _config(tmp_path), metrics)
    inbound = Inbound(
        statuses=(
            _status("default", "delivered"),
            _status("shop", "read", "wamid.2"),
            _status("default", "failed", "wamid.3", "131026 Message undeliverable"),
            _status("ghost", "read"),  # an account nobody configured: dropped and counted
        )
    )
    assert await router.accept(WebChannel(None), inbound) == inbound.answer
    default = SessionKeys(SessionKey("acme/support/telegram/default/c1"))
    shop = SessionKeys(SessionKey("shop-co/sales/telegram/shop/c1"))
    facts = [json.loads(f[b"data"]) for _id, f in sync_redis.xrange(default.events)]
    assert [(f["kind"], f["status"], f["platform_id"], f["error"]) for f in facts] == [
        ("delivery_reported", "delivered", "wamid.1", ""),
        ("delivery_reported", "failed", "wamid.3", "131026 Message undeliverable"),
    ]
    assert [json.loads(f[b"data"])["status"] for _id, f in sync_redis.xrange(shop.events)] == ["read"]
    assert sync_redis.llen(default.inbox) == 0 and sync_redis.llen(shop.inbox) == 0  # nothing to answer
    stats = await read_stats(async_redis)
    assert (stats.delivery_delivered, stats.delivery_read, stats.delivery_failed, stats.delivery_sent) == (1, 1, 1, 0)
    rendered = metrics.render(stats, None).decode()
    assert 'switchboard_delivery_statuses_total{status="read"} 1.0' in rendered
    assert 'switchboard_requests_rejected_total{channel="telegram",reason="unknown_account"} 1.0' in rendered


async def test_reports_that_redis_does_not_confirm_fail_the_request_so_the_platform_retries(
    async_redis: aioredis.Redis, sync_redis: redis.Redis, tmp_path: Path
) -> None:
    router = _router(async_redis, _config(tmp_path))
    sync_redis.execute_command("CLIENT", "PAUSE", "2000", "WRITE")
    try:
        with pytest.raises(QueueUnavailableError):
            await router.accept(WebChannel(None), Inbound(statuses=(_status("default", "read"),)))
    finally:
        sync_redis.execute_command("CLIENT", "UNPAUSE")
