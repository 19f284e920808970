"""The drain sets who a turn acts for: the last sender's principal, its granted permissions and the policy version."""

from __future__ import annotations

import redis.asyncio as aioredis
import yaml

from switchboard.core.agent.config import Agent
from switchboard.core.approvals.grants import resolve_policy
from switchboard.core.messages import ConversationRef, InboundMessage, OperatorActed, Sender
from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.queue.ingest import Ingestor
from switchboard.settings import FileConfig, QueueSettings
from switchboard.worker.drain import Drainer
from tests.queue.conftest import RecordingDeliverer

CONFIG = FileConfig.model_validate(
    yaml.safe_load(
        """
default_agent: assistant
agents:
  assistant:
    name: assistant
    profile: {name: A}
    instructions: Answer.
    policy:
      version: v7
      grants:
        "telegram:42": [payments.send]
        "console:*": [support.*]
"""
    )
)
AGENT = CONFIG.agent("assistant")


def message(sender: str, *, event: OperatorActed | None = None) -> InboundMessage:
    draft = InboundMessage(
        dedup_key=f"evt-{sender}",
        conversation=ConversationRef(agent="assistant", channel="telegram", conversation="c1"),
        sender=Sender(id=sender),
        text="hi",
    )
    return draft if event is None else draft.model_copy(update={"event": event})


async def requests_for(
    client: aioredis.Redis, settings: QueueSettings, draft: InboundMessage, config: FileConfig | None
) -> list[TurnRequest]:
    seen: list[TurnRequest] = []

    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        seen.append(request)
        return TurnResult(text="ok", steps=1)

    def agent_for(_message: InboundMessage) -> Agent:
        return AGENT

    await Ingestor(client, settings).ingest(draft)
    drainer = Drainer(
        client,
        settings,
        runner=runner,
        deliverer=RecordingDeliverer(),
        agent_for=agent_for,
        worker_id="w1",
        config=config,
    )
    await drainer.drain(draft.session_key)
    return seen


async def test_a_turn_acts_for_the_senders_principal_with_its_grants_and_the_policy_version(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    [request] = await requests_for(client, queue_settings, message("42"), CONFIG)

    assert request.actor == "telegram:42"
    assert request.permissions == frozenset({"payments.send"})
    expected = resolve_policy(CONFIG, tenant="default", agent="assistant", channel="telegram")
    assert request.policy == expected
    assert request.policy_version == expected.version and request.policy_version.startswith("v7")


async def test_another_user_of_the_chat_gets_no_grant(client: aioredis.Redis, queue_settings: QueueSettings) -> None:
    [request] = await requests_for(client, queue_settings, message("43"), CONFIG)

    assert (request.actor, request.permissions) == ("telegram:43", frozenset())


async def test_an_operators_action_acts_for_the_operator(client: aioredis.Redis, queue_settings: QueueSettings) -> None:
    acted = OperatorActed(action="take_over", operator="console:alice")
    [request] = await requests_for(client, queue_settings, message("console:alice", event=acted), CONFIG)

    assert (request.actor, request.permissions) == ("console:alice", frozenset({"support.*"}))


async def test_without_the_yaml_file_the_principal_holds_nothing(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    [request] = await requests_for(client, queue_settings, message("42"), None)

    assert (request.actor, request.permissions, request.policy, request.policy_version) == (
        "telegram:42",
        frozenset(),
        None,
        "",
    )
