"""Chat commands through the real gateway, each × role: answered without the model, refused to a role that may not.

Senders: ``telegram:42`` is an admin, ``telegram:66`` a guest, everyone else a user (access control's ``roles``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.channels.discord.fake.platform import FakeDiscord, make_command, sign_interaction
from switchboard.channels.slack.fake.platform import FakeSlack
from switchboard.cli.worker import run_worker
from switchboard.queue.keys import SessionKeys
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from switchboard.web.app import create_app
from tests.channels._discord_fixtures import APP_ID, BOT_ID, KEY, PUBLIC_KEY
from tests.channels._discord_fixtures import TOKEN as DISCORD_TOKEN
from tests.fakes.telegram_api import FakeTelegram
from tests.routing.test_gateway import AGENTS, Start, events, replies, slack, start, telegram  # noqa: F401
from tests.waiting import wait_until

CONFIG = (
    AGENTS.replace(
        "instructions: You sell.\n",
        "instructions: You sell.\n    model: offline\n    models_allowed: [offline, 'offline:careful']\n",
        1,
    )
    + """
channels:
  telegram:
    access: {roles: {"telegram:42": admin, "telegram:66": guest}}
commands:
  billing: {roles: [admin], description: Talk to billing}
  usage: {roles: [admin, user]}
"""
)


@pytest.fixture
async def discord() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(DISCORD_TOKEN, bot_id=BOT_ID, application_id=APP_ID) as server:
        yield server


ROLE_CHAT = {"admin": 42, "user": 501, "guest": 66}

# command, role, what the answer holds (or ``!text``: must not hold)
CASES = [
    ("/help", "user", ["/new — Start a new conversation", "/status", "/usage", "/whoami", "!/model", "!/billing"]),
    ("/help", "admin", ["/model — Show or switch", "/billing — Talk to billing", "/usage"]),
    ("/help", "guest", ["/status", "/whoami", "!/usage", "!/model", "!/link"]),
    ("/whoami", "user", ["You are telegram:501 (role: user)."]),
    ("/whoami", "admin", ["You are telegram:42 (role: admin)."]),
    ("/whoami", "guest", ["You are telegram:66 (role: guest)."]),
    ("/status", "user", ["Agent: Sales (sales)", "Model: offline", "State: done", "Messages waiting: 0"]),
    ("/status", "guest", ["Agent: Sales (sales)"]),
    ("/usage", "user", ["No budget applies to you here"]),
    ("/usage", "guest", ["/usage is not available to you here"]),
    ("/model", "user", ["/model is not available to you here"]),
    ("/model", "guest", ["/model is not available to you here"]),
    ("/model", "admin", ["This conversation uses offline. Models you can switch to: offline, offline:careful."]),
    ("/model gpt-9", "admin", ["gpt-9 is not one of the models this agent allows: offline, offline:careful."]),
    ("/billing", "user", ["/billing is not available to you here"]),
    ("/billing", "admin", ['You said: "/billing"']),  # allowed: a command of the file's own reaches the model
]


@pytest.mark.parametrize(("command", "role", "expected"), CASES)
async def test_each_command_answers_each_role_without_the_model(
    start: Start,  # noqa: F811
    telegram: FakeTelegram,  # noqa: F811
    async_redis: aioredis.Redis,
    command: str,
    role: str,
    expected: list[str],
) -> None:
    gateway = await start(CONFIG)
    chat = ROLE_CHAT[role]
    await gateway.telegram(command, chat_id=chat)
    await gateway.until(lambda: len(replies(telegram, chat)) == 1, "the answer")
    answer = replies(telegram, chat)[0]
    for piece in expected:
        if piece.startswith("!"):
            assert piece[1:] not in answer
        else:
            assert piece in answer
    log = await events(async_redis, f"default/sales/telegram/default/{chat}")
    metered = [e for e in log if e["kind"] == "usage_metered"]
    if command == "/billing" and role == "admin":
        assert metered and metered[0]["steps"] == 1
        return
    assert not [m for m in metered if m["steps"]]  # the model was not asked
    name = command.split()[0][1:]
    if name == "usage" and role != "guest":
        return  # the budgets' answer (switchboard.worker.budgets)
    [fact] = [e for e in log if e["kind"] == "command_answered"]
    refused = "not available to you" in answer
    assert (fact["command"], fact["role"], fact["outcome"]) == (name, role, "refused" if refused else "answered")


async def test_model_switches_this_conversation_and_new_switches_it_back(
    start: Start,  # noqa: F811
    telegram: FakeTelegram,  # noqa: F811
    async_redis: aioredis.Redis,
) -> None:
    gateway = await start(CONFIG)
    session = "default/sales/telegram/default/42"
    await gateway.telegram("/model offline:careful", chat_id=42)
    await gateway.until(lambda: len(replies(telegram, 42)) == 1, "the switch")
    assert replies(telegram, 42)[0].startswith("This conversation now uses offline:careful.")
    await gateway.telegram("hello", chat_id=42)
    await gateway.until(lambda: len(replies(telegram, 42)) == 2, "the answer")
    await gateway.telegram("/status", chat_id=42)
    await gateway.until(lambda: len(replies(telegram, 42)) == 3, "the status")
    assert "Model: offline:careful" in replies(telegram, 42)[2]
    log = await events(async_redis, session)
    assert [e["model"] for e in log if e["kind"] == "usage_metered" and e["steps"]] == ["offline:careful"]
    [switched] = [e for e in log if e["kind"] == "command_answered" and e["outcome"] == "switched"]
    assert switched["detail"] == "offline:careful"
    await gateway.telegram("hello", chat_id=501)  # another conversation keeps the agent's model
    await gateway.until(lambda: len(replies(telegram, 501)) == 1, "the other answer")
    other = await events(async_redis, "default/sales/telegram/default/501")
    assert [e["model"] for e in other if e["kind"] == "usage_metered"] == ["offline"]
    await gateway.telegram("/new", chat_id=42)
    await gateway.until(lambda: len(replies(telegram, 42)) == 4, "the reset")
    assert not await async_redis.exists(SessionKeys(SessionKey(session)).model)
    await gateway.telegram("/status", chat_id=42)
    await gateway.until(lambda: len(replies(telegram, 42)) == 5, "the status")
    assert "Model: offline\n" in replies(telegram, 42)[4] + "\n"


async def test_status_counts_the_messages_waiting_behind_it(
    start: Start,  # noqa: F811
    telegram: FakeTelegram,  # noqa: F811
) -> None:
    gateway = await start(CONFIG.replace("limits: {max_output_tokens: 64}", "limits: {max_output_tokens: 64}", 1))
    await gateway.telegram("/status")
    for text in ("one", "two"):
        await gateway.telegram(text)
    await gateway.until(lambda: len(replies(telegram)) >= 1, "the status")
    status = replies(telegram)[0]
    assert "State: " in status and "Messages waiting: " in status
    waiting = int(status.rsplit("Messages waiting: ", 1)[1].split()[0])
    assert 0 <= waiting <= 2
    assert ("State: queued" in status) == (waiting > 0)


async def test_typed_commands_are_recognised_where_the_platform_has_none(
    start: Start,  # noqa: F811
    slack: FakeSlack,  # noqa: F811
) -> None:
    gateway = await start(CONFIG)
    await gateway.slack("/whoami")  # a Slack message (not a slash command): typed text
    await gateway.until(lambda: len(slack.sent(channel="D0DIRECT")) == 1, "the answer")
    assert str(slack.sent(channel="D0DIRECT")[0].params["text"]).startswith("You are slack:U0HUMAN (role: user)")
    await gateway.slack("/etc/hosts is a file")  # not a command: the model reads it
    await gateway.until(lambda: len(slack.sent(channel="D0DIRECT")) == 2, "the answer")
    assert "You said" in str(slack.sent(channel="D0DIRECT")[1].params["text"])


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("status", "Agent: Sales (sales)"),
        ("whoami", "You are discord:501 (role: user)."),
        ("model", "/model is not available to you here"),
        ("help", "/whoami — Who I think you are"),
    ],
)
async def test_discord_slash_commands_are_answered_by_the_gateway(
    base_env: dict[str, str], tmp_path: Path, aiohttp_client: Any, discord: FakeDiscord, command: str, expected: str
) -> None:
    path = tmp_path / "discord.yaml"
    path.write_text(CONFIG)
    env = base_env | {
        "SWITCHBOARD_CONFIG": str(path),
        "SWITCHBOARD_DISCORD__BOT_TOKEN": DISCORD_TOKEN,
        "SWITCHBOARD_DISCORD__PUBLIC_KEY": PUBLIC_KEY,
        "SWITCHBOARD_DISCORD__APPLICATION_ID": APP_ID,
        "SWITCHBOARD_DISCORD__API_BASE_URL": discord.api_url,
        "SWITCHBOARD_DISCORD__GATEWAY": "false",
    }
    client = await aiohttp_client(create_app(load_settings(env), listeners=False))
    body, headers = sign_interaction(make_command(command, token=f"tok-{command}"), KEY)
    assert (await client.post("/webhooks/discord", data=body, headers=headers)).status == 200
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(load_settings(env), stop))

    def answered() -> list[str]:
        calls = [c for c in discord.calls if c.token == f"tok-{command}" and c.method in ("POST", "PATCH")]
        return [str(c.body.get("content", "")) for c in calls]

    try:
        await wait_until(lambda: any(expected in text for text in answered()), f"the answer to /{command}")
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
