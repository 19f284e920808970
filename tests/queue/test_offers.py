"""Clicks checked against the session's recorded offers, through the real drain, runtime and Redis.

The model offers a choice with the ``offer_choice`` tool (a replayed model that records its requests); the drain
records the offer; a later click reads as the choice only if its id was offered in this session and is still kept.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from switchboard.core.actions import Choice, OfferChoice
from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.agent.replay import ReplayModel
from switchboard.core.agent.runtime import Runtime
from switchboard.core.messages import ChoiceSelected, InboundMessage
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import default_registry
from switchboard.core.turn import HistoryEntry
from switchboard.errors import FencedWriteError
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease
from switchboard.queue.offers import OFFERS_KEPT, OFFERS_TTL_S, check_choices, record_offer
from switchboard.settings import QueueSettings
from switchboard.worker.drain import Drainer
from tests.core.turns import answer_step, calls_step
from tests.queue.conftest import RecordingDeliverer, make_message

AGENT = Agent(name="assistant", profile=AgentProfile(name="A"), instructions="Answer.", tools=["offer_choice"])
OFFER = {"question": "Which plan?", "options": [{"id": "basic", "label": "Basic"}, {"id": "pro", "label": "Pro plan"}]}
NOT_OFFERED = "clicked an option that was not offered here: "


def drainer(client: aioredis.Redis, settings: QueueSettings, deliverer: RecordingDeliverer, model: ReplayModel,
            tmp_path: Path) -> Drainer:  # fmt: skip
    models = ModelFactory(ProviderConfig())
    models.override("offline", model)
    runtime = Runtime(models=models, tools=default_registry(), workspace_root=tmp_path / "ws")
    return Drainer(
        client, settings, runner=runtime.run_turn, deliverer=deliverer, agent_for=lambda m: AGENT, worker_id="w1"
    )


def click(option_id: str, label: str, conversation: str = "c1") -> InboundMessage:
    return make_message(label, conversation=conversation).model_copy(
        update={"event": ChoiceSelected(option_id=option_id, offer_message_id="1")}
    )


def last_user_text(model: ReplayModel) -> str:
    content = [m.content for m in model.requests[-1].messages if m.role == "user"][-1]
    assert isinstance(content, str)
    return content


async def offer_then_click(
    client: aioredis.Redis,
    ingestor: Ingestor,
    drain: Drainer,
    clicked: InboundMessage,
) -> None:
    question = make_message("which plan should I take?")
    await ingestor.ingest(question)
    await drain.drain(question.session_key)
    await ingestor.ingest(clicked)
    await drain.drain(clicked.session_key)


def offer_model() -> ReplayModel:
    steps = [calls_step(("offer_choice", OFFER)), answer_step("Pick one", step=2), answer_step("Noted")]
    return ReplayModel(steps, strict=False)


async def test_a_click_on_an_offered_id_reads_as_the_choice_with_the_offered_label(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    model = offer_model()
    drain = drainer(client, queue_settings, deliverer, model, tmp_path)
    # the click's own label is the platform's (or a forger's) word: the recorded label is what was offered
    await offer_then_click(client, ingestor, drain, click("pro", "Pro plan, free forever"))
    assert [s.action.kind for s in deliverer.sent if s.action.kind == "choice"] == ["choice"]
    assert last_user_text(model) == "chose option pro (Pro plan)"
    raw = await client.lrange(SessionKeys(click("", "").session_key).history, 0, -1)
    history = [HistoryEntry.model_validate_json(entry) for entry in raw]
    assert history[-2].text == "chose option pro (Pro plan)" and deliverer.texts()[-1] == "Noted"


async def test_a_forged_id_reads_as_not_offered(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    model = offer_model()
    drain = drainer(client, queue_settings, deliverer, model, tmp_path)
    await offer_then_click(client, ingestor, drain, click("refund-all", "Pro plan"))
    assert last_user_text(model) == NOT_OFFERED + "refund-all"
    assert all("chose option" not in str(m.content) for m in model.requests[-1].messages if m.role == "user")


async def test_an_offer_in_another_conversation_does_not_vouch_for_a_click(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    model = offer_model()
    drain = drainer(client, queue_settings, deliverer, model, tmp_path)
    await offer_then_click(client, ingestor, drain, click("pro", "Pro plan", conversation="someone-else"))
    assert last_user_text(model) == NOT_OFFERED + "pro"


async def test_a_click_after_the_offers_expired_reads_as_not_offered(
    client: aioredis.Redis,
    ingestor: Ingestor,
    queue_settings: QueueSettings,
    deliverer: RecordingDeliverer,
    tmp_path: Path,
) -> None:
    model = offer_model()
    drain = drainer(client, queue_settings, deliverer, model, tmp_path)
    question = make_message("which plan should I take?")
    await ingestor.ingest(question)
    await drain.drain(question.session_key)
    offers = SessionKeys(question.session_key).offers
    assert 0 < await client.pttl(offers) <= OFFERS_TTL_S * 1000  # kept for a while, not forever
    await client.pexpire(offers, 1)  # Redis expires the record, as it would after OFFERS_TTL_S
    while await client.exists(offers):
        await asyncio.sleep(0.005)
    late = click("pro", "Pro plan")
    await ingestor.ingest(late)
    await drain.drain(late.session_key)
    assert last_user_text(model) == NOT_OFFERED + "pro"


async def test_an_evicted_offer_no_longer_vouches_and_a_resent_offer_is_kept_once(client: aioredis.Redis) -> None:
    session = click("", "").session_key
    lease = await Lease(client, worker_id="w1", lease_ms=5000).acquire(session)
    assert lease is not None
    first = OfferChoice(question="Old?", options=[Choice(id="old", label="Old"), Choice(id="pro", label="Pro")])
    await record_offer(client, lease, first, "k0")
    await record_offer(client, lease, first, "k0")  # a resumed send of the same offer
    assert await client.llen(SessionKeys(session).offers) == 1
    for n in range(1, OFFERS_KEPT):
        later = OfferChoice(question=f"{n}?", options=[Choice(id=f"o{n}", label="A"), Choice(id="pro", label="New")])
        await record_offer(client, lease, later, f"k{n}")
    clicks = [click("old", "Old"), click("pro", "Pro")]
    kept = await check_choices(client, session, clicks)
    assert [(m.event, m.text) for m in kept] == [
        (ChoiceSelected(option_id="old", offer_message_id="1", offered=True), "Old"),
        (ChoiceSelected(option_id="pro", offer_message_id="1", offered=True), "New"),  # the newest offer's label
    ]
    one_more = OfferChoice(question="Last?", options=[Choice(id="x", label="X"), Choice(id="y", label="Y")])
    await record_offer(client, lease, one_more, f"k{OFFERS_KEPT}")
    assert await client.llen(SessionKeys(session).offers) == OFFERS_KEPT
    old, pro = await check_choices(client, session, clicks)
    assert isinstance(old.event, ChoiceSelected) and old.event.offered is False and old.text == "Old"
    assert isinstance(pro.event, ChoiceSelected) and pro.event.offered is True


async def test_a_click_marked_offered_by_its_sender_is_still_checked(client: aioredis.Redis) -> None:
    forged = click("pro", "Pro").model_copy(update={"event": ChoiceSelected(option_id="pro", offered=True)})
    stored = InboundMessage.model_validate_json(forged.model_dump_json())  # as the queue keeps it
    [checked] = await check_choices(client, forged.session_key, [stored])
    assert isinstance(checked.event, ChoiceSelected) and checked.event.offered is False


async def test_a_lost_lease_records_no_offer(client: aioredis.Redis) -> None:
    session = click("", "").session_key
    leases = Lease(client, worker_id="w1", lease_ms=5000)
    stale = await leases.acquire(session)
    assert stale is not None and await leases.abandon(stale)
    assert await Lease(client, worker_id="w2", lease_ms=5000).acquire(session) is not None
    offer = OfferChoice(question="Q?", options=[Choice(id="a", label="A"), Choice(id="b", label="B")])
    with pytest.raises(FencedWriteError):
        await record_offer(client, stale, offer, "k")
    assert await client.exists(SessionKeys(session).offers) == 0
