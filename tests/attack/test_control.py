"""Hostile operators against the control service (console and CLI alike): a decision the policy does not let the
operator make is refused at once, with nothing queued (before: accepted, queued, then silently refused by the
worker)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from switchboard.control import ControlService, InvalidRequestError, NotFoundError, OperatorScope, OutOfScopeError
from switchboard.core.messages import OperatorActed
from switchboard.queue.approvals import RedisApprovals
from switchboard.queue.ingest import Ingestor
from switchboard.settings import QueueSettings, Settings, load_settings
from tests.test_control import approval, drained, inbox, lease_of

ALICE = OperatorScope(operator="console:alice", tenants=frozenset({"acme"}))
BOB = OperatorScope(operator="console:bob", tenants=frozenset({"acme"}))


@pytest.fixture
def settings(base_env: dict[str, str]) -> Settings:
    return load_settings(base_env)


@pytest.fixture
def control(client: aioredis.Redis, settings: Settings, queue_settings: QueueSettings) -> ControlService:
    return ControlService(client, settings, Ingestor(client, queue_settings))


@pytest.mark.parametrize("approvers", [("requester",), ("console:bob",), ("slack:U7",), ()])
async def test_an_operator_who_is_not_an_approver_is_refused_and_nothing_is_queued(
    client: aioredis.Redis, queue_settings: QueueSettings, control: ControlService, approvers: tuple[str, ...]
) -> None:
    session = await drained(client, queue_settings, "hello")
    lease = await lease_of(client, session)
    record = approval(session).model_copy(update={"approvers": approvers})
    await RedisApprovals(client, session, lease.token, lease.epoch).approval_open(record)

    for verdict in ("approve", "deny"):
        with pytest.raises(OutOfScopeError, match="not among the approvers"):
            await control.decide(ALICE, session, record.id, verdict)
    assert await inbox(client, session) == []


async def test_a_named_operator_may_decide_where_others_may_not(
    client: aioredis.Redis, queue_settings: QueueSettings, control: ControlService
) -> None:
    session = await drained(client, queue_settings, "hello")
    lease = await lease_of(client, session)
    record = approval(session).model_copy(update={"approvers": ("console:bob",)})
    await RedisApprovals(client, session, lease.token, lease.epoch).approval_open(record)

    with pytest.raises(OutOfScopeError):
        await control.decide(ALICE, session, record.id, "approve")
    accepted = await control.decide(BOB, session, record.id, "approve")

    [queued] = await inbox(client, session)
    assert queued.id == accepted.message_id
    assert queued.event == OperatorActed(
        action="decide", operator="console:bob", approval_id=record.id, verdict="approve"
    )


@pytest.mark.parametrize("text", ["hello \ud800", "\udcff"])
async def test_a_message_that_is_not_unicode_text_is_a_clear_refusal_and_nothing_is_queued(
    client: aioredis.Redis, queue_settings: QueueSettings, control: ControlService, text: str
) -> None:
    """A lone surrogate: JSON (the console's body) and the CLI's argv (undecodable bytes) both produce one."""
    session = await drained(client, queue_settings, "hello")
    with pytest.raises(InvalidRequestError, match="text"):
        await control.say(ALICE, session, text)
    assert await inbox(client, session) == []


async def test_a_session_or_effect_key_that_is_not_unicode_text_is_not_found_not_a_crash(
    client: aioredis.Redis, queue_settings: QueueSettings, control: ControlService
) -> None:
    session = await drained(client, queue_settings, "hello")
    forged = session.rsplit("/", 1)[0] + "/\udcff"
    attempts = (
        lambda: control.session(ALICE, forged),
        lambda: control.timeline(ALICE, forged),
        lambda: control.take_over(ALICE, forged),
        lambda: control.resolve_effect(ALICE, forged, "ab" * 32, "done"),
        lambda: control.resolve_effect(ALICE, session, "\ud800", "failed"),
    )
    for attempt in attempts:
        with pytest.raises(NotFoundError):
            await attempt()
    assert await inbox(client, session) == []
