"""Messenger and Instagram end to end: the webhook route, durable ingest, a worker, and replies through the fake."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from switchboard.channels.meta.instagram.settings import InstagramSettings
from switchboard.channels.meta.messaging.fake.payloads import make_delivery, quick_reply_item, sign_delivery, text_item
from switchboard.channels.meta.messaging.fake.platform import FakeMessenger
from switchboard.channels.meta.messenger.settings import MessengerSettings
from switchboard.channels.registry import factory, simulation
from switchboard.cli.worker import run_worker
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from tests.channels.test_instagram import IG, IG_SECRET, IG_TOKEN, instagram_env
from tests.channels.test_messenger import APP_SECRET, CONFIG, PAGE, TOKEN, USER, gateway_env
from tests.waiting import wait_until


async def run_until(
    env: dict[str, str], done: Callable[[], bool | Awaitable[bool]], what: str, act: Callable[[], Awaitable[None]]
) -> None:
    """Run a worker, ``act``, and wait until ``done()`` holds."""
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(load_settings(env), stop))
    try:
        await act()

        async def check() -> bool:
            if worker.done():
                worker.result()  # the worker died: show why
            result = done()
            return await result if not isinstance(result, bool) else result

        await wait_until(check, what)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(worker, return_exceptions=True), 30)


async def test_a_messenger_message_is_answered_with_typing_first(
    aiohttp_client: Any, base_env: dict[str, str], tmp_path: Path
) -> None:
    async with FakeMessenger("messenger", token=TOKEN) as fake:
        env = gateway_env(base_env, tmp_path, fake.graph_url) | {"SWITCHBOARD_OFFLINE__DELAY_MS": "1200"}
        client = await aiohttp_client(create_app(load_settings(env), listeners=False))
        item = text_item("ping **from** messenger", user=USER, account=PAGE, mid="m_e2e1")
        body, headers = sign_delivery(make_delivery("page", [(PAGE, [item])]), APP_SECRET)

        async def post() -> None:
            assert (await client.post("/webhooks/messenger", data=body, headers=headers)).status == 200

        await run_until(env, lambda: bool(fake.delivered(USER)), "a reply on Messenger", post)
        (reply,) = fake.delivered(USER)
        assert "ping from messenger" in reply.body["message"]["text"] and "**" not in reply.body["message"]["text"]
        assert reply.body["messaging_type"] == "RESPONSE" and reply.body["recipient"] == {"id": USER}
        actions = [c for c in fake.calls if "sender_action" in c.body]
        assert actions and actions[0].seq < reply.seq, "typing shows before the reply"


async def test_a_quick_reply_tap_reaches_the_agent_as_the_option_id(
    aiohttp_client: Any, base_env: dict[str, str], tmp_path: Path
) -> None:
    async with FakeMessenger("messenger", token=TOKEN) as fake:
        env = gateway_env(base_env, tmp_path, fake.graph_url)
        client = await aiohttp_client(create_app(load_settings(env), listeners=False))
        tap = quick_reply_item("Tomorrow", "slot-tomorrow", user=USER, account=PAGE, mid="m_tap1")
        body, headers = sign_delivery(make_delivery("page", [(PAGE, [tap])]), APP_SECRET)

        async def post() -> None:
            assert (await client.post("/webhooks/messenger", data=body, headers=headers)).status == 200

        await run_until(env, lambda: bool(fake.delivered(USER)), "the answer to the tap", post)
        assert "slot-tomorrow" in fake.texts(USER)[-1]


async def test_an_offered_choice_round_trips_through_quick_replies(
    aiohttp_client: Any, base_env: dict[str, str], tmp_path: Path
) -> None:
    """The agent offers a choice (quick replies); the tap comes back as that offer's option, checked by the gateway."""
    config = CONFIG.replace("tools: [current_time]", "tools: [current_time, offer_choice]")
    async with FakeMessenger("messenger", token=TOKEN) as fake:
        env = gateway_env(base_env, tmp_path, fake.graph_url, config)
        client = await aiohttp_client(create_app(load_settings(env), listeners=False))
        offer = {"question": "Which slot?", "options": [{"id": "slot-am", "label": "Morning"}, "Afternoon"]}
        ask = text_item(f"/tool offer_choice {json.dumps(offer)}", user=USER, account=PAGE, mid="m_ask1")

        async def post(item: dict[str, Any]) -> None:
            body, headers = sign_delivery(make_delivery("page", [(PAGE, [item])]), APP_SECRET)
            assert (await client.post("/webhooks/messenger", data=body, headers=headers)).status == 200

        def offered() -> bool:
            return any("quick_replies" in c.body["message"] for c in fake.delivered(USER))

        await run_until(env, offered, "the quick replies", lambda: post(ask))
        (offer_call,) = [c for c in fake.delivered(USER) if "quick_replies" in c.body["message"]]
        replies = offer_call.body["message"]["quick_replies"]
        assert [r["title"] for r in replies] == ["Morning", "Afternoon"] and replies[0]["payload"] == "slot-am"
        sent = len(fake.delivered(USER))
        tap = quick_reply_item("Morning", "slot-am", user=USER, account=PAGE, mid="m_tap2")
        await run_until(env, lambda: len(fake.delivered(USER)) > sent, "the answer to the tap", lambda: post(tap))
        answer = fake.texts(USER)[-1]
        assert "chose option slot-am (Morning)" in answer and "not offered" not in answer


async def test_an_instagram_message_is_answered(aiohttp_client: Any, base_env: dict[str, str]) -> None:
    async with FakeMessenger("instagram", token=IG_TOKEN) as fake:
        env = base_env | instagram_env(fake.graph_url)
        client = await aiohttp_client(create_app(load_settings(env), listeners=False))
        user = "1120000000000009"
        item = text_item("salut, ça va? 🙂", user=user, account=IG, mid="ig_e2e1")
        body, headers = sign_delivery(make_delivery("instagram", [(IG, [item])]), IG_SECRET)

        async def post() -> None:
            assert (await client.post("/webhooks/instagram", data=body, headers=headers)).status == 200

        await run_until(env, lambda: bool(fake.delivered(user)), "a reply on Instagram", post)
        assert "ça va? 🙂" in fake.texts(user)[0]


@pytest.mark.parametrize(("channel", "variable"), [("messenger", "PAGE_ACCESS_TOKEN"), ("instagram", "ACCESS_TOKEN")])
async def test_the_simulation_speaks_to_the_gateway_and_reads_the_reply(
    aiohttp_client: Any, base_env: dict[str, str], channel: str, variable: str
) -> None:
    """What `switchboard run` without credentials and `switchboard simulate <channel> "text"` do."""
    found = factory(channel)
    assert found is not None
    sim = simulation(found)
    assert sim is not None
    block, running = await sim.start(found.settings())
    try:
        assert isinstance(block, MessengerSettings | InstagramSettings) and found.problems(block) == []
        prefix = f"SWITCHBOARD_{channel.upper()}__"
        values = block.model_dump(exclude_none=True)
        env = base_env | {
            prefix + key.upper(): (value.get_secret_value() if hasattr(value, "get_secret_value") else str(value))
            for key, value in values.items()
        }
        assert prefix + variable in env
        client = await aiohttp_client(create_app(load_settings(env), listeners=False))
        details = sim.details(block)
        sample = sim.request(details, "hello from the simulator")
        replies: list[str] = []
        async with aiohttp.ClientSession() as http:

            async def post() -> None:
                resp = await client.post(f"/webhooks/{channel}", data=sample.body, headers=dict(sample.headers))
                assert resp.status == 200

            async def replied() -> bool:
                replies[:] = await sim.replies(http, details, sample.conversation)
                return bool(replies)

            await run_until(env, replied, "the simulated reply", post)
        assert "hello from the simulator" in replies[0]
    finally:
        await running.stop()
