"""The console's API against the real app, Redis and control service: tenant scoping, and every write a service call.

Sessions are made by ingesting real messages; approvals are opened the way a worker opens them (under the
session's lease, through the Redis approval store).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.core.approvals.records import ApprovalRecord, ApprovalRequest, new_approval_id
from switchboard.core.messages import ConversationRef, InboundMessage, OperatorActed, Sender
from switchboard.core.tools.effects import EffectRecord
from switchboard.queue.approvals import RedisApprovals
from switchboard.queue.effects import RedisEffects
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease
from switchboard.settings import QueueSettings
from switchboard.types import SessionKey
from tests.console.conftest import Console
from tests.queue.conftest import RecordingDeliverer, make_drainer


@dataclass
class Seeded:
    """A session per tenant, each with one pending approval."""

    mine: SessionKey
    theirs: SessionKey
    approval: ApprovalRecord
    their_approval: ApprovalRecord


async def _session(
    redis: aioredis.Redis,
    tenant: str,
    conversation: str,
    *,
    text: str = "please pay the invoice",
    queue: QueueSettings | None = None,
) -> SessionKey:
    message = InboundMessage(
        dedup_key=f"evt-{tenant}-{conversation}",
        conversation=ConversationRef(tenant=tenant, agent="assistant", channel="telegram", conversation=conversation),
        sender=Sender(id="42", name="User"),
        text=text,
    )
    await Ingestor(redis, queue or QueueSettings()).ingest(message)
    return SessionKey(message.conversation.session_key)


async def _open_approval(redis: aioredis.Redis, session: SessionKey, tenant: str) -> ApprovalRecord:
    now = time.time()
    record = ApprovalRecord(
        id=new_approval_id(),
        session=session,
        tenant=tenant,
        agent="assistant",
        channel="telegram",
        run_id="run-1",
        trace_id="0af7651916cd43dd8448eb211c80319c",
        requested_by="telegram:42",
        requested_at=now,
        expires_at=now + 3600,
        request=ApprovalRequest(
            tool="pay",
            arguments={"amount": 250, "to": "ACME Ltd"},
            action_sha256="ab" * 32,
            idempotency_key="k1",
            resources=("invoice:7",),
            reason="payments over 100 need an operator",
            rule="big-payments",
            policy_version="v1:1a2b3c",
            risk="high",
            reversible=False,
        ),
        state_sha256="cd" * 32,
        approvers=("requester", "operators"),
    )
    lease = await Lease(redis, worker_id="test-worker", lease_ms=60_000).acquire(session)
    assert lease is not None
    try:
        await RedisApprovals(redis, session, lease.token, lease.epoch).approval_open(record)
    finally:
        await Lease(redis, worker_id="test-worker", lease_ms=60_000).abandon(lease)
    return record


@pytest.fixture
def async_redis_queue() -> QueueSettings:
    """Queue settings for a drain in the test: one attempt, so a poisoned message is dead-lettered at once."""
    return QueueSettings(name="sbtest", lease_ms=2000, max_attempts=1, retry_backoff_s=0.0)


@pytest.fixture
async def seeded(async_redis: aioredis.Redis) -> Seeded:
    mine = await _session(async_redis, "default", "c1")
    theirs = await _session(async_redis, "other", "c2")
    return Seeded(
        mine=mine,
        theirs=theirs,
        approval=await _open_approval(async_redis, mine, "default"),
        their_approval=await _open_approval(async_redis, theirs, "other"),
    )


async def _operator_events(redis: aioredis.Redis, session: SessionKey) -> list[OperatorActed]:
    """The operator actions waiting in the session's inbox (what the worker will apply under the lease)."""
    found: list[OperatorActed] = []
    for raw in (await redis.hgetall(SessionKeys(session).messages)).values():
        message = InboundMessage.model_validate_json(raw)
        if isinstance(message.event, OperatorActed):
            found.append(message.event)
    return found


async def _snapshot(redis: aioredis.Redis) -> dict[str, Any]:
    """Every key and its content digest, minus sign-in keys (which a request refreshes)."""
    out: dict[str, Any] = {}
    for key in sorted(k.decode() if isinstance(k, bytes) else k for k in await redis.keys("*")):
        if key.startswith(("sb:console:", "sb:{console:")):
            continue
        out[key] = await redis.dump(key)
    return out


async def test_operators_see_only_their_tenants(console: Console, seeded: Seeded) -> None:
    assert (await console.login("alice")).status == 200
    sessions = await (await console.client.get("/console/api/sessions")).json()
    assert [s["key"] for s in sessions["sessions"]] == [seeded.mine]
    approvals = (await (await console.client.get("/console/api/approvals")).json())["approvals"]
    assert [a["id"] for a in approvals] == [seeded.approval.id]
    shown = approvals[0]
    request = seeded.approval.request
    assert request is not None
    # the reviewer sees the record's normalised data
    assert shown["tool"] == "pay" and shown["arguments"] == {"amount": 250, "to": "ACME Ltd"}
    assert shown["resources"] == ["invoice:7"] and shown["reason"] == request.reason
    assert shown["policy_version"] == "v1:1a2b3c" and shown["expires_at"] == seeded.approval.expires_at
    assert shown["requester"] == "telegram:42" and shown["action_sha256"] == request.action_sha256
    assert "program" not in shown
    denied = await console.client.get("/console/api/timeline", params={"session": seeded.theirs})
    assert denied.status == 403

    assert (await console.login("bob")).status == 200
    sessions = await (await console.client.get("/console/api/sessions")).json()
    assert [s["key"] for s in sessions["sessions"]] == [seeded.theirs]
    approvals = (await (await console.client.get("/console/api/approvals")).json())["approvals"]
    assert [a["id"] for a in approvals] == [seeded.their_approval.id]


async def test_the_timeline_shows_state_events_and_pending_approvals(console: Console, seeded: Seeded) -> None:
    assert (await console.login("alice")).status == 200
    resp = await console.client.get("/console/api/timeline", params={"session": seeded.mine})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["session"] == seeded.mine
    assert body["state"] in {"queued", "waiting_for_approval"}
    assert [a["id"] for a in body["approvals"]] == [seeded.approval.id]
    assert all({"id", "at", "type", "trace_id", "data"} <= set(event) for event in body["events"])
    missing = await console.client.get("/console/api/timeline")
    assert missing.status == 400


async def test_a_decision_is_an_operator_action_ingested_into_the_session(
    console: Console, seeded: Seeded, async_redis: aioredis.Redis
) -> None:
    assert (await console.login("alice")).status == 200
    body = {"session": seeded.mine, "id": seeded.approval.id, "verdict": "approve"}
    resp = await console.write("approvals/decide", body)
    assert resp.status == 202, await resp.text()
    assert await _operator_events(async_redis, seeded.mine) == [
        OperatorActed(action="decide", operator="console:alice", approval_id=seeded.approval.id, verdict="approve")
    ]


async def test_take_over_say_and_hand_back_are_operator_actions(
    console: Console, seeded: Seeded, async_redis: aioredis.Redis
) -> None:
    assert (await console.login("alice")).status == 200
    for path, extra in (("take-over", {}), ("say", {"text": "Hello, a person here."}), ("hand-back", {})):
        resp = await console.write(f"sessions/{path}", {"session": seeded.mine, **extra})
        assert resp.status == 202, (path, await resp.text())
    actions = sorted(event.action for event in await _operator_events(async_redis, seeded.mine))
    assert actions == ["hand_back", "say", "take_over"]
    assert all(event.operator == "console:alice" for event in await _operator_events(async_redis, seeded.mine))


async def test_writes_to_another_tenant_or_without_csrf_change_nothing(
    console: Console, seeded: Seeded, async_redis: aioredis.Redis
) -> None:
    assert (await console.login("alice")).status == 200
    before = await _snapshot(async_redis)
    theirs = {"session": seeded.theirs, "id": seeded.their_approval.id, "verdict": "approve"}
    resp = await console.write("approvals/decide", theirs)
    assert resp.status == 403 and (await resp.json())["error"]["code"] == "out_of_scope"
    for path in ("take-over", "hand-back"):
        assert (await console.write(f"sessions/{path}", {"session": seeded.theirs})).status == 403
    mine = {"session": seeded.mine, "id": seeded.approval.id, "verdict": "approve"}
    assert (await console.write("approvals/decide", mine, csrf=False)).status == 403
    assert await _snapshot(async_redis) == before


async def test_malformed_writes_are_400_and_change_nothing(
    console: Console, seeded: Seeded, async_redis: aioredis.Redis
) -> None:
    assert (await console.login("alice")).status == 200
    before = await _snapshot(async_redis)
    headers = {"X-CSRF-Token": console.csrf}
    not_json = await console.client.post("/console/api/approvals/decide", data=b"{nope", headers=headers)
    assert not_json.status == 400
    for body in (
        [1],
        {"id": seeded.approval.id, "verdict": "approve"},
        {"session": seeded.mine, "id": seeded.approval.id, "verdict": "maybe"},
        {"session": seeded.mine, "text": ""},
    ):
        path = "sessions/say" if "text" in body else "approvals/decide"
        resp = await console.client.post(f"/console/api/{path}", data=json.dumps(body), headers=headers)
        assert resp.status == 400, (body, await resp.text())
    big = await console.client.post("/console/api/sessions/say", data=b"x" * 20_000, headers=headers)
    assert big.status == 413
    unknown = await console.write(
        "approvals/decide", {"session": "default/nope/web/default/x", "id": "a" * 12, "verdict": "approve"}
    )
    assert unknown.status == 404
    assert await _snapshot(async_redis) == before


async def test_the_read_routes_answer_for_a_signed_in_operator(console: Console, seeded: Seeded) -> None:
    assert (await console.login("alice")).status == 200
    for path, name in (
        ("dead-letters", "dead_letters"),
        ("effects", "effects"),
        ("agents", "agents"),
        ("usage", "usage"),
    ):
        resp = await console.client.get(f"/console/api/{path}")
        assert resp.status == 200, (path, await resp.text())
        assert isinstance((await resp.json())[name], list)
    agents = (await (await console.client.get("/console/api/agents")).json())["agents"]
    assert [a["name"] for a in agents] == ["assistant"]
    assert [t["name"] for t in agents[0]["tools"]] == ["current_time"]
    for path in ("sessions", "approvals", "dead-letters", "effects", "agents", "usage"):
        console.client.session.cookie_jar.clear()
        assert (await console.client.get(f"/console/api/{path}")).status == 401
        await console.login("alice")


async def test_a_dead_letter_is_requeued_through_the_console(
    console: Console, async_redis: aioredis.Redis, async_redis_queue: QueueSettings
) -> None:
    session = await _session(async_redis, "default", "poisoned", text="poison pill", queue=async_redis_queue)
    await make_drainer(async_redis, async_redis_queue, RecordingDeliverer()).drain(session)
    assert (await console.login("bob")).status == 200
    assert (await (await console.client.get("/console/api/dead-letters")).json())["dead_letters"] == []
    assert (await console.login("alice")).status == 200
    [dead] = (await (await console.client.get("/console/api/dead-letters")).json())["dead_letters"]
    assert (dead["session"], dead["preview"], dead["requeued"]) == (session, "poison pill", False)
    resp = await console.write("dead-letters/requeue", {"session": session, "id": dead["id"]})
    assert resp.status == 202, await resp.text()
    [queued] = [
        InboundMessage.model_validate_json(raw)
        for raw in (await async_redis.hgetall(SessionKeys(session).messages)).values()
    ]
    assert queued.text == "poison pill"
    [dead] = (await (await console.client.get("/console/api/dead-letters")).json())["dead_letters"]
    assert dead["requeued"]


async def test_an_effect_in_doubt_is_resolved_through_the_console(
    console: Console, seeded: Seeded, async_redis: aioredis.Redis
) -> None:
    lease = await Lease(async_redis, worker_id="test-worker", lease_ms=60_000).acquire(seeded.mine)
    assert lease is not None
    effects = RedisEffects(async_redis, seeded.mine, lease.token, lease.epoch)
    claim = EffectRecord(action_sha256="cd" * 32)
    assert await effects.effect_begin("key-1", claim) is None
    await effects.effect_doubt("key-1", claim, {"tool": "pay", "run_id": "run-7", "reason": "worker lost"})
    assert (await console.login("bob")).status == 200
    assert (await (await console.client.get("/console/api/effects")).json())["effects"] == []
    body = {"session": seeded.mine, "key": "key-1", "outcome": "failed"}
    assert (await console.write("effects/resolve", body)).status == 403
    assert (await console.login("alice")).status == 200
    [doubt] = (await (await console.client.get("/console/api/effects")).json())["effects"]
    assert (doubt["session"], doubt["key"], doubt["tool"], doubt["resolution"]) == (seeded.mine, "key-1", "pay", None)
    resp = await console.write("effects/resolve", {**body, "outcome": "maybe"})
    assert resp.status == 400
    resp = await console.write("effects/resolve", body)
    assert resp.status == 200, await resp.text()
    result = (await resp.json())["result"]
    assert (result["resolution"], result["resolved_by"]) == ("failed", "console:alice")
    assert (await (await console.client.get("/console/api/effects")).json())["effects"] == []
    again = await console.write("effects/resolve", body)
    assert again.status == 404


async def test_the_sessions_list_pages_with_a_cursor_across_shards(
    console: Console, seeded: Seeded, async_redis: aioredis.Redis
) -> None:
    from switchboard.core.messages import session_key

    extra = [session_key("default", "assistant", "web", "default", f"page-{i}") for i in range(23)]
    for i, session in enumerate(extra):  # indexed as ingest indexes them, in their shards
        await async_redis.zadd(SessionKeys(session).shard.sessions, {session: 1e15 + i // 2})
    assert len({SessionKeys(s).shard for s in extra}) > 15
    assert (await console.login("alice")).status == 200
    listed: list[str] = []
    after, pages = "", 0
    while True:
        resp = await console.client.get("/console/api/sessions", params={"limit": "5", "after": after})
        pages += 1
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        listed += [s["key"] for s in body["sessions"]]
        after = body["next"]
        if not after:
            break
    newest = sorted(extra, key=lambda s: (1e15 + extra.index(s) // 2, s.encode()), reverse=True)
    assert listed == [*newest, seeded.mine] and pages == 5
    for query in ({"after": "nonsense"}, {"limit": "0"}, {"limit": "x"}):
        assert (await console.client.get("/console/api/sessions", params=query)).status == 400
