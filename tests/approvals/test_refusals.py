"""What never runs: an expired approval, a changed payload, stale state; a new message supersedes the request."""

from __future__ import annotations

import json

from switchboard.core.approvals.records import ApprovalRecord
from switchboard.queue.keys import SessionKeys

from .harness import World, where

REFUND = '/tool refund {"amount": 150}'


async def ask_refund(world: World) -> ApprovalRecord:
    await world.send(world.message(REFUND))
    return await world.only_approval()


async def test_expiry_tells_the_model_and_a_late_click_runs_nothing(world: World) -> None:
    record = await ask_refund(world)
    await world.client.hset(SessionKeys(world.session).approval(record.id), "expires_at", "1")  # time passed
    # what the reaper ingests once expires_at passed
    expire = world.operator("decide", operator="switchboard", approval_id=record.id, verdict="expire")
    await world.send(expire)
    assert world.refunds == []
    assert (await world.record(record.id)).status == "expired"
    assert "expired" in world.texts()[-1]  # the model was told it did not happen, and said so
    assert where(await world.events("approval_settled"), status="expired", approval_id=record.id)
    (decided,) = await world.events("approval_decided")
    assert decided["via"] == "expiry" and decided["result"] == "applied"
    await world.send(world.click(world.approve_option()))
    assert world.refunds == []
    assert "expired before it was decided" in world.texts()[-1]


async def test_an_approve_after_expiry_is_refused_and_the_model_told(world: World) -> None:
    record = await ask_refund(world)
    await world.client.hset(SessionKeys(world.session).approval(record.id), "expires_at", "1")
    await world.send(world.click(world.approve_option()))
    assert world.refunds == []
    assert (await world.record(record.id)).status == "expired"
    assert "expired" in world.texts()[-1]


async def test_a_payload_changed_in_redis_is_refused(world: World) -> None:
    record = await ask_refund(world)
    key = SessionKeys(world.session).approval(record.id)
    raw = await world.raw_record(record.id)
    raw["request"]["arguments"]["amount"] = 99999  # someone with Redis access raises the amount
    await world.client.hset(key, "record", json.dumps(raw))
    await world.send(world.click(world.approve_option()))
    assert world.refunds == []
    settled = await world.record(record.id)
    assert (
        settled.status == "refused" and settled.outcome is not None and settled.outcome["reason"] == "approval_mismatch"
    )
    assert "did not run" in world.texts()[-1]


async def test_a_changed_hash_with_the_changed_payload_is_still_refused(world: World) -> None:
    """Rewriting the hash too: the button binds the hash the user saw, so the click no longer matches."""
    from switchboard.core.tools.gateway import action_sha256

    record = await ask_refund(world)
    key = SessionKeys(world.session).approval(record.id)
    raw = await world.raw_record(record.id)
    raw["request"]["arguments"]["amount"] = 99999
    raw["request"]["action_sha256"] = action_sha256("refund", {"amount": 99999})
    await world.client.hset(key, mapping={"record": json.dumps(raw), "action": raw["request"]["action_sha256"]})
    await world.send(world.click(world.approve_option()))
    assert world.refunds == []
    assert "another version" in world.texts()[-1]


async def test_stale_state_is_refused(world: World) -> None:
    record = await ask_refund(world)
    await world.client.hset(SessionKeys(world.session).slots, "state", json.dumps({"balance": 0}))
    await world.send(world.click(world.approve_option()))
    assert world.refunds == []
    settled = await world.record(record.id)
    assert settled.status == "refused" and settled.outcome is not None and settled.outcome["reason"] == "stale_state"
    assert where(await world.events("approval_settled"), status="refused", reason="stale_state")


async def test_a_new_message_supersedes_the_pending_approval(world: World) -> None:
    record = await ask_refund(world)
    await world.send(world.message("actually, never mind"))
    assert (await world.record(record.id)).status == "superseded"
    assert where(await world.events("approval_settled"), status="superseded")
    assert world.texts(), "the new message was answered"
    await world.send(world.click(world.approve_option()))
    assert world.refunds == []
    assert "no longer pending" in world.texts()[-1]


async def test_a_record_rewritten_with_a_consistent_hash_is_refused_when_the_user_approves_what_they_saw(
    world: World,
) -> None:
    """The stored request and its hash rewritten together (the ``action`` field left as asked): the user's button
    still names the hash they saw, so the decision applies — and the record's signature refuses the rewritten one."""
    from switchboard.core.tools.gateway import action_sha256

    record = await ask_refund(world)
    key = SessionKeys(world.session).approval(record.id)
    raw = await world.raw_record(record.id)
    raw["request"]["arguments"]["amount"] = 15000
    raw["request"]["action_sha256"] = action_sha256("refund", {"amount": 15000})
    await world.client.hset(key, "record", json.dumps(raw))
    await world.send(world.click(world.approve_option()))
    assert world.refunds == []
    found = await world.record(record.id)
    assert found.status == "refused" and found.outcome is not None and found.outcome["reason"] == "approval_mismatch"
    assert "did not run" in world.texts()[-1]
