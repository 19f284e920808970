"""Approval records in Redis: one decision per approval (R8), expiry on the server's clock, zombies fenced."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from switchboard.core.approvals.records import (
    ApprovalRecord,
    ApprovalRequest,
    ApprovalStore,
    SessionControl,
    Verdict,
    new_approval_id,
)
from switchboard.core.messages import session_key
from switchboard.errors import FencedWriteError
from switchboard.queue.approvals import APPROVAL_RETENTION_S, RedisApprovals, approval_member
from switchboard.queue.connection import async_client
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease, LeaseToken
from switchboard.queue.ledger import Attempt, AttemptStore
from switchboard.queue.stats import fenced_total
from switchboard.settings import QueueSettings
from switchboard.types import SessionKey

SESSION = session_key("acme", "assistant", "telegram", "default", "c1")
OTHER = session_key("acme", "assistant", "telegram", "default", "c2")
SK = SessionKeys(SESSION).shard
ACTION = "ab" * 32


def record_for(session: SessionKey, *, expires_in: float = 3600.0, approval_id: str | None = None) -> ApprovalRecord:
    now = time.time()
    return ApprovalRecord(
        id=approval_id or new_approval_id(),
        session=session,
        tenant="acme",
        agent="assistant",
        channel="telegram",
        run_id="run-1",
        requested_by="telegram:42",
        requested_at=now,
        expires_at=now + expires_in,
        request=ApprovalRequest(
            tool="pay",
            arguments={"amount": 250, "to": "ACME Ltd", "tags": []},
            action_sha256=ACTION,
            idempotency_key="k1",
            resources=("invoice:7",),
            reason="amount > 100",
            rule="big-payments",
            policy_version="v1",
            risk="high",
            reversible=False,
        ),
        state_sha256="cd" * 32,
        call_id="call-1",
        approvers=("requester", "operators"),
    )


async def lease_for(client: aioredis.Redis, session: SessionKey, worker: str = "w1") -> LeaseToken:
    lease = await Lease(client, worker_id=worker, lease_ms=60_000).acquire(session)
    assert lease is not None
    return lease


async def store_for(client: aioredis.Redis, session: SessionKey = SESSION) -> RedisApprovals:
    lease = await lease_for(client, session)
    return RedisApprovals(client, session, lease.token, lease.epoch)


@pytest.fixture
async def store(client: aioredis.Redis) -> RedisApprovals:
    return await store_for(client)


async def test_an_opened_approval_is_pending_and_indexed_for_expiry_and_operators(
    client: aioredis.Redis, store: RedisApprovals
) -> None:
    record = record_for(SESSION)
    await store.approval_open(record)

    assert await store.approval_get(record.id) == record
    assert await store.approval_pending() == [record]
    member = approval_member(SESSION, record.id)
    assert await client.zscore(SK.approvals_due, member) == pytest.approx(record.expires_at)
    assert await client.zscore(SK.approvals_pending("acme"), member) == pytest.approx(record.requested_at)
    ttl_s = await client.ttl(SessionKeys(SESSION).approval(record.id))
    assert 3600 + APPROVAL_RETENTION_S - 60 < ttl_s <= 3600 + APPROVAL_RETENTION_S


async def test_an_approval_is_decided_once_and_leaves_every_pending_index(
    client: aioredis.Redis, store: RedisApprovals
) -> None:
    record = record_for(SESSION)
    await store.approval_open(record)

    first = await store.approval_decide(record.id, "approve", "telegram:42", "button", action_prefix=ACTION[:12])
    second = await store.approval_decide(record.id, "deny", "console:alice", "console", action_prefix=None)

    assert first.result == "applied"
    assert first.record is not None
    assert (first.record.status, first.record.decided_by, first.record.decision_via) == (
        "approved",
        "telegram:42",
        "button",
    )
    assert first.record.decided_at is not None and abs(first.record.decided_at - time.time()) < 60
    assert second.result == "already_decided"
    assert second.record == first.record
    assert await store.approval_pending() == []
    member = approval_member(SESSION, record.id)
    assert await client.zscore(SK.approvals_due, member) is None
    assert await client.zscore(SK.approvals_pending("acme"), member) is None
    assert await client.ttl(SessionKeys(SESSION).approval(record.id)) <= APPROVAL_RETENTION_S


async def test_a_click_for_another_action_hash_changes_nothing(store: RedisApprovals) -> None:
    record = record_for(SESSION)
    await store.approval_open(record)

    outcome = await store.approval_decide(record.id, "approve", "telegram:42", "button", action_prefix="ff" * 6)

    assert outcome.result == "mismatch"
    assert outcome.record == record
    assert await store.approval_pending() == [record]


async def test_expire_before_expiry_is_not_due_and_any_verdict_after_it_records_expired(
    store: RedisApprovals,
) -> None:
    live = record_for(SESSION)
    late = record_for(SESSION, expires_in=-1.0)
    await store.approval_open(live)
    await store.approval_open(late)

    not_due = await store.approval_decide(live.id, "expire", "switchboard", "expiry", action_prefix=None)
    too_late = await store.approval_decide(late.id, "approve", "telegram:42", "button", action_prefix=None)
    again = await store.approval_decide(late.id, "expire", "switchboard", "expiry", action_prefix=None)

    assert not_due.result == "not_due"
    assert (await store.approval_get(live.id)) == live
    assert too_late.result == "expired"
    assert too_late.record is not None
    assert (too_late.record.status, too_late.record.decided_by, too_late.record.decision_via) == (
        "expired",
        "switchboard",
        "expiry",
    )
    assert again.result == "already_decided"
    assert [r.id for r in await store.approval_pending()] == [live.id]


async def test_the_expiry_sweeps_verdict_applies_once_due(store: RedisApprovals) -> None:
    record = record_for(SESSION, expires_in=-0.5)
    await store.approval_open(record)

    outcome = await store.approval_decide(record.id, "expire", "switchboard", "expiry", action_prefix=None)

    assert outcome.result == "applied"
    assert outcome.record is not None and outcome.record.status == "expired"


async def test_a_decision_for_another_sessions_approval_is_not_found(client: aioredis.Redis) -> None:
    mine = await store_for(client, SESSION)
    theirs = await store_for(client, OTHER)
    record = record_for(OTHER)
    await theirs.approval_open(record)

    outcome = await mine.approval_decide(record.id, "approve", "telegram:42", "button", action_prefix=None)

    assert outcome.result == "not_found"
    assert outcome.record is None
    assert await mine.approval_get(record.id) is None
    assert not await mine.approval_supersede(record.id)
    assert (await theirs.approval_get(record.id)) == record


async def test_a_record_of_another_session_or_a_malformed_id_is_refused_at_open(store: RedisApprovals) -> None:
    with pytest.raises(ValueError, match="another session"):
        await store.approval_open(record_for(OTHER))
    with pytest.raises(ValueError, match="id"):
        await store.approval_open(record_for(SESSION, approval_id="a|b:c"))
    record = record_for(SESSION)
    await store.approval_open(record)
    with pytest.raises(ValueError, match="already taken"):
        await store.approval_open(record_for(SESSION, approval_id=record.id))
    assert await store.approval_pending() == [record]
    assert (await store.approval_decide("../x", "approve", "a", "command", action_prefix=None)).result == "not_found"


async def test_an_approved_record_is_settled_exactly_once(store: RedisApprovals) -> None:
    record = record_for(SESSION)
    await store.approval_open(record)
    assert not await store.approval_settle(record.id, "executed", {"ok": True})  # pending: nothing to consume

    await store.approval_decide(record.id, "approve", "telegram:42", "command", action_prefix=None)
    first = await store.approval_settle(record.id, "executed", {"tool": "pay", "ok": True, "value": {"id": 9}})
    second = await store.approval_settle(record.id, "refused", {"reason": "stale"})

    assert (first, second) == (True, False)
    settled = await store.approval_get(record.id)
    assert settled is not None
    assert settled.status == "executed"
    assert settled.outcome == {"tool": "pay", "ok": True, "value": {"id": 9}}


async def test_a_pending_approval_is_superseded_once_and_a_late_click_finds_it_decided(store: RedisApprovals) -> None:
    record = record_for(SESSION)
    await store.approval_open(record)

    assert await store.approval_supersede(record.id)
    assert not await store.approval_supersede(record.id)
    late = await store.approval_decide(record.id, "approve", "telegram:42", "button", action_prefix=None)

    assert late.result == "already_decided"
    assert late.record is not None and late.record.status == "superseded"
    assert await store.approval_pending() == []


async def test_take_over_and_hand_back(store: RedisApprovals) -> None:
    assert await store.control() is None
    held = SessionControl(operator="console:alice", since=time.time())

    await store.set_control(held)
    assert await store.control() == held
    await store.set_control(None)
    assert await store.control() is None


async def test_a_zombie_token_writes_nothing(client: aioredis.Redis) -> None:
    old = await lease_for(client, SESSION, "w1")
    zombie = RedisApprovals(client, SESSION, old.token, old.epoch)
    record = record_for(SESSION)
    await zombie.approval_open(record)
    await client.delete(SessionKeys(SESSION).lease)  # the lease lapsed; another worker took the session
    await lease_for(client, SESSION, "w2")
    before = await client.hgetall(SessionKeys(SESSION).approval(record.id))
    fenced_before = await fenced_total(client)

    with pytest.raises(FencedWriteError):
        await zombie.approval_decide(record.id, "approve", "telegram:42", "button", action_prefix=None)
    with pytest.raises(FencedWriteError):
        await zombie.approval_supersede(record.id)
    with pytest.raises(FencedWriteError):
        await zombie.approval_settle(record.id, "executed", None)
    with pytest.raises(FencedWriteError):
        await zombie.set_control(SessionControl(operator="console:mallory", since=0))
    fresh = record_for(SESSION)
    with pytest.raises(FencedWriteError):
        await zombie.approval_open(fresh)

    assert await client.hgetall(SessionKeys(SESSION).approval(record.id)) == before
    assert not await client.exists(SessionKeys(SESSION).approval(fresh.id), SessionKeys(SESSION).control)
    assert await client.zscore(SK.approvals_due, approval_member(SESSION, fresh.id)) is None
    assert await fenced_total(client) == fenced_before + 5


@pytest.fixture
async def clients(redis_url: str) -> AsyncIterator[list[aioredis.Redis]]:
    opened = [async_client(redis_url) for _ in range(3)]
    yield opened
    for c in opened:
        await c.aclose()


async def test_r8_concurrent_approve_deny_and_expire_resolve_to_exactly_one_decision(
    client: aioredis.Redis, clients: list[aioredis.Redis]
) -> None:
    """1,000 races, each of two approves, two denies and two expiries from three connections at once."""
    lease = await lease_for(client, SESSION)
    stores = [RedisApprovals(c, SESSION, lease.token, lease.epoch) for c in clients]
    verdicts: list[Verdict] = ["approve", "deny", "expire", "approve", "deny", "expire"]
    winners: Counter[str] = Counter()

    async def race(n: int) -> None:
        expired = n % 10 == 9  # one race in ten runs after the approval expired
        record = record_for(SESSION, expires_in=-1.0 if expired else 3600.0)
        await stores[n % 3].approval_open(record)
        # The first call sent usually wins, so each race starts the six calls at a different one of them:
        # approves and denies both win some races, whichever way the event loop happens to schedule them.
        order = [(n + k) % len(verdicts) for k in range(len(verdicts))]
        sent = await asyncio.gather(
            *(
                stores[i % 3].approval_decide(
                    record.id, verdicts[i], f"telegram:{i}", "button", action_prefix=ACTION[: 6 + i]
                )
                for i in order
            )
        )
        outcomes = [sent[order.index(i)] for i in range(len(verdicts))]
        results = Counter(o.result for o in outcomes)
        changed = [(i, o) for i, o in enumerate(outcomes) if o.result in {"applied", "expired"}]
        assert len(changed) == 1, results  # exactly one decision changed the record
        index, winner = changed[0]
        verdict = verdicts[index]
        final = await stores[0].approval_get(record.id)
        assert final is not None and winner.record == final
        if expired:
            assert final.status == "expired"
            assert winner.result == ("applied" if verdict == "expire" else "expired")
            assert results["already_decided"] == 5
        else:
            assert winner.result == "applied" and verdict != "expire"
            assert final.status == {"approve": "approved", "deny": "denied"}[verdict]
            assert (final.decided_by, final.decision_via) == (f"telegram:{index}", "button")
            assert results["not_due"] + results["already_decided"] == 5
        winners[verdict] += 1

    for start in range(0, 1000, 50):
        await asyncio.gather(*(race(n) for n in range(start, start + 50)))

    assert winners.total() == 1000
    assert winners["approve"] > 0 and winners["deny"] > 0  # the races really were races
    assert await client.zcard(SessionKeys(SESSION).approvals) == 0
    assert await client.zcard(SK.approvals_due) == 0


async def test_the_turns_store_is_an_approval_store_under_the_drains_lease(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    lease = await lease_for(client, SESSION)
    attempt = Attempt(attempt=1, dead=False, last_error="", ids=["m1"], bodies=[])
    store = AttemptStore(client, lease, queue_settings, attempt)
    record = record_for(SESSION)

    assert isinstance(store, ApprovalStore)
    await store.approval_open(record)
    outcome = await store.approval_decide(record.id, "deny", "telegram:42", "command", action_prefix=None)

    assert outcome.result == "applied"
    assert (await store.approval_get(record.id)) == outcome.record
    assert await store.approval_pending() == []
    await store.set_control(SessionControl(operator="console:alice", since=1.0))
    assert await store.control() == SessionControl(operator="console:alice", since=1.0)
