"""The control service operators share (console and CLI): scoped reads, and actions that go through the inbox."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from switchboard.control import (
    ControlService,
    InvalidRequestError,
    NotFoundError,
    OperatorScope,
    OutOfScopeError,
)
from switchboard.core.approvals.records import ApprovalRecord, ApprovalRequest, SessionControl, new_approval_id
from switchboard.core.events import UsageMetered
from switchboard.core.messages import ConversationRef, InboundMessage, OperatorActed, Sender
from switchboard.core.tools.effects import EffectRecord
from switchboard.queue.approvals import RedisApprovals
from switchboard.queue.connection import async_client
from switchboard.queue.effects import RedisEffects
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease, LeaseToken
from switchboard.queue.ledger import Attempt, Ledger
from switchboard.settings import QueueSettings, Settings, load_settings
from switchboard.tracing import trace_hex
from switchboard.types import SessionKey
from tests.queue.conftest import RecordingDeliverer, make_drainer

ALICE = OperatorScope(operator="console:alice", tenants=frozenset({"acme"}))
BOB = OperatorScope(operator="console:bob", tenants=frozenset({"globex"}))
_n = itertools.count(1)


def slack_message(text: str, *, tenant: str = "acme", conversation: str = "D1") -> InboundMessage:
    return InboundMessage(
        dedup_key=f"evt-{next(_n)}",
        conversation=ConversationRef(
            tenant=tenant,
            agent="assistant",
            channel="slack",
            conversation=conversation,
            extra={"channel_type": "im", "team": "T1"},
        ),
        sender=Sender(id="U42", name="Ann"),
        text=text,
    )


@pytest.fixture
def settings(base_env: dict[str, str]) -> Settings:
    return load_settings(base_env)


@pytest.fixture
def queue_settings() -> QueueSettings:
    return QueueSettings(name="sbtest", lease_ms=2000, max_attempts=2, retry_backoff_s=0.0, events_maxlen=1000)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    redis = async_client(redis_url)
    yield redis
    await redis.aclose()


@pytest.fixture
def ingestor(client: aioredis.Redis, queue_settings: QueueSettings) -> Ingestor:
    return Ingestor(client, queue_settings)


@pytest.fixture
def control(client: aioredis.Redis, settings: Settings, ingestor: Ingestor) -> ControlService:
    return ControlService(client, settings, ingestor)


async def drained(
    client: aioredis.Redis, queue_settings: QueueSettings, *texts: str, tenant: str = "acme"
) -> SessionKey:
    """Messages accepted into one session and answered by a worker (the session then exists and is done)."""
    ingestor = Ingestor(client, queue_settings)
    message = slack_message(texts[0], tenant=tenant)
    for text in texts:
        await ingestor.ingest(slack_message(text, tenant=tenant))
    await make_drainer(client, queue_settings, RecordingDeliverer()).drain(message.session_key)
    return message.session_key


async def lease_of(client: aioredis.Redis, session: SessionKey) -> LeaseToken:
    lease = await Lease(client, worker_id="w1", lease_ms=60_000).acquire(session)
    assert lease is not None
    return lease


def approval(session: SessionKey, *, expires_in: float = 600.0) -> ApprovalRecord:
    now = time.time()
    return ApprovalRecord(
        id=new_approval_id(),
        session=session,
        tenant="acme",
        agent="assistant",
        channel="slack",
        run_id="run-1",
        requested_by="slack:U42",
        requested_at=now,
        expires_at=now + expires_in,
        request=ApprovalRequest(
            tool="send_file",
            arguments={"path": "report.pdf"},
            action_sha256="ab" * 32,
            idempotency_key="k",
            reason="sends a file",
            rule="default:write",
            policy_version="v1",
        ),
        state_sha256="00" * 32,
        approvers=("requester", "operators"),
    )


async def inbox(client: aioredis.Redis, session: SessionKey) -> list[InboundMessage]:
    keys = SessionKeys(session)
    ids = [i.decode() for i in await client.lrange(keys.inbox, 0, -1)]
    return [InboundMessage.model_validate_json(await client.hget(keys.messages, i)) for i in ids]


async def test_an_operator_message_is_queued_to_the_same_chat_as_the_operator(
    client: aioredis.Redis, queue_settings: QueueSettings, control: ControlService
) -> None:
    session = await drained(client, queue_settings, "hello")

    accepted = await control.say(ALICE, session, "Hi, this is Alice from support.")

    [queued] = await inbox(client, session)
    assert queued.id == accepted.message_id and not accepted.duplicate
    assert queued.event == OperatorActed(action="say", operator="console:alice")
    assert queued.sender.id == "console:alice" and queued.text == "Hi, this is Alice from support."
    # the chat as the user's last message named it, routing data and all (a Slack DM needs its channel type)
    assert queued.conversation == slack_message("x").conversation


async def test_operators_never_reach_another_tenants_sessions(
    client: aioredis.Redis, queue_settings: QueueSettings, control: ControlService
) -> None:
    session = await drained(client, queue_settings, "hello")
    record = approval(session)
    lease = await lease_of(client, session)
    await RedisApprovals(client, session, lease.token, lease.epoch).approval_open(record)

    for act in (
        control.say(BOB, session, "hi"),
        control.take_over(BOB, session),
        control.hand_back(BOB, session),
        control.decide(BOB, session, record.id, "approve"),
        control.timeline(BOB, session),
        control.session(BOB, session),
        control.requeue(BOB, session, "1-0"),
        control.resolve_effect(BOB, session, "k", "done"),
    ):
        with pytest.raises(OutOfScopeError):
            await act
    assert await inbox(client, session) == []
    assert [s.key for s in await control.sessions(BOB)] == []
    assert await control.approvals(BOB) == []
    assert [s.key for s in await control.sessions(ALICE)] == [session]
    assert await control.approvals(ALICE) == [record]


async def test_a_decision_is_queued_once_and_refused_when_not_pending(
    client: aioredis.Redis, queue_settings: QueueSettings, control: ControlService
) -> None:
    session = await drained(client, queue_settings, "hello")
    lease = await lease_of(client, session)
    store = RedisApprovals(client, session, lease.token, lease.epoch)
    record = approval(session)
    await store.approval_open(record)

    first = await control.decide(ALICE, session, record.id, "approve")
    again = await control.decide(ALICE, session, record.id, "approve")  # a double click

    assert again.duplicate and again.message_id == first.message_id
    [queued] = await inbox(client, session)
    assert queued.event == OperatorActed(
        action="decide", operator="console:alice", approval_id=record.id, verdict="approve"
    )
    with pytest.raises(InvalidRequestError):
        await control.decide(ALICE, session, record.id, "maybe")
    with pytest.raises(NotFoundError):
        await control.decide(ALICE, session, "nosuchid", "deny")
    await store.approval_decide(record.id, "deny", "slack:U42", "button", action_prefix=None)
    with pytest.raises(InvalidRequestError, match="already denied"):
        await control.decide(ALICE, session, record.id, "approve")
    assert len(await inbox(client, session)) == 1


async def test_session_states_follow_the_queue(
    client: aioredis.Redis, queue_settings: QueueSettings, control: ControlService
) -> None:
    session = await drained(client, queue_settings, "hello")
    assert (await control.session(ALICE, session)).state == "done"

    lease = await lease_of(client, session)
    assert (await control.session(ALICE, session)).state == "reasoning"
    store = RedisApprovals(client, session, lease.token, lease.epoch)
    await store.approval_open(approval(session))
    await client.delete(SessionKeys(session).lease)
    view = await control.session(ALICE, session)
    assert (view.state, view.pending_approvals) == ("waiting_for_approval", 1)

    lease = await lease_of(client, session)
    await RedisApprovals(client, session, lease.token, lease.epoch).set_control(
        SessionControl(operator="console:alice", since=time.time())
    )
    view = await control.session(ALICE, session)
    assert (view.state, view.controlled_by, view.tenant, view.channel) == (
        "taken_over",
        "console:alice",
        "acme",
        "slack",
    )
    with pytest.raises(NotFoundError):
        await control.session(ALICE, "acme/assistant/slack/default/nobody")


async def test_a_waiting_message_is_queued_and_retrying_once_its_attempt_failed(
    client: aioredis.Redis, queue_settings: QueueSettings, control: ControlService, ingestor: Ingestor
) -> None:
    session = await drained(client, queue_settings, "hello")
    accepted = await ingestor.ingest(slack_message("again"))
    assert (await control.session(ALICE, session)).state == "queued"

    lease = await lease_of(client, session)
    attempt = Attempt(attempt=1, dead=False, last_error="", ids=[accepted.message_id], bodies=[])
    await Ledger(client, lease, queue_settings, worker_id="w1").fail(attempt, "RuntimeError: boom")
    assert (await control.session(ALICE, session)).state == "retrying"  # the worker backs off before its next try
    await client.delete(SessionKeys(session).lease)

    view = await control.session(ALICE, session)
    assert (view.state, view.inbox_depth) == ("retrying", 1)


async def test_the_timeline_carries_each_requests_trace_id(
    client: aioredis.Redis, queue_settings: QueueSettings, control: ControlService
) -> None:
    session = await drained(client, queue_settings, "hello")

    entries = await control.timeline(ALICE, session)

    received = [e for e in entries if e.kind == "message_received"]
    assert received and received[0].trace_id == trace_hex(received[0].data["message_id"])
    assert [e.kind for e in entries][-1] == "run_completed"


async def test_a_dead_letter_is_listed_and_requeued_once(
    client: aioredis.Redis, queue_settings: QueueSettings, control: ControlService
) -> None:
    session = await drained(client, queue_settings, "poison pill")

    [dead] = await control.dead_letters(ALICE)
    assert (dead.session, dead.preview, dead.requeued) == (session, "poison pill", False)
    assert await control.dead_letters(BOB) == []

    [accepted] = await control.requeue(ALICE, session, dead.id)
    [again] = await control.requeue(ALICE, session, dead.id)

    assert not accepted.duplicate and again.duplicate
    [queued] = await inbox(client, session)
    assert queued.text == "poison pill" and queued.id == accepted.message_id
    assert (await control.dead_letters(ALICE))[0].requeued
    with pytest.raises(NotFoundError):
        await control.requeue(ALICE, session, "1-1")


async def test_an_effect_in_doubt_is_resolved_once_and_a_rerun_gets_the_operators_outcome(
    client: aioredis.Redis, queue_settings: QueueSettings, control: ControlService
) -> None:
    session = await drained(client, queue_settings, "hello")
    lease = await lease_of(client, session)
    effects = RedisEffects(client, session, lease.token, lease.epoch)
    claim = EffectRecord(action_sha256="cd" * 32)
    assert await effects.effect_begin("key-1", claim) is None
    await effects.effect_doubt("key-1", claim, {"tool": "pay", "run_id": "run-7", "reason": "worker lost"})
    await effects.effect_doubt("key-1", claim, {"tool": "pay", "reason": "reported twice"})

    [doubt] = await control.effects_in_doubt(ALICE)
    assert (doubt.session, doubt.key, doubt.tool, doubt.run_id, doubt.resolution) == (
        session,
        "key-1",
        "pay",
        "run-7",
        None,
    )
    assert await control.effects_in_doubt(BOB) == []

    resolved = await control.resolve_effect(ALICE, session, "key-1", "failed")

    assert (resolved.resolution, resolved.resolved_by) == ("failed", "console:alice")
    assert await control.effects_in_doubt(ALICE) == []
    assert [d.resolution for d in await control.effects_in_doubt(ALICE, include_resolved=True)] == ["failed"]
    found = await effects.effect_begin("key-1", claim)  # what a re-run of the turn finds: no second attempt
    assert found is not None and found.status == "done" and found.outcome is not None
    assert found.outcome["ok"] is False and "did not happen" in found.outcome["error"]
    with pytest.raises(NotFoundError):
        await control.resolve_effect(ALICE, session, "key-1", "done")
    with pytest.raises(InvalidRequestError):
        await control.resolve_effect(ALICE, session, "key-1", "maybe")


async def test_usage_and_agents_are_summed_per_tenant_and_agent(
    client: aioredis.Redis, queue_settings: QueueSettings, control: ControlService
) -> None:
    ours = await drained(client, queue_settings, "hello")
    theirs = await drained(client, queue_settings, "hello", tenant="globex")
    for session, credits in ((ours, 1.5), (ours, 2.0), (theirs, 9.0)):
        lease = await lease_of(client, session)
        ledger = Ledger(client, lease, queue_settings, worker_id="w1")
        await ledger.facts(
            [UsageMetered(model="m", steps=1, tool_calls=0, input_tokens=10, output_tokens=5, credits=credits)]
        )
        await client.delete(SessionKeys(session).lease)

    [row] = await control.usage(ALICE)
    assert (row.tenant, row.agent, row.credits, row.input_tokens, row.output_tokens, row.runs) == (
        "acme",
        "assistant",
        3.5,
        20,
        10,
        2,
    )
    [agent] = await control.agents(ALICE)
    assert (agent.name, agent.status, agent.credits, agent.runs) == ("assistant", "ready", 3.5, 2)
    assert [t.name for t in agent.tools] == ["current_time"]
    everything = OperatorScope.everything("console:root")
    assert {(r.tenant, r.credits) for r in await control.usage(everything)} == {("acme", 3.5), ("globex", 9.0)}
