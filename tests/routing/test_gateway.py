"""Routing between agents through the real gateway: signed webhooks, real Redis, the worker, fake platforms.

Bindings (``routing:``) are checked per channel, the ``handoff`` tool end to end (the next message is answered by
the other agent, with the history its settings allow; the policy can refuse it; ``/new`` ends it).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient

from switchboard.channels.slack.fake.payloads import make_event, make_slash_command, sign_request
from switchboard.channels.slack.fake.platform import FakeSlack
from switchboard.cli.worker import run_worker
from switchboard.queue.keys import SessionKeys
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from switchboard.web.app import create_app
from tests.channels.slack_support import BOT_TOKEN as SLACK_TOKEN
from tests.channels.slack_support import SECRET as SLACK_SECRET
from tests.channels.test_telegram import BOT, SECRET, TOKEN
from tests.fakes.telegram_api import FakeTelegram, check_html, make_update, sign_update
from tests.shardindexes import members_of
from tests.waiting import wait_until

AGENTS = """
default_agent: sales
agents:
  sales:
    profile: {name: Sales}
    instructions: You sell.
    limits: {max_output_tokens: 64}
  billing:
    profile: {name: Billing}
    instructions: You answer billing questions.
    limits: {max_output_tokens: 64}
  ops:
    profile: {name: Ops}
    instructions: You help the operators.
    limits: {max_output_tokens: 64}
"""


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        yield server


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(bot_token=SLACK_TOKEN) as server:
        yield server


class Gateway:
    """The web app and one worker over the same settings."""

    def __init__(self, client: TestClient, worker: asyncio.Task[None]) -> None:
        self.client = client
        self.worker = worker
        self.update_id = 100

    async def until(self, check: Callable[[], Awaitable[bool] | bool], what: str) -> None:
        async def done() -> bool:
            if self.worker.done():
                self.worker.result()
            result = check()
            return bool(await result) if not isinstance(result, bool) else result

        await wait_until(done, what, timeout=60)

    async def telegram(
        self, text: str, chat_id: int = 501, *, user_id: int | None = None, chat_type: str = "private"
    ) -> None:
        self.update_id += 1
        mention = BOT if chat_type != "private" else None  # a group message reaches the bot when it mentions it
        update = make_update(
            text, chat_id=chat_id, update_id=self.update_id, user_id=user_id, chat_type=chat_type, mention=mention
        )
        if text.startswith("/") and not text.startswith("/tool "):  # as Telegram marks a command
            update["message"]["entities"] = [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
        body, headers = sign_update(update, SECRET)
        assert (await self.client.post("/webhooks/telegram", data=body, headers=headers)).status == 200

    async def slack(self, text: str) -> None:
        body, headers = sign_request(make_event(text), SLACK_SECRET)
        assert (await self.client.post("/webhooks/slack", data=body, headers=headers)).status == 200

    async def slack_command(self, command: str, text: str = "") -> None:
        body, headers = sign_request(make_slash_command(command, text), SLACK_SECRET, form=True)
        assert (await self.client.post("/webhooks/slack", data=body, headers=headers)).status == 200


Start = Callable[[str], Awaitable[Gateway]]


@pytest.fixture
async def start(
    base_env: dict[str, str], tmp_path: Path, telegram: FakeTelegram, slack: FakeSlack, aiohttp_client: Any
) -> AsyncIterator[Start]:
    stops: list[tuple[asyncio.Event, asyncio.Task[None]]] = []

    async def started(config: str) -> Gateway:
        path = tmp_path / "routing.yaml"
        path.write_text(config)
        env = base_env | {
            "SWITCHBOARD_CONFIG": str(path),
            "SWITCHBOARD_TELEGRAM__BOT_TOKEN": TOKEN,
            "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
            "SWITCHBOARD_TELEGRAM__API_BASE_URL": telegram.base_url,
            "SWITCHBOARD_SLACK__BOT_TOKEN": SLACK_TOKEN,
            "SWITCHBOARD_SLACK__SIGNING_SECRET": SLACK_SECRET,
            "SWITCHBOARD_SLACK__API_BASE_URL": slack.api_url,
        }
        client = await aiohttp_client(create_app(load_settings(env), listeners=False))
        stop = asyncio.Event()
        worker = asyncio.create_task(run_worker(load_settings(env), stop))
        stops.append((stop, worker))
        return Gateway(client, worker)

    yield started
    for stop, worker in stops:
        stop.set()
        await asyncio.wait_for(asyncio.gather(worker, return_exceptions=True), 30)


def replies(fake: FakeTelegram, chat_id: int = 501) -> list[str]:
    return [check_html(call.params["text"]) for call in fake.sent(chat_id)]


async def agents_of(redis: aioredis.Redis, channel: str) -> list[str]:
    """The agents of every session of ``channel`` that has a history (someone answered there)."""
    found = []
    for member in await members_of(redis, lambda s: s.sessions):
        session = member.decode()
        parts = session.split("/")
        if parts[2] == channel and await redis.exists(SessionKeys(SessionKey(session)).history):
            found.append(parts[1])
    return sorted(found)


async def history(redis: aioredis.Redis, session: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in await redis.lrange(SessionKeys(SessionKey(session)).history, 0, -1)]


async def said(redis: aioredis.Redis, session: str, text: str) -> bool:
    """Whether the session's history holds ``text`` as a user message followed by an answer."""
    found = await history(redis, session)
    return any(e["role"] == "user" and e["text"] == text for e in found[:-1]) and found[-1]["role"] == "assistant"


async def events(redis: aioredis.Redis, session: str) -> list[dict[str, Any]]:
    found: Any = await redis.xrange(SessionKeys(SessionKey(session)).events)
    return [{"kind": f[b"kind"].decode(), **json.loads(f.get(b"data", b"{}"))} for _id, f in found]


ACCESS = """
channels:
  telegram:
    access: {roles: {"telegram:42": admin}}
"""

# binding (YAML), how the message is sent, the agent that must answer it
BINDINGS = [
    pytest.param("[{match: {keyword: invoice}, agent: billing}]", ("telegram", "my invoice is wrong"), "billing"),
    pytest.param("[{match: {keyword: invoice}, agent: billing}]", ("telegram", "hello there"), "sales"),
    pytest.param("[{match: {keyword: late fee}, agent: billing}]", ("telegram", "why a LATE   fee?"), "billing"),
    pytest.param("[{match: {command: billing}, agent: billing}]", ("telegram", "/billing refund"), "billing"),
    pytest.param("[{match: {command: /billing}, agent: billing}]", ("slack_command", "/billing"), "billing"),
    pytest.param("[{match: {channel: slack}, agent: billing}]", ("slack", "hi from slack"), "billing"),
    pytest.param("[{match: {channel: slack}, agent: billing}]", ("telegram", "hi from telegram"), "sales"),
    pytest.param("[{match: {user: 'telegram:77'}, agent: ops}]", ("telegram_77", "hi"), "ops"),
    pytest.param("[{match: {user: 'slack:U0HUMAN'}, agent: ops}]", ("slack", "hi"), "ops"),
    pytest.param("[{match: {role: admin}, agent: ops}]", ("telegram_42", "hi"), "ops"),
    pytest.param("[{match: {role: admin}, agent: ops}]", ("telegram", "hi"), "sales"),
    pytest.param("[{match: {group: '*'}, agent: ops}]", ("telegram_group", "hi all"), "ops"),
    pytest.param("[{match: {group: '-100'}, agent: ops}, {match: {}, agent: billing}]", ("telegram", "hi"), "billing"),
    pytest.param(
        "[{match: {channel: telegram, keyword: invoice}, agent: billing}, {match: {channel: telegram}, agent: ops}]",
        ("telegram", "invoice please"),
        "billing",
    ),
]


@pytest.mark.parametrize(("binding", "sent", "agent"), BINDINGS)
async def test_a_binding_sends_the_messages_it_matches_to_its_agent(
    start: Start,
    telegram: FakeTelegram,
    slack: FakeSlack,
    async_redis: aioredis.Redis,
    binding: str,
    sent: tuple[str, str],
    agent: str,
) -> None:
    gateway = await start(AGENTS + ACCESS + f"routing: {binding}\n")
    how, text = sent
    match how:
        case "telegram":
            await gateway.telegram(text)
        case "telegram_77":
            await gateway.telegram(text, chat_id=77)
        case "telegram_42":
            await gateway.telegram(text, chat_id=42)
        case "telegram_group":
            await gateway.telegram(text, chat_id=-100, user_id=501, chat_type="group")
        case "slack":
            await gateway.slack(text)
        case "slack_command":
            await gateway.slack_command(text, "refund")
    channel = how.split("_")[0]
    await gateway.until(lambda: agents_of(async_redis, channel), "the answer")  # type: ignore[arg-type,return-value]
    assert await agents_of(async_redis, channel) == [agent]


@pytest.mark.parametrize(
    ("routing", "error"),
    [
        ("[{match: {keyword: x}, agent: nobody}]", "routing[0] sends messages to agent 'nobody'"),
        ("[{match: {channel: fax}, agent: billing}]", "routing[0]: unknown channel 'fax'"),
        ("[{match: {channel: web}, agent: billing}]", "the web chat picks its agent per session"),
        ("[{match: {keyword: x, command: y}, agent: billing}]", "give 'keyword' or 'command', not both"),
        ("[{match: {colour: red}, agent: billing}]", "colour"),
    ],
)
async def test_a_binding_naming_what_does_not_exist_is_a_config_error(
    base_env: dict[str, str], tmp_path: Path, routing: str, error: str
) -> None:
    from switchboard.errors import ConfigError

    path = tmp_path / "bad.yaml"
    path.write_text(AGENTS + f"routing: {routing}\n")
    with pytest.raises(ConfigError, match=error.replace("[", r"\[").replace("]", r"\]")):
        create_app(load_settings(base_env | {"SWITCHBOARD_CONFIG": str(path)}), listeners=False)


def test_a_handoff_to_an_undefined_agent_is_a_config_error(base_env: dict[str, str], tmp_path: Path) -> None:
    from switchboard.errors import ConfigError

    path = tmp_path / "bad.yaml"
    path.write_text(AGENTS.replace("instructions: You sell.", "instructions: You sell.\n    handoff: {to: [legal]}"))
    with pytest.raises(ConfigError, match=re.escape("agents.sales.handoff.to names 'legal'")):
        load_settings(base_env | {"SWITCHBOARD_CONFIG": str(path)})


def handoff_config(history: str, policy: str = "") -> str:
    sales = f"tools: [handoff]\n    handoff: {{to: [billing], history: {history}}}\n" + (
        f"    policy: {policy}\n" if policy else ""
    )
    return AGENTS.replace("instructions: You sell.\n", "instructions: You sell.\n    " + sales, 1)


HANDOFF = '/tool handoff {"agent": "billing", "reason": "a billing question", "note": "wants a refund of order 7"}'
SALES = "default/sales/telegram/default/501"
BILLING = "default/billing/telegram/default/501"


@pytest.mark.parametrize("mode", ["none", "summary", "full"])
async def test_a_handoff_sends_the_next_message_to_the_other_agent_with_the_history_it_allows(
    start: Start, telegram: FakeTelegram, async_redis: aioredis.Redis, mode: str
) -> None:
    gateway = await start(handoff_config(mode))
    await gateway.telegram("I ordered shoes, order 7")
    await gateway.until(lambda: len(replies(telegram)) == 1, "sales' first answer")
    await gateway.telegram(HANDOFF)
    await gateway.until(lambda: any("Handing you to Billing" in r for r in replies(telegram)), "the user told")
    await gateway.until(lambda: len(replies(telegram)) == 3, "sales' closing answer")
    [handed] = [e for e in await events(async_redis, SALES) if e["kind"] == "conversation_handed_off"]
    assert (handed["from_agent"], handed["to"], handed["history"]) == ("sales", "billing", mode)
    seen = await history(async_redis, BILLING)  # what billing will read, before anyone wrote to it
    note = seen[-1]["text"]
    assert "agent sales handed this conversation to you" in note and "wants a refund of order 7" in note
    earlier = [e["text"] for e in seen[:-1]]
    match mode:
        case "none":
            assert len(seen) == 1 and "I ordered shoes" not in note
        case "summary":
            assert len(seen) == 1 and "user: I ordered shoes, order 7" in note and "assistant: You said" in note
        case "full":
            assert earlier[0] == "I ordered shoes, order 7" and "You said" in earlier[1]
            assert earlier[-1] == HANDOFF  # the turn that handed over
    assert handed["carried"] == len(seen)
    await gateway.telegram("when is my refund?")
    await gateway.until(lambda: said(async_redis, BILLING, "when is my refund?"), "billing's answer")
    assert "when is my refund?" not in [e["text"] for e in await history(async_redis, SALES)]
    await gateway.telegram("/new")  # ends the handoff: the next message goes to the configured agent again
    await gateway.until(lambda: len(replies(telegram)) == 5, "the reset confirmed")
    await gateway.telegram("back to shoes")
    await gateway.until(lambda: said(async_redis, SALES, "back to shoes"), "sales' answer")
    assert await history(async_redis, BILLING) == []  # /new forgot billing's side of the conversation


@pytest.mark.parametrize(
    ("config", "why"),
    [
        pytest.param(handoff_config("summary", "{rules: [{tool: handoff, decide: refuse}]}"), "policy", id="policy"),
        pytest.param(
            handoff_config("summary").replace("to: [billing]", "to: [ops]"), "may not hand", id="not-a-target"
        ),
    ],
)
async def test_a_refused_handoff_leaves_the_conversation_with_its_agent(
    start: Start, telegram: FakeTelegram, async_redis: aioredis.Redis, config: str, why: str
) -> None:
    gateway = await start(config)
    await gateway.telegram(HANDOFF)
    await gateway.until(lambda: len(replies(telegram)) == 1, "the answer")
    assert not any("Handing you" in r for r in replies(telegram))
    assert not [e for e in await events(async_redis, SALES) if e["kind"] == "conversation_handed_off"]
    [called] = [e for e in await events(async_redis, SALES) if e["kind"] == "tool_called"]
    assert called["tool"] == "handoff" and not called["ok"]
    assert why in str(called.get("policy")) + str(called.get("error_class")) + replies(telegram)[0]
    await gateway.telegram("still there?")
    await gateway.until(lambda: len(replies(telegram)) == 2, "the next answer")
    assert await agents_of(async_redis, "telegram") == ["sales"]


def test_the_handoff_tool_without_a_handoff_block_is_a_config_error(base_env: dict[str, str], tmp_path: Path) -> None:
    from switchboard.errors import ConfigError

    path = tmp_path / "bad.yaml"
    path.write_text(AGENTS.replace("instructions: You sell.", "instructions: You sell.\n    tools: [handoff]"))
    with pytest.raises(ConfigError, match=re.escape("agents.sales has the handoff tool but no handoff block")):
        load_settings(base_env | {"SWITCHBOARD_CONFIG": str(path)})
