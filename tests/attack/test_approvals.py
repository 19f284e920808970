"""Hostile use of approvals, through the real drain, runtime, gateway and Redis store.

A held reply approved together with a new message, a requester deciding their own held reply through an approvers'
glob, a pending approval outliving ``/reset``, a prompt-injected model offering buttons that carry approval option
ids, workers whose clocks disagree with Redis, and index entries whose approval is gone.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.core.approvals.policy import ApprovalsConfig, PolicyConfig, Rule
from switchboard.core.approvals.turn import REVIEW_HOLD_TEXT
from switchboard.queue.approvals import RedisApprovals, approval_member
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.reaper import Reaper
from switchboard.settings import QueueSettings
from tests.approvals.harness import KEY, World, where
from tests.queue.test_approvals import SESSION, lease_for, record_for, store_for

REFUND = '/tool refund {"amount": 150}'
TWO_REFUNDS = """/run refund(amount=150)
refund(amount=200)
note(text="after")"""


@pytest.fixture
def world(client: aioredis.Redis, queue_settings: QueueSettings, ingestor: Ingestor, tmp_path: Path) -> World:
    return World(client, queue_settings, ingestor, tmp_path)


async def test_an_approved_held_reply_is_sent_when_a_new_message_comes_in_the_same_batch(world: World) -> None:
    world.policy = PolicyConfig(mode="review")
    await world.send(world.message("what is the refund policy?"))
    record = await world.only_approval()
    assert record.kind == "reply" and record.draft
    decide = world.operator("decide", approval_id=record.id, verdict="approve")
    follow = world.message("hello? is anyone there?")
    for message in (decide, follow):  # the user wrote again while the operator approved: one collected turn
        await world.ingestor.ingest(message, busy_policy="collect")
    await world.drainer().drain(follow.session_key)
    assert (await world.record(record.id)).status == "executed"
    sent = world.texts()[-1]
    assert record.draft in sent  # the approved draft reached the user, exactly as written
    assert REVIEW_HOLD_TEXT in sent  # the answer to the new message waits for review in its turn
    second = await world.only_approval()
    assert second.id != record.id and second.kind == "reply" and second.draft
    assert record.draft not in second.draft  # the approved draft is not reviewed a second time


async def test_the_requester_never_approves_their_own_held_reply_even_through_an_approver_glob(world: World) -> None:
    # the channel's members may decide tool approvals; a held reply is for someone other than who asked
    world.policy = PolicyConfig(mode="review", approvals=ApprovalsConfig(approvers=["operators", "telegram:*"]))
    await world.send(world.message("tell me a secret"))
    record = await world.only_approval()
    assert record.kind == "reply" and record.requested_by == "telegram:u1"
    await world.send(world.command("approve", ""))  # "/approve": the only pending approval is the held reply
    assert (await world.record(record.id)).status == "pending"
    assert record.draft not in world.texts()
    assert "can't decide" in world.texts()[-1]
    await world.send(world.command("approve", record.id))
    assert (await world.record(record.id)).status == "pending"
    # another member of the channel may (the glob names them)
    await world.send(world.command("approve", record.id, user="u2"))
    assert (await world.record(record.id)).status == "executed"
    assert world.texts()[-1] == record.draft


async def test_reset_supersedes_a_pending_approval(world: World) -> None:
    await world.send(world.message(REFUND))
    record = await world.only_approval()
    button = world.approve_option()
    await world.send(world.command("reset", ""))
    assert (await world.record(record.id)).status == "superseded"
    assert where(await world.events("approval_settled"), approval_id=record.id, status="superseded")
    await world.send(world.click(button))  # the old button of the forgotten conversation
    assert world.refunds == []  # nothing of the forgotten conversation runs
    assert "no longer pending" in world.texts()[-1]


async def test_the_same_click_twice_and_approve_then_deny_in_one_batch_run_it_once(world: World) -> None:
    await world.send(world.message(REFUND))
    record = await world.only_approval()
    batch = [world.click(world.approve_option()), world.click(world.approve_option()), world.click(world.deny_option())]
    for message in batch:
        await world.ingestor.ingest(message, busy_policy="collect")
    await world.drainer().drain(batch[-1].session_key)
    assert world.refunds == [150]
    assert (await world.record(record.id)).status == "executed"
    assert [e["result"] for e in await world.events("approval_decided")] == [
        "applied",
        "already_decided",
        "already_decided",
    ]
    assert world.texts()[-1].count("already approved by telegram:u1 and carried out") == 2


async def test_a_decision_while_taken_over_runs_once_and_the_model_is_not_asked(world: World) -> None:
    await world.send(world.message(REFUND))
    record = await world.only_approval()
    await world.send(world.operator("take_over"))
    steps = len(await world.events("step"))
    await world.send(world.click(world.approve_option()))
    assert world.refunds == [150] and (await world.record(record.id)).status == "executed"
    assert len(await world.events("step")) == steps  # the operator holds the conversation: no model call
    await world.send(world.message("did it work? @everyone <!channel>"))
    assert len(await world.events("step")) == steps


async def test_the_approval_key_appears_nowhere_in_redis_offers_or_replies(world: World) -> None:
    world.codeact = True
    await world.send(world.message(TWO_REFUNDS))
    await world.send(world.click(world.approve_option()))  # resumed, paused again at the second refund
    await world.send(world.command("approve", ""))
    assert world.refunds == [150, 200]
    secret = KEY.decode()
    redis: Any = world.client
    for key in await redis.keys("*"):
        kind = (await redis.type(key)).decode()
        values: list[Any] = []
        if kind == "hash":
            values = list((await redis.hgetall(key)).values())
        elif kind == "list":
            values = await redis.lrange(key, 0, -1)
        elif kind == "string":
            values = [await redis.get(key)]
        elif kind == "stream":
            values = [v for _, entry in await redis.xrange(key) for v in entry.values()]
        assert not any(KEY in v for v in values if isinstance(v, bytes)), key
    shown = [o.question for o in world.offers()] + [o.id for x in world.offers() for o in x.options] + world.texts()
    assert not any(secret in text for text in shown)


async def test_a_policy_changed_to_refuse_between_ask_and_approve_refuses_the_action(world: World) -> None:
    await world.send(world.message(REFUND))
    record = await world.only_approval()
    world.policy = PolicyConfig(rules=[Rule(tool="refund", decide="refuse", reason="refunds are off")])
    await world.send(world.click(world.approve_option()))  # a worker with the new configuration decides it
    assert world.refunds == []
    stored = await world.record(record.id)
    assert stored.status == "refused" and stored.outcome is not None
    assert where(await world.events("approval_settled"), approval_id=record.id, status="refused")
    assert "did not run" in world.texts()[-1]


async def test_a_program_paused_twice_then_superseded_never_runs_its_rest(world: World) -> None:
    world.codeact = True
    await world.send(world.message(TWO_REFUNDS))
    await world.send(world.click(world.approve_option()))
    second = await world.only_approval()
    assert world.refunds == [150] and (await world.record(second.id)).status == "pending"
    await world.send(world.message("never mind"))  # supersedes the second pause: the rest of the program never runs
    assert (await world.record(second.id)).status == "superseded"
    await world.send(world.click(world.approve_option()))
    assert world.refunds == [150] and world.notes == []
    assert "no longer pending" in world.texts()[-1]


G = GlobalKeys()
SK = SessionKeys(SESSION).shard


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

    due = await client.zscore(SK.approvals_due, approval_member(SESSION, record.id))
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
    assert await client.zscore(SK.approvals_due, member) is not None

    await client.delete(G.reaper_lock)
    await Reaper(client, queue_settings, worker_id="w9").sweep()

    assert await client.zscore(SK.approvals_due, member) is None
    assert await client.zscore(SK.approvals_pending("acme"), member) is None
    assert await client.zscore(SessionKeys(SESSION).approvals, gone.id) is None  # the session no longer "waits"
    assert await client.llen(SessionKeys(SESSION).inbox) == 0  # no expiry sent for an approval nobody can decide
