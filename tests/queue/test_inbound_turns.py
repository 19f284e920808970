"""Inbound events through the real drain and Redis: /reset forgets the conversation, a stop command stops."""

from __future__ import annotations

import json
from pathlib import Path

import redis.asyncio as aioredis

from switchboard.core.actions import Choice, OfferChoice
from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.agent.replay import ReplayModel
from switchboard.core.agent.runtime import Runtime
from switchboard.core.inbound import RESET_TEXT
from switchboard.core.messages import ChoiceSelected, CommandIssued, MessageDeleted, Posted
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import default_registry
from switchboard.core.turn import HistoryEntry
from switchboard.queue.cancellation import is_stop
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease
from switchboard.queue.offers import record_offer
from switchboard.settings import QueueSettings
from switchboard.worker.drain import Drainer
from tests.core.turns import answer_step
from tests.queue.conftest import RecordingDeliverer, make_message

AGENT = Agent(name="assistant", profile=AgentProfile(name="A"), instructions="Answer.", tools=[])


def drainer(client: aioredis.Redis, settings: QueueSettings, deliverer: RecordingDeliverer, model: ReplayModel,
            tmp_path: Path) -> Drainer:  # fmt: skip
    models = ModelFactory(ProviderConfig())
    models.override("offline", model)
    runtime = Runtime(models=models, tools=default_registry(), workspace_root=tmp_path / "ws")
    return Drainer(
        client, settings, runner=runtime.run_turn, deliverer=deliverer, agent_for=lambda m: AGENT, worker_id="w1"
    )


async def history(client: aioredis.Redis, session: str) -> list[tuple[str, str]]:
    raw = await client.lrange(SessionKeys(session).history, 0, -1)  # type: ignore[arg-type]
    return [(e.role, e.text) for e in (HistoryEntry.model_validate_json(item) for item in raw)]


async def test_reset_clears_history_and_slots_so_the_next_prompt_has_no_earlier_messages(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    model = ReplayModel([answer_step("Hi Ada"), answer_step("I do not know")], strict=False)
    drain = drainer(client, queue_settings, deliverer, model, tmp_path)
    first = make_message("my name is Ada")
    await ingestor.ingest(first)
    await drain.drain(first.session_key)
    keys = SessionKeys(first.session_key)
    await client.hset(keys.slots, "plan", json.dumps("call Ada back"))
    await client.lpush(keys.offers, json.dumps({"key": "k", "options": [{"id": "pro", "label": "Pro"}]}))
    assert await history(client, first.session_key) == [("user", "my name is Ada"), ("assistant", "Hi Ada")]

    reset = make_message("").model_copy(update={"event": CommandIssued(name="reset")})
    await ingestor.ingest(reset)
    await drain.drain(reset.session_key)
    assert deliverer.texts()[-1] == RESET_TEXT and len(model.requests) == 1  # answered without the model
    assert await history(client, first.session_key) == [] and await client.exists(keys.slots, keys.offers) == 0

    again = make_message("who am I?")
    await ingestor.ingest(again)
    await drain.drain(again.session_key)
    assert [(m.role, m.content) for m in model.requests[1].messages] == [("user", "who am I?")]
    assert await history(client, first.session_key) == [("user", "who am I?"), ("assistant", "I do not know")]


async def test_choices_and_deletions_are_recorded_as_the_model_read_them(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    model = ReplayModel([answer_step("Pro it is")], strict=False)
    drain = drainer(client, queue_settings, deliverer, model, tmp_path)
    click = make_message("Pro").model_copy(update={"event": ChoiceSelected(option_id="pro")})
    offered = await Lease(client, worker_id="w0", lease_ms=5000).acquire(click.session_key)  # as a drain records it
    assert offered is not None
    offer = OfferChoice(question="Plan?", options=[Choice(id="basic", label="Basic"), Choice(id="pro", label="Pro")])
    await record_offer(client, offered, offer, "offer-1")
    await Lease(client, worker_id="w0", lease_ms=5000).abandon(offered)
    await ingestor.ingest(click)
    await drain.drain(click.session_key)
    gone = make_message("").model_copy(update={"event": MessageDeleted(original_id="9")})
    await ingestor.ingest(gone)
    await drain.drain(gone.session_key)
    assert await history(client, click.session_key) == [
        ("user", "chose option pro (Pro)"),
        ("assistant", "Pro it is"),
        ("user", "(deleted an earlier message)"),
    ]
    assert deliverer.texts() == ["Pro it is"] and len(model.requests) == 1  # the deletion got no reply


def test_a_stop_command_stops_like_the_typed_one() -> None:
    for name in ("stop", "cancel"):
        assert is_stop(make_message("").model_copy(update={"event": CommandIssued(name=name)}))
    assert is_stop(make_message(" /STOP ").model_copy(update={"event": Posted()}))
    assert not is_stop(make_message("").model_copy(update={"event": CommandIssued(name="reset")}))
    assert not is_stop(make_message("/stop").model_copy(update={"event": ChoiceSelected(option_id="stop")}))
