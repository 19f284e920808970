"""Secrets never leak: bot tokens, signing secrets and interaction tokens stay out of logs, the event log and the
model's context, through a whole turn (signed webhook → Redis → worker → offline model → reply on the fake)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

from switchboard.channels.discord.fake.platform import FakeDiscord, make_command, sign_interaction
from switchboard.channels.slack.fake.payloads import make_event, sign_request
from switchboard.channels.slack.fake.platform import FakeSlack
from switchboard.cli.worker import run_worker
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from tests.channels._discord_fixtures import APP_ID, BOT_ID, KEY, PUBLIC_KEY
from tests.channels._discord_fixtures import TOKEN as DISCORD_TOKEN
from tests.fakes.telegram_api import FakeTelegram, make_update, sign_update
from tests.waiting import wait_until

TELEGRAM_TOKEN = "424242:TELEGRAMBOTTOKENSECRETVALUE"
TELEGRAM_SECRET = "TELEGRAMWEBHOOKSECRETVALUE"
SLACK_TOKEN = "xoxb-SLACKBOTTOKENSECRETVALUE"
SLACK_SECRET = "SLACKSIGNINGSECRETVALUE"
INTERACTION_TOKEN = "aW50ZXJhY3Rpb246INTERACTIONTOKENSECRETVALUE"


@pytest.fixture
async def platforms() -> AsyncIterator[tuple[FakeTelegram, FakeSlack, FakeDiscord]]:
    async with (
        FakeTelegram(token=TELEGRAM_TOKEN, username="secret_bot") as telegram,
        FakeSlack(bot_token=SLACK_TOKEN) as slack,
        FakeDiscord(DISCORD_TOKEN, bot_id=BOT_ID, application_id=APP_ID) as discord,
    ):
        yield telegram, slack, discord


def keys_holding(r: redis.Redis, needle: bytes) -> list[bytes]:
    """Every key whose value (any type) contains ``needle``."""
    found = []
    for key in r.keys("*"):
        kind = r.type(key)
        if kind == b"string":
            values = [r.get(key) or b""]
        elif kind == b"hash":
            values = [*r.hkeys(key), *r.hvals(key)]
        elif kind == b"list":
            values = r.lrange(key, 0, -1)
        elif kind == b"set":
            values = list(r.smembers(key))
        elif kind == b"zset":
            values = [m for m, _ in r.zrange(key, 0, -1, withscores=True)]
        elif kind == b"stream":
            values = [v for _, fields in r.xrange(key) for pair in fields.items() for v in pair]
        else:
            values = [r.dump(key) or b""]
        if any(needle in value for value in values) or needle in key:
            found.append(key)
    return found


async def test_no_secret_reaches_a_log_the_event_log_or_the_model(
    base_env: dict[str, str],
    platforms: tuple[FakeTelegram, FakeSlack, FakeDiscord],
    aiohttp_client: Any,
    sync_redis: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    telegram, slack, discord = platforms
    env = base_env | {
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": TELEGRAM_TOKEN,
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": TELEGRAM_SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": telegram.base_url,
        "SWITCHBOARD_SLACK__BOT_TOKEN": SLACK_TOKEN,
        "SWITCHBOARD_SLACK__SIGNING_SECRET": SLACK_SECRET,
        "SWITCHBOARD_SLACK__API_BASE_URL": slack.api_url,
        "SWITCHBOARD_DISCORD__BOT_TOKEN": DISCORD_TOKEN,
        "SWITCHBOARD_DISCORD__PUBLIC_KEY": PUBLIC_KEY,
        "SWITCHBOARD_DISCORD__APPLICATION_ID": APP_ID,
        "SWITCHBOARD_DISCORD__API_BASE_URL": discord.api_url,
        "SWITCHBOARD_DISCORD__GATEWAY": "false",
    }
    client = await aiohttp_client(create_app(load_settings(env), listeners=False))
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(load_settings(env), stop))
    try:
        body, headers = sign_update(make_update("hello telegram", chat_id=501, update_id=77), TELEGRAM_SECRET)
        assert (await client.post("/webhooks/telegram", data=body, headers=headers)).status == 200
        body, headers = sign_request(make_event("hello slack"), SLACK_SECRET)
        assert (await client.post("/webhooks/slack", data=body, headers=headers)).status == 200
        ask = make_command("ask", "hello discord", application_id=APP_ID, token=INTERACTION_TOKEN)
        body, headers = sign_interaction(ask, KEY)
        assert (await client.post("/webhooks/discord", data=body, headers=headers)).status == 200
        for bad in ({"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET[:-1]}, {}):
            await client.post("/webhooks/telegram", data=b"{}", headers=bad)

        async def all_replied() -> bool:
            if worker.done():
                worker.result()
            discord_texts = [m.get("content") or "" for m in discord.state.messages.values()]
            slack_texts = [str(m.get("text")) for m in slack.state.messages.values()]
            return (
                bool(telegram.sent(501))
                and any("slack" in t for t in slack_texts)
                and any("discord" in t for t in discord_texts)
            )

        await wait_until(all_replied, "a reply on every platform", timeout=60)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(worker, return_exceptions=True), 30)
    secrets = {
        "telegram bot token": TELEGRAM_TOKEN,
        "telegram webhook secret": TELEGRAM_SECRET,
        "slack bot token": SLACK_TOKEN,
        "slack signing secret": SLACK_SECRET,
        "discord bot token": DISCORD_TOKEN,
        "discord interaction token": INTERACTION_TOKEN,
    }
    own_records = [r for r in caplog.records if r.name.startswith("switchboard") and "fakes" not in r.name]
    for what, secret in secrets.items():
        logged = [r.getMessage()[:200] for r in own_records if secret in r.getMessage() or secret in str(r.exc_text)]
        assert logged == [], (what, logged)
        for key in keys_holding(sync_redis, secret.encode()):
            assert not key.endswith((b":events", b":history", b":ledger")), (what, key)
            assert secret == INTERACTION_TOKEN, (what, key)  # a bot credential is never stored at all
    replies = [m.get("content") or "" for m in discord.state.messages.values()]
    replies += [c.params.get("text", "") for c in telegram.sent(501)]
    replies += [str(m.get("text")) for m in slack.state.messages.values()]
    assert not any(secret in reply for reply in replies for secret in secrets.values())
