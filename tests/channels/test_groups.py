"""Groups through the real inbound path of every channel with groups: signed webhooks (Discord: its gateway), Redis.

Each case sends messages as the platform would (mentioned, replying to the bot, plain, in a free-response
conversation, in a thread) to ``create_app`` configured with a ``group_replies`` block, then reads what reached the
session queue, what was kept as context, and the facts in the session's event log.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import redis
import yaml
from aiohttp.test_utils import TestClient

from switchboard.channels.discord.adapter import _GatewayListener
from switchboard.channels.discord.fake.payloads import make_message
from switchboard.channels.discord.fake.platform import FakeDiscord
from switchboard.channels.slack.fake.payloads import BOT_USER_ID, make_event
from switchboard.channels.slack.fake.payloads import sign_request as sign_slack
from switchboard.channels.slack.fake.platform import FakeSlack
from switchboard.channels.teams.fake.platform import FakeTeams
from switchboard.channels.telegram.fake.platform import FakeTelegram, make_update, sign_update
from switchboard.core.events import EventAdapter
from switchboard.core.groups import CONTEXT_META, ContextLine
from switchboard.core.messages import InboundMessage
from switchboard.queue.keys import session_in
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from switchboard.web.appkeys import CHANNELS, ROUTER
from tests.channels import _discord_fixtures as discord_kit
from tests.channels import slack_support
from tests.channels import teams_support as teams_kit
from tests.conftest import MINIMAL_CONFIG


def _session(key: str) -> str:
    """The session a session key belongs to."""
    session = session_in(key)
    assert session is not None, key
    return session


TG_SECRET = "webhook_secret-123"
TG_BOT = "switchboard_bot"

GROUP = {"telegram": "-100555", "slack": "C0GROUP", "discord": "300", "teams": "19:group_chat@thread.v2"}
FREE = {"telegram": "-100777", "slack": "C0FREE", "discord": "301", "teams": "19:free_chat@thread.v2"}
THREAD = {"telegram": "7", "slack": "1700000000.000100", "discord": "310", "teams": "1764617400300"}
"""A thread of :data:`GROUP`: a Telegram forum topic, a Slack thread's ``thread_ts``, a Discord thread channel, a Teams
channel post's id (the thread is ``<channel>;messageid=<id>``)."""
SENDER = {"telegram": "4242", "slack": "U0ALLOWED", "discord": "501", "teams": "6b4f1d1e-8f3a-4c55-9b1e-2a7f0c1d2e3f"}


@dataclass
class Rig:
    """One channel's fake platform and how its users' group messages are delivered."""

    name: str
    env: dict[str, str]
    deliver: Callable[[str, str, str, str | None], Awaitable[None]]
    """``(case, conversation, text, thread)`` → delivered; case is ``mention``, ``reply`` or ``plain``."""
    counter: list[int] = field(default_factory=lambda: [100])

    def next_id(self) -> int:
        self.counter[0] += 1
        return self.counter[0]


@dataclass
class Gateway:
    rig: Rig
    client: TestClient
    redis: redis.Redis

    async def say(self, case: str, text: str, *, conversation: str | None = None, thread: str | None = None) -> None:
        await self.rig.deliver(case, conversation or GROUP[self.rig.name], text, thread)

    def queued(self) -> list[tuple[str, InboundMessage]]:
        """(session key, message) of every message in a session queue."""
        found = []
        for key in self.redis.keys("sb:*:messages"):
            session = unquote(_session(key.decode()))
            for body in self.redis.hvals(key):
                found.append((session, InboundMessage.model_validate_json(body)))
        return sorted(found, key=lambda pair: pair[1].received_at)

    def kept(self) -> dict[str, list[ContextLine]]:
        """Session key → its kept group context."""
        return {
            unquote(_session(key.decode())): [
                ContextLine.model_validate_json(item) for item in self.redis.lrange(key, 0, -1)
            ]
            for key in self.redis.keys("sb:*:group_context")
        }

    def events(self, kind: str) -> list[Any]:
        found = []
        for key in self.redis.keys("sb:*:events"):
            for _, fields in self.redis.xrange(key):
                if fields[b"kind"].decode() == kind:
                    found.append(EventAdapter.validate_json(fields[b"data"]))
        return found


async def _post(client: Callable[[], TestClient], path: str, body: bytes, headers: dict[str, str]) -> None:
    resp = await client().post(path, data=body, headers=headers)
    assert resp.status < 300, await resp.text()


async def _telegram(stack: AsyncExitStack, client: Callable[[], TestClient]) -> Rig:
    fake = FakeTelegram(token="42:test")
    await fake.start()
    stack.push_async_callback(fake.stop)
    env = {
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": "42:test",
        "SWITCHBOARD_TELEGRAM__BOT_USERNAME": TG_BOT,
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": TG_SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": fake.base_url,
    }
    rig: Rig

    async def deliver(case: str, conversation: str, text: str, thread: str | None) -> None:
        n = rig.next_id()
        update = make_update(
            text,
            chat_id=int(conversation),
            update_id=n,
            message_id=n,
            chat_type="supergroup",
            user_id=int(SENDER["telegram"]),
            mention=TG_BOT if case == "mention" else None,
            reply_to_bot=TG_BOT if case == "reply" else None,
            bot_id=42,
            thread_id=int(thread) if thread else None,
        )
        await _post(client, "/webhooks/telegram", *sign_update(update, TG_SECRET))

    rig = Rig("telegram", env, deliver)
    return rig


async def _slack(stack: AsyncExitStack, client: Callable[[], TestClient]) -> Rig:
    fake = await stack.enter_async_context(FakeSlack(bot_token=slack_support.BOT_TOKEN))
    env = {
        "SWITCHBOARD_SLACK__BOT_TOKEN": slack_support.BOT_TOKEN,
        "SWITCHBOARD_SLACK__SIGNING_SECRET": slack_support.SECRET,
        "SWITCHBOARD_SLACK__API_BASE_URL": fake.api_url,
    }
    rig: Rig

    async def deliver(case: str, conversation: str, text: str, thread: str | None) -> None:
        extra: dict[str, Any] = {}
        if case == "reply":  # a reply in a thread the bot started
            thread = thread or "1699999999.000900"
            extra["parent_user_id"] = BOT_USER_ID
        elif thread:
            extra["parent_user_id"] = "U0SOMEONE"
        body = f"<@{BOT_USER_ID}> {text}" if case == "mention" else text
        ts = f"{1700000100 + rig.next_id()}.000200"
        event = make_event(
            body, channel=conversation, channel_type="channel", user=SENDER["slack"], ts=ts, thread_ts=thread, **extra
        )
        await _post(client, "/webhooks/slack", *sign_slack(event, slack_support.SECRET))

    rig = Rig("slack", env, deliver)
    return rig


async def _teams(stack: AsyncExitStack, client: Callable[[], TestClient]) -> Rig:
    fake = await stack.enter_async_context(FakeTeams(app_id=teams_kit.APP_ID, app_password=teams_kit.PASSWORD))
    rig: Rig

    async def deliver(case: str, conversation: str, text: str, thread: str | None) -> None:
        assert case != "reply", "Teams names no author of a replied-to message"
        n = rig.next_id()
        if thread is None:
            activity = teams_kit.payload("group_mention.json", fake.service_url)
            activity["conversation"]["id"] = conversation
        else:
            activity = teams_kit.payload("channel_thread_mention.json", fake.service_url)
            activity["conversation"]["id"] = f"19:channel@thread.tacv2;messageid={thread}"
        activity["id"] = f"17646{n:08d}"
        if case == "mention":
            activity["text"] = f"<at>Switchboard</at> {text}"
        else:
            activity["text"] = text
            activity["entities"] = [e for e in activity["entities"] if e["type"] != "mention"]
        await _post(client, "/webhooks/teams", *teams_kit.signed_request(fake, activity))

    rig = Rig("teams", teams_kit.teams_env(fake), deliver)
    return rig


async def _discord(stack: AsyncExitStack, client: Callable[[], TestClient]) -> Rig:
    """Discord's messages come over its gateway: the real listener on the fake gateway, emitting to the router."""
    fake = await stack.enter_async_context(
        FakeDiscord(discord_kit.TOKEN, bot_id=discord_kit.BOT_ID, application_id=discord_kit.APP_ID)
    )
    fake.gateway.heartbeat_interval_ms = 50
    env = {
        "SWITCHBOARD_DISCORD__BOT_TOKEN": discord_kit.TOKEN,
        "SWITCHBOARD_DISCORD__PUBLIC_KEY": discord_kit.PUBLIC_KEY,
        "SWITCHBOARD_DISCORD__APPLICATION_ID": discord_kit.APP_ID,
        "SWITCHBOARD_DISCORD__API_BASE_URL": fake.api_url,
    }
    started: list[asyncio.Task[None]] = []
    handled = asyncio.Event()
    seen: list[str] = []

    async def start() -> None:
        app = client().app
        adapter = app[CHANNELS][("discord", "default")]
        listener = adapter.listener()
        assert isinstance(listener, _GatewayListener)
        emit = app[ROUTER].emit_for(adapter)

        async def emit_and_note(inbound: Any) -> None:
            await emit(inbound)
            seen.extend(m.platform_message_id or "" for m in inbound.messages)
            handled.set()

        started.append(asyncio.create_task(listener.listen(emit_and_note)))
        stack.push_async_callback(_cancel, started[0])
        await fake.gateway.wait_ready()
        guild = {"id": "200", "roles": [{"id": "777", "name": "Switchboard", "tags": {"bot_id": discord_kit.BOT_ID}}]}
        await fake.gateway.dispatch("GUILD_CREATE", guild)
        thread = {"id": THREAD["discord"], "type": 11, "parent_id": GROUP["discord"], "guild_id": "200"}
        await fake.gateway.dispatch("THREAD_CREATE", thread)

    async def deliver(case: str, conversation: str, text: str, thread: str | None) -> None:
        if not started:
            await start()
        channel = thread or conversation
        bot = discord_kit.BOT_ID
        if case == "mention":
            message = make_message(f"<@{bot}> {text}", channel_id=channel, guild_id="200", mentions=[bot])
        elif case == "role":
            message = make_message(f"<@&777> {text}", channel_id=channel, guild_id="200")
            message["mention_roles"] = ["777"]
        else:
            message = make_message(text, channel_id=channel, guild_id="200", author_id=SENDER["discord"])
        if case == "reply":
            message["type"] = 19
            message["referenced_message"] = {"id": "1", "author": {"id": bot, "username": "bot", "bot": True}}
        await fake.gateway.dispatch("MESSAGE_CREATE", message)
        marker = make_message("marker", channel_id="9999")  # a DM after it: handled in order, so it was handled
        await fake.gateway.dispatch("MESSAGE_CREATE", marker)
        deadline = time.monotonic() + 10
        while marker["id"] not in seen:
            assert time.monotonic() < deadline, "the gateway listener did not handle the marker"
            handled.clear()
            await asyncio.wait_for(handled.wait(), 10)

    return Rig("discord", env, deliver)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


RIGS = {"telegram": _telegram, "slack": _slack, "discord": _discord, "teams": _teams}
CHANNELS_WITH_GROUPS = list(RIGS)


def _config(channel: str, options: dict[str, Any]) -> str:
    data = yaml.safe_load(MINIMAL_CONFIG)
    data["channels"] = {channel: options}
    return yaml.safe_dump(data)


@pytest.fixture
async def gateway_for(
    base_env: dict[str, str], tmp_path: Path, aiohttp_client: Any, sync_redis: redis.Redis
) -> AsyncIterator[Callable[[str, dict[str, Any]], Awaitable[Gateway]]]:
    async with AsyncExitStack() as stack:

        async def make(channel: str, options: dict[str, Any]) -> Gateway:
            holder: list[TestClient] = []
            rig = await RIGS[channel](stack, lambda: holder[0])
            config = tmp_path / "groups.yaml"
            config.write_text(_config(channel, options))
            env = base_env | rig.env | {"SWITCHBOARD_CONFIG": str(config), "SWITCHBOARD_QUEUE__INGEST_TIMEOUT_S": "1.0"}
            holder.append(await aiohttp_client(create_app(load_settings(env), listeners=False)))
            return Gateway(rig, holder[0], sync_redis)

        yield make


def _group_keys(gw: Any, channel: str) -> set[bytes]:
    """The keys of the group's sessions: the group is a part of the session key in their hash tag (a substring match
    would also take a marker's key whose random message id happens to hold the group's digits)."""
    group = GROUP[channel]
    found = set()
    for key in gw.redis.keys("*"):
        text = key.decode()
        if session_in(text) is None:
            continue
        session = unquote(_session(text))
        if any(part == group or part.startswith(f"{group};") for part in session.split("/")):
            found.add(key)
    return found


def _not_marker(found: list[tuple[str, InboundMessage]]) -> list[tuple[str, InboundMessage]]:
    return [(s, m) for s, m in found if m.conversation.conversation != "9999"]


# -- answered: mentioned, replied to, free response -------------------------------------------------------------------

ANSWERED = [
    pytest.param(channel, case, id=f"{channel}-{case}")
    for channel in CHANNELS_WITH_GROUPS
    for case in ("mention", "reply", "free_response")
    if not (channel == "teams" and case == "reply")
]


@pytest.mark.parametrize(("channel", "case"), ANSWERED)
async def test_a_group_message_is_answered_when_mentioned_replied_to_or_free_response(
    gateway_for: Any, channel: str, case: str
) -> None:
    gw = await gateway_for(channel, {"group_replies": {"free_response": [FREE[channel]]}})
    if case == "free_response":
        await gw.say("plain", "anyone around?", conversation=FREE[channel])
        await gw.say("plain", "not here", conversation=GROUP[channel])  # the same words elsewhere: ignored
    else:
        await gw.say(case, "anyone around?")
    [(_, message)] = _not_marker(gw.queued())
    assert message.text == "anyone around?"
    assert message.conversation.conversation.split(";")[0] == (FREE if case == "free_response" else GROUP)[channel]
    assert CONTEXT_META not in message.meta, "nothing kept, nothing to fetch"
    assert gw.events("message_received")


@pytest.mark.parametrize("channel", CHANNELS_WITH_GROUPS)
async def test_an_unmentioned_group_message_is_ignored_and_writes_nothing(gateway_for: Any, channel: str) -> None:
    gw = await gateway_for(channel, {})
    await gw.say("mention", "warm up")  # the first request's one-off writes (e.g. Teams' or Slack's identity)
    before = _group_keys(gw, channel)
    size = gw.redis.dbsize()
    await gw.say("plain", "just chatting among ourselves")
    assert [m.text for _, m in _not_marker(gw.queued())] == ["warm up"]
    assert _group_keys(gw, channel) == before
    assert not gw.kept() and not gw.events("context_kept")
    if channel != "discord":  # Discord's marker DM (how the test knows the gateway handled it) writes its own keys
        assert gw.redis.dbsize() == size


@pytest.mark.parametrize("channel", CHANNELS_WITH_GROUPS)
async def test_legacy_require_mention_false_answers_every_group_message(gateway_for: Any, channel: str) -> None:
    gw = await gateway_for(channel, {"require_mention": False})
    await gw.say("plain", "no mention needed")
    assert [m.text for _, m in _not_marker(gw.queued())] == ["no mention needed"]


# -- kept context ------------------------------------------------------------------------------------------------------

KEEP = {"group_replies": {"keep_context": {"enabled": True, "max_messages": 3, "max_chars": 500}}}


@pytest.mark.parametrize("channel", CHANNELS_WITH_GROUPS)
async def test_unmentioned_messages_are_kept_capped_without_a_run_then_the_answered_one_asks_for_them(
    gateway_for: Any, channel: str
) -> None:
    gw = await gateway_for(channel, KEEP)
    for i in range(5):
        await gw.say("plain", f"chatter {i}")
    assert _not_marker(gw.queued()) == [], "a kept message starts no run"
    [(place, lines)] = gw.kept().items()
    assert [line.text for line in lines] == ["chatter 2", "chatter 3", "chatter 4"], "capped at max_messages, newest"
    assert {line.sender for line in lines} == {SENDER[channel]}
    assert GROUP[channel] in place
    kept_events = gw.events("context_kept")
    assert len(kept_events) == 5 and {e.channel for e in kept_events} == {channel}
    ttl = gw.redis.ttl(next(iter(gw.redis.keys("sb:*:group_context"))))
    assert 0 < ttl <= 86_400
    await gw.say("mention", "what did they say?")
    [(session, message)] = _not_marker(gw.queued())
    assert message.text == "what did they say?"
    assert message.meta[CONTEXT_META] == 500, "the answered message asks the worker for up to max_chars of context"
    assert session == place or session.startswith(place + "/"), "its session (or its thread) reads the place's context"


@pytest.mark.parametrize("channel", ["telegram", "slack", "teams"])
async def test_a_platform_retry_of_a_kept_message_is_kept_once(gateway_for: Any, channel: str) -> None:
    gw = await gateway_for(channel, KEEP)
    sent: list[tuple[str, bytes, dict[str, str]]] = []
    original = gw.client.post

    async def recording(path: str, *, data: bytes, headers: dict[str, str]) -> Any:
        sent.append((path, data, headers))
        return await original(path, data=data, headers=headers)

    gw.client.post = recording  # type: ignore[method-assign]
    await gw.say("plain", "said once")
    path, body, headers = sent[0]
    resp = await original(path, data=body, headers=headers)  # the platform retries the same delivery
    assert resp.status < 300
    [(_, lines)] = gw.kept().items()
    assert [line.text for line in lines] == ["said once"]


# -- threads -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("channel", CHANNELS_WITH_GROUPS)
async def test_one_session_per_thread(gateway_for: Any, channel: str) -> None:
    gw = await gateway_for(channel, {})
    await gw.say("mention", "in the thread", thread=THREAD[channel])
    await gw.say("mention", "in the channel")
    found = {m.text: s for s, m in _not_marker(gw.queued())}
    assert set(found) == {"in the thread", "in the channel"}
    assert found["in the thread"] != found["in the channel"]
    assert THREAD[channel] in found["in the thread"]


async def test_a_discord_mention_of_the_bots_managed_role_is_a_mention(gateway_for: Any) -> None:
    gw = await gateway_for("discord", {})
    await gw.say("role", "please summarise")
    [(_, message)] = _not_marker(gw.queued())
    assert message.text == "please summarise"


async def test_a_slack_reply_in_a_thread_someone_else_started_is_not_for_the_bot(gateway_for: Any) -> None:
    gw = await gateway_for("slack", {})
    await gw.say("plain", "replying to a person", thread="1699999999.000500")
    assert _not_marker(gw.queued()) == []


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"group_replies": {"answer": "sometimes"}}, "answer"),
        ({"group_replies": {"keep_context": {"enabled": True, "max_messages": 0}}}, "max_messages"),
        ({"group_replies": {"keep": True}}, "keep"),
    ],
)
async def test_a_wrong_group_replies_block_is_a_clear_error(
    base_env: dict[str, str], tmp_path: Path, options: dict[str, Any], problem: str
) -> None:
    from switchboard.errors import ConfigError

    config = tmp_path / "bad.yaml"
    config.write_text(_config("telegram", options))
    with pytest.raises(ConfigError, match=rf"channels\.telegram\.group_replies.*{problem}"):
        load_settings(base_env | {"SWITCHBOARD_CONFIG": str(config)})


@pytest.mark.parametrize("channel", CHANNELS_WITH_GROUPS)
async def test_chatter_in_a_group_access_refuses_is_neither_kept_nor_answered(gateway_for: Any, channel: str) -> None:
    """Access control decides first: an unlisted group's chatter is dropped silently (no refusal to a bystander)."""
    access = {"groups": {FREE[channel]: {"allow": ["*"]}}}
    gw = await gateway_for(channel, {**KEEP, "access": access})
    await gw.say("plain", "chatting in an unlisted group")
    assert not gw.kept() and not gw.events("access_refused") and _not_marker(gw.queued()) == []
    await gw.say("plain", "chatting in the listed group", conversation=FREE[channel])
    [(_, lines)] = gw.kept().items()
    assert [line.text for line in lines] == ["chatting in the listed group"]


async def test_the_discord_listener_process_reads_group_replies(base_env: dict[str, str], tmp_path: Path) -> None:
    """``switchboard discord`` builds its own adapters: the account's ``group_replies`` reaches the gateway reader."""
    from switchboard.cli.listeners import build_adapters

    config = tmp_path / "groups.yaml"
    config.write_text(
        _config("discord", {"group_replies": {"free_response": ["301"], "keep_context": {"enabled": True}}})
    )
    env = base_env | {"SWITCHBOARD_CONFIG": str(config), "SWITCHBOARD_DISCORD__BOT_TOKEN": discord_kit.TOKEN}
    adapter = build_adapters(load_settings(env), ["discord"])[("discord", "default")]
    listener = adapter.listener()
    assert isinstance(listener, _GatewayListener)
    rule = listener._inbound.groups
    assert rule.free_response == {"301"} and rule.keep is not None
