"""Hostile conditions for the Redis approval store: workers whose clocks disagree with the server's, and index entries
whose approval is gone. Real Redis, real fenced scripts."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from switchboard.queue.approvals import RedisApprovals, approval_member
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.reaper import Reaper
from switchboard.settings import QueueSettings
from tests.queue.test_approvals import SESSION, lease_for, record_for, store_for

G = GlobalKeys()


async def server_now(client: aioredis.Redis) -> float:
    seconds, micros = await client.time()
    return seconds + micros / 1_000_000


@pytest.mark.parametrize("skew_s", [-7200.0, 7200.0])
async def test_an_approvals_window_is_measured_on_the_servers_clock_whatever_the_workers_clock(
    client: aioredis.Redis, skew_s: float
) -> None:
    store: RedisApprovals = await store_for(client)
    record = record_for(SESSION, expires_in=600.0)
    skewed = record.model_copy(
        update={"requested_at": record.requested_at + skew_s, "expires_at": record.expires_at + skew_s}
    )
    before = await server_now(client)
    await store.approval_open(skewed)

    due = await client.zscore(G.approvals_due, approval_member(SESSION, record.id))
    assert due is not None and before + 600 <= due <= await server_now(client) + 600
    decided = await store.approval_decide(record.id, "approve", "telegram:42", "button", action_prefix=None)
    assert decided.result == "applied" and decided.record is not None and decided.record.status == "approved"


async def test_an_expiry_is_not_due_before_its_window_ends_on_the_server(client: aioredis.Redis) -> None:
    store = await store_for(client)
    record = record_for(SESSION, expires_in=600.0)
    ahead = record.model_copy(update={"requested_at": time.time() - 3600, "expires_at": time.time() - 3000})
    await store.approval_open(ahead)
    expired = await store.approval_decide(record.id, "expire", "switchboard", "expiry", action_prefix=None)
    assert expired.result == "not_due"


async def test_the_expiry_sweep_drops_entries_whose_approval_is_gone_and_sends_nothing_for_them(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    lease = await lease_for(client, SESSION)
    short = RedisApprovals(client, SESSION, lease.token, lease.epoch, retention_s=1)  # kept 1 s past its expiry
    gone = record_for(SESSION, expires_in=-1.0)
    await short.approval_open(gone)
    for _ in range(100):  # the record's own TTL runs out (about a second); its index entries stay behind
        if not await client.exists(SessionKeys(SESSION).approval(gone.id)):
            break
        await asyncio.sleep(0.05)
    member = approval_member(SESSION, gone.id)
    assert await client.zscore(G.approvals_due, member) is not None

    await client.delete(G.reaper_lock)
    await Reaper(client, queue_settings, worker_id="w9").sweep()

    assert await client.zscore(G.approvals_due, member) is None
    assert await client.zscore(G.approvals_pending("acme"), member) is None
    assert await client.zscore(SessionKeys(SESSION).approvals, gone.id) is None  # the session no longer "waits"
    assert await client.llen(SessionKeys(SESSION).inbox) == 0  # no expiry sent for an approval nobody can decide
