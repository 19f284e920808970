"""A choice round trip in the web chat: offered with option ids, clicked, and the agent sees the chosen id."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard.channels.registry import ChannelSet
from switchboard.channels.web.adapter import WebChannel, split_session_key
from switchboard.core.actions import Choice, OfferChoice
from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.agent.replay import ReplayModel
from switchboard.core.agent.runtime import Runtime
from switchboard.core.messages import ChoiceSelected, InboundMessage, Posted
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import default_registry
from switchboard.outbound.outbox import Ephemeral
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import CURRENT_LEASE
from switchboard.worker.drain import Drainer
from tests.core.turns import answer_step, calls_step

from .conftest import Chat, read_sse


async def _stored(chat: Chat, session: str, message_id: str) -> InboundMessage:
    raw = await chat.redis.hget(SessionKeys(session).messages, message_id)  # type: ignore[arg-type]
    assert raw is not None
    return InboundMessage.model_validate_json(raw)


async def test_an_offer_shows_ids_and_a_click_reaches_the_agent_as_the_chosen_id(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    asked = await chat.send(token, "which plan?", client_id="q1")
    offer = OfferChoice(
        question="Which plan?",
        options=[Choice(id="basic", label="Basic"), Choice(id="pro", label="Pro")],
        reply_to=asked,
    )
    reset = CURRENT_LEASE.set(await chat.lease(session))
    try:
        await WebChannel(chat.publisher.publish).perform(offer, split_session_key(session), Ephemeral("k"))
    finally:
        CURRENT_LEASE.reset(reset)
    async with chat.client.get(f"/api/chat/stream?token={token}") as resp:
        replayed = await read_sse(resp, 3)  # the question, its queued status, the offer
        [shown] = [e for e in replayed if e.event == "message"]
        assert shown.data is not None
        assert shown.data["choices"] == [{"id": "basic", "label": "Basic"}, {"id": "pro", "label": "Pro"}]
        clicked = await chat.post(token, {"choice": "pro", "text": "Pro", "client_id": "click-1"})
        assert clicked.status == 202
        message_id = (await clicked.json())["message_id"]
        [echo] = [e for e in await read_sse(resp, 2) if e.event == "user"]
    assert echo.data is not None and echo.data["choice"] == "pro" and echo.data["text"] == "Pro"
    stored = await _stored(chat, session, message_id)
    assert stored.event == ChoiceSelected(option_id="pro")
    assert stored.text == "Pro" and stored.conversation == split_session_key(session)
    question = await _stored(chat, session, asked)
    assert question.event == Posted()


@pytest.mark.parametrize("body", [{"choice": ""}, {"choice": 3}, {"choice": "x" * 65}, {"choice": "ok", "text": 1}])
async def test_a_bad_click_is_400_and_writes_nothing(chat: Chat, body: object) -> None:
    _, token = await chat.new_session()
    before = await chat.snapshot()
    resp = await chat.post(token, body)
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "malformed_body"
    assert await chat.snapshot() == before


def _drainer(chat: Chat, model: ReplayModel, tmp_path: Path) -> Drainer:
    models = ModelFactory(ProviderConfig())
    models.override("offline", model)
    runtime = Runtime(models=models, tools=default_registry(), workspace_root=tmp_path / "ws")
    channels = ChannelSet({("web", "default"): WebChannel(chat.publisher.publish)})
    agent = Agent(name="assistant", profile=AgentProfile(name="A"), instructions="Answer.", tools=["offer_choice"])
    settings = chat.settings.queue.model_copy(update={"max_attempts": 1, "retry_backoff_s": 0})
    return Drainer(chat.redis, settings, runner=runtime.run_turn, deliverer=channels, agent_for=lambda m: agent,
                   worker_id="w1")  # fmt: skip


def _last_user_text(model: ReplayModel) -> str:
    content = [m.content for m in model.requests[-1].messages if m.role == "user"][-1]
    assert isinstance(content, str)
    return content


async def test_a_click_through_the_route_is_checked_against_what_the_agent_offered(chat: Chat, tmp_path: Path) -> None:
    offer = {"question": "Which plan?", "options": [{"id": "basic", "label": "Basic"}, {"id": "pro", "label": "Pro"}]}
    steps = [calls_step(("offer_choice", offer)), answer_step("Pick one", step=2), answer_step("Pro it is"),
             answer_step("Hm")]  # fmt: skip
    model = ReplayModel(steps, strict=False)
    drain = _drainer(chat, model, tmp_path)
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    await chat.send(token, "which plan?", client_id="q1")
    await drain.drain(session)
    real = await chat.post(token, {"choice": "pro", "text": "Pro", "client_id": "click-1"})
    assert real.status == 202
    await drain.drain(session)
    assert _last_user_text(model) == "chose option pro (Pro)"
    # a forged click: any id the page (or a script) posts, with a label that looks offered
    forged = await chat.post(token, {"choice": "refund-all", "text": "Pro", "client_id": "click-2"})
    assert forged.status == 202
    await drain.drain(session)
    assert _last_user_text(model) == "clicked an option that was not offered here: refund-all"
    assert model.exhausted
