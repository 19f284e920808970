"""The reaper tells a session once that its approval expired (the worker then records it and the model says so)."""

from __future__ import annotations

import redis.asyncio as aioredis

from switchboard.core.messages import InboundMessage, OperatorActed
from switchboard.queue.approvals import RedisApprovals, approval_member
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.reaper import Reaper
from switchboard.settings import QueueSettings
from switchboard.types import SessionKey
from tests.queue.test_approvals import SESSION, lease_for, record_for

G = GlobalKeys()
SK = SessionKeys(SESSION).shard


async def inbox(client: aioredis.Redis, session: SessionKey) -> list[InboundMessage]:
    keys = SessionKeys(session)
    ids = [i.decode() for i in await client.lrange(keys.inbox, 0, -1)]
    return [InboundMessage.model_validate_json(await client.hget(keys.messages, i)) for i in ids]


async def sweep(client: aioredis.Redis, settings: QueueSettings) -> None:
    await client.delete(G.reaper_lock)  # each call is a sweep of its own (the lock spaces them out in production)
    await Reaper(client, settings, worker_id="w9").sweep()


async def test_a_due_approval_is_sent_into_its_session_once(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    lease = await lease_for(client, SESSION)
    store = RedisApprovals(client, SESSION, lease.token, lease.epoch)
    due, live = record_for(SESSION, expires_in=-1.0), record_for(SESSION)
    await store.approval_open(due)
    await store.approval_open(live)

    await sweep(client, queue_settings)
    await sweep(client, queue_settings)  # before the worker applied it: the same message again, a duplicate

    [message] = await inbox(client, SESSION)
    assert message.event == OperatorActed(action="decide", operator="switchboard", approval_id=due.id, verdict="expire")
    assert message.sender.id == "switchboard" and message.dedup_key == f"expire:{due.id}"
    assert message.conversation.session_key == SESSION

    outcome = await store.approval_decide(due.id, "expire", "switchboard", "expiry", action_prefix=None)
    assert outcome.result == "applied"
    assert await client.zscore(SK.approvals_due, approval_member(SESSION, due.id)) is None
    assert await client.zscore(SK.approvals_due, approval_member(SESSION, live.id)) is not None
    await sweep(client, queue_settings)
    assert len(await inbox(client, SESSION)) == 1
