"""Telegram through the real gateway: the webhook route, durable ingest, the worker, and long polling."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from switchboard.cli.worker import run_worker
from switchboard.queue.keys import SessionKeys
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from switchboard.web.app import create_app
from tests.channels.test_telegram import BOT, SECRET, TOKEN
from tests.fakes.telegram_api import SECRET_HEADER, FakeTelegram, check_html, make_update, sign_update
from tests.waiting import wait_until


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        yield server


@pytest.fixture
def gateway_env(base_env: dict[str, str], fake: FakeTelegram) -> dict[str, str]:
    return {
        **base_env,
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": TOKEN,
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": fake.base_url,
    }


async def keyspace(redis_url: str) -> list[bytes]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        return sorted(await client.keys("*"))
    finally:
        await client.aclose()


async def inbox(redis_url: str, session: str) -> list[bytes]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        return list(await client.lrange(SessionKeys(SessionKey(session)).inbox, 0, -1))
    finally:
        await client.aclose()


async def test_the_webhook_route_checks_the_secret_then_ingests_once(
    aiohttp_client: Any, gateway_env: dict[str, str], redis_url: str
) -> None:
    client = await aiohttp_client(create_app(load_settings(gateway_env)))
    update = make_update("hello gateway", chat_id=501, update_id=31337)
    body, headers = sign_update(update, SECRET)
    before = await keyspace(redis_url)
    for bad in ({}, {SECRET_HEADER: "wrong"}, {SECRET_HEADER: SECRET.upper()}):
        resp = await client.post("/webhooks/telegram", data=body, headers={"Content-Type": "application/json", **bad})
        assert resp.status in (401, 403)
    resp = await client.post("/webhooks/telegram", data=b"{not json", headers=headers)
    assert resp.status == 400
    group = make_update("chatter", chat_id=-5, update_id=31338, chat_type="group")
    resp = await client.post("/webhooks/telegram", data=sign_update(group, SECRET)[0], headers=headers)
    assert resp.status == 200
    assert await keyspace(redis_url) == before  # refused and ignored requests wrote nothing

    for _ in range(3):  # Telegram retrying the same update
        resp = await client.post("/webhooks/telegram", data=body, headers=headers)
        assert resp.status == 200 and await resp.json() == {"ok": True}
    assert len(await inbox(redis_url, "default/assistant/telegram/default/501")) == 1


async def test_two_thousand_mutated_requests_are_refused_and_write_nothing(
    aiohttp_client: Any, gateway_env: dict[str, str], redis_url: str
) -> None:
    client = await aiohttp_client(create_app(load_settings(gateway_env)))
    body, _ = sign_update(make_update("hello", chat_id=501, update_id=1), SECRET)
    before = await keyspace(redis_url)
    rng = random.Random(88)
    statuses: dict[int, int] = {}
    secret = SECRET.encode()
    for n in range(2000):
        headers = {"Content-Type": "application/json"}
        kind = n % 4
        if kind == 0:  # one flipped bit (kept within printable ASCII so the header is sent as is)
            raw = bytearray(secret)
            index = rng.randrange(len(raw))
            raw[index] = (raw[index] ^ (1 << rng.randrange(6))) % 94 + 33
            if bytes(raw) == secret:
                raw[index] = raw[index] % 94 + 34
            headers[SECRET_HEADER] = raw.decode()
        elif kind == 1:  # another secret entirely
            headers[SECRET_HEADER] = "".join(rng.choice("abcXYZ019_-") for _ in range(rng.randint(1, 40)))
        elif kind == 2:  # truncated or extended
            headers[SECRET_HEADER] = SECRET[: rng.randrange(len(SECRET))] if n % 8 == 2 else SECRET + "x"
        # kind 3: no header at all
        mutated = bytearray(body)
        mutated[rng.randrange(len(mutated))] ^= 1 << rng.randrange(8)  # the body is corrupted too, sometimes fatally
        resp = await client.post("/webhooks/telegram", data=bytes(mutated), headers=headers)
        statuses[resp.status] = statuses.get(resp.status, 0) + 1
    assert set(statuses) <= {401, 403} and statuses.get(401, 0) >= 500  # the 500 without a header: 401
    assert await keyspace(redis_url) == before


async def test_a_private_message_is_answered_on_telegram(
    aiohttp_client: Any, gateway_env: dict[str, str], fake: FakeTelegram
) -> None:
    slow = {**gateway_env, "SWITCHBOARD_OFFLINE__DELAY_MS": "1500"}  # a run long enough to show typing
    client = await aiohttp_client(create_app(load_settings(slow)))
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(load_settings(slow), stop))
    body, headers = sign_update(make_update("ping **from** telegram", chat_id=501, update_id=5, message_id=44), SECRET)
    try:
        resp = await client.post("/webhooks/telegram", data=body, headers=headers)
        assert resp.status == 200

        async def replied() -> bool:
            if worker.done():
                worker.result()  # the worker died: show why
            return bool(fake.sent(501))

        await wait_until(replied, "a reply on Telegram")
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(worker, return_exceptions=True), 30)
    [call] = fake.sent(501)
    assert "ping from telegram" in check_html(call.params["text"])
    assert call.params["parse_mode"] == "HTML"
    assert call.params["reply_parameters"]["message_id"] == 44
    typing = fake.sent(501, method="sendChatAction")
    assert typing, "a typing action while the run was in progress"
    assert typing[0].seq < fake.sent(501)[0].seq, "typing shows before the reply"


async def test_long_polling_end_to_end_with_offsets_confirmed_after_durable_accept(
    aiohttp_client: Any, gateway_env: dict[str, str], fake: FakeTelegram, redis_url: str
) -> None:
    """No public URL: the web process polls getUpdates under the listener lease, the worker answers."""
    env = {**gateway_env, "SWITCHBOARD_TELEGRAM__TRANSPORT": "polling"}
    del env["SWITCHBOARD_TELEGRAM__SECRET_TOKEN"]  # polling needs no webhook secret
    fake.state.webhook = {"url": "https://old.example/webhooks/telegram", "secret_token": "x"}
    await aiohttp_client(create_app(load_settings(env)))
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(load_settings(env), stop))
    session = "default/assistant/telegram/default/777"
    durable_when_confirmed: list[bool] = []
    checker = aioredis.Redis.from_url(redis_url)

    async def on_poll(offset: int | None) -> None:
        if offset is not None and offset > 60001 and not durable_when_confirmed:
            # this call tells Telegram to forget update 60001: the gateway must hold it durably already
            dedup = SessionKeys(SessionKey(session)).dedup("60001")
            durable_when_confirmed.append(bool(await checker.exists(dedup)))

    fake.state.poll_hooks.append(on_poll)
    try:
        update_id = fake.push_update(make_update("polled hello", chat_id=777, update_id=60001))

        async def confirmed() -> bool:
            return fake.state.confirmed > update_id

        await wait_until(confirmed, "the update confirmed to Telegram")

        async def replied() -> bool:
            if worker.done():
                worker.result()
            return bool(fake.sent(777))

        await wait_until(replied, "a reply to the polled message")
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(worker, return_exceptions=True), 30)
        await checker.aclose()
    assert durable_when_confirmed == [True]
    assert "polled hello" in check_html(fake.sent(777)[0].params["text"])
    assert fake.state.webhook == {}  # polling deleted the webhook first
    assert await inbox(redis_url, session) == []  # handled
    assert fake.state.max_polls_in_flight == 1


async def test_a_choice_round_trip_through_the_gateway(
    aiohttp_client: Any, gateway_env: dict[str, str], fake: FakeTelegram
) -> None:
    """A tap on a button of the bot's message reaches the agent as the option id (the offline model echoes it)."""
    client = await aiohttp_client(create_app(load_settings(gateway_env)))
    async with aiohttp.ClientSession() as http:
        url = f"{fake.base_url}/bot{TOKEN}/sendMessage"
        keyboard = {"inline_keyboard": [[{"text": "Bananas", "callback_data": "opt-bananas"}]]}
        async with http.post(url, json={"chat_id": 501, "text": "Which fruit?", "reply_markup": keyboard}) as resp:
            offer_id = (await resp.json())["result"]["message_id"]
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(load_settings(gateway_env), stop))
    try:
        tap = fake.press_button(501, offer_id, "opt-bananas", update_id=8080)
        body, headers = sign_update(tap, SECRET)
        resp = await client.post("/webhooks/telegram", data=body, headers=headers)
        assert resp.status == 200

        async def replied() -> bool:
            if worker.done():
                worker.result()
            return len(fake.sent(501)) >= 2

        await wait_until(replied, "the agent's answer to the tap")
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(worker, return_exceptions=True), 30)
    answer = check_html(fake.sent(501)[-1].params["text"])
    assert "opt-bananas" in answer


async def test_the_simulation_speaks_to_the_gateway_and_reads_the_reply(
    aiohttp_client: Any, base_env: dict[str, str]
) -> None:
    """What `switchboard run` without a token and `switchboard simulate telegram "text"` do."""
    from switchboard.channels.telegram.fake.simulation import SIMULATION
    from switchboard.channels.telegram.settings import TelegramSettings

    block, running = await SIMULATION.start(TelegramSettings())
    try:
        assert block.bot_token is not None and block.secret_token is not None
        env = {
            **base_env,
            "SWITCHBOARD_TELEGRAM__BOT_TOKEN": block.bot_token.get_secret_value(),
            "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": block.secret_token.get_secret_value(),
            "SWITCHBOARD_TELEGRAM__API_BASE_URL": block.api_base_url,
        }
        client = await aiohttp_client(create_app(load_settings(env)))
        details = SIMULATION.details(block)
        assert set(details) == {"fake_url", "secret_token", "bot_username"}
        sample = SIMULATION.request(details, "hello from the simulator")
        stop = asyncio.Event()
        worker = asyncio.create_task(run_worker(load_settings(env), stop))
        try:
            resp = await client.post("/webhooks/telegram", data=sample.body, headers=dict(sample.headers))
            assert resp.status == 200
            async with aiohttp.ClientSession() as http:

                async def replied() -> bool:
                    return bool(await SIMULATION.replies(http, details, sample.conversation))

                await wait_until(replied, "the simulated reply")
                [reply] = await SIMULATION.replies(http, details, sample.conversation)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(worker, return_exceptions=True), 30)
        assert "hello from the simulator" in reply and "<" not in reply
    finally:
        await running.stop()
