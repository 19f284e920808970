"""Access control through the real webhook path of every channel with groups: signed requests, real Redis.

Each case posts messages as a platform would (signed for real) to ``create_app`` configured with an ``access`` block,
then reads what reached the session queue, what the sender was answered (the channel's fake platform API recorded it)
and the decisions in the session's event log.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from aiohttp.test_utils import TestClient

from switchboard.channels.discord.fake.payloads import make_command, sign_interaction
from switchboard.channels.discord.fake.platform import FakeDiscord
from switchboard.channels.meta.whatsapp.fake.payloads import PHONE_NUMBER_ID, text_delivery
from switchboard.channels.meta.whatsapp.fake.payloads import sign_request as sign_whatsapp
from switchboard.channels.meta.whatsapp.fake.platform import FakeWhatsApp
from switchboard.channels.slack.fake.payloads import make_event
from switchboard.channels.slack.fake.payloads import sign_request as sign_slack
from switchboard.channels.slack.fake.platform import FakeSlack
from switchboard.channels.teams.fake.platform import FakeTeams
from switchboard.channels.telegram.fake.platform import FakeTelegram, make_update, sign_update
from switchboard.core.events import EventAdapter
from switchboard.queue.router import IngestRouter
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from switchboard.web.appkeys import ROUTER
from tests.channels import _discord_fixtures as discord_kit
from tests.channels import slack_support
from tests.channels import teams_support as teams_kit
from tests.conftest import MINIMAL_CONFIG

REFUSAL = "Closed bot, ask Ada."
TG_SECRET = "webhook_secret-123"
WA_SECRET = "5d41402abc4b2a76b9719d911017c592"


IDS: dict[str, dict[str, str]] = {
    "telegram": {"sender": "4242", "other": "777", "group": "-100555", "other_group": "-100666", "unlisted": "-100999"},
    "slack": {
        "sender": "U0ALLOWED",
        "other": "U0STRANGER",
        "group": "C0GROUP",
        "other_group": "C0OTHER",
        "unlisted": "C0NOTLISTED",
        "facet": "slack:team:T0SWITCH",
    },
    "discord": {"sender": "501", "other": "502", "group": "300", "other_group": "301", "unlisted": "399"},
    "teams": {
        "sender": "29:1allowedUser",
        "other": "29:1strangerUser",
        "group": "19:allowed_group@thread.v2",
        "other_group": "19:other_group@thread.v2",
        "unlisted": "19:unlisted@thread.v2",
        "facet": "teams:tenant:72f988bf-86f1-41af-91ab-2d7cd011db47",
    },
    "whatsapp": {"sender": "4915112345678", "other": "15559990000", "facet": "whatsapp:+4915112345678"},
}
"""Each channel's user, stranger and group ids (in that platform's shape), and a workspace/tenant/number entry."""


@dataclass
class Rig:
    """One channel's fake platform, the env enabling it, and how its users' messages are posted and answered."""

    name: str
    env: dict[str, str]
    post: Callable[[str, str, bool, str], tuple[str, bytes, dict[str, str]]]
    """(sender id, conversation id, in a group, text) → (path, body, headers), signed."""
    texts: Callable[[], list[str]]
    """Everything the gateway sent through the fake, as text."""
    direct: Callable[[str], str]
    """The conversation id of a sender's direct chat with the bot."""
    groups: bool = True
    counter: list[int] = field(default_factory=lambda: [0])

    def __getattr__(self, name: str) -> str:
        """``sender``, ``other``, ``group``, ``other_group``, ``unlisted``, ``facet``: this channel's :data:`IDS`."""
        try:
            return IDS[self.__dict__["name"]][name]
        except KeyError:
            raise AttributeError(name) from None

    def next_id(self) -> int:
        self.counter[0] += 1
        return self.counter[0]


async def _telegram(stack: AsyncExitStack) -> Rig:
    fake = FakeTelegram(token="42:test")
    await fake.start()
    stack.push_async_callback(fake.stop)
    env = {
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": "42:test",
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": TG_SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": fake.base_url,
    }
    rig: Rig

    def post(sender: str, conversation: str, group: bool, text: str) -> tuple[str, bytes, dict[str, str]]:
        update = make_update(
            text,
            chat_id=int(conversation),
            update_id=rig.next_id(),
            chat_type="supergroup" if group else "private",
            user_id=int(sender),
        )
        body, headers = sign_update(update, TG_SECRET)
        return "/webhooks/telegram", body, headers

    def texts() -> list[str]:
        return [str(c.params.get("text", "")) for c in fake.calls if c.method == "sendMessage"]

    rig = Rig("telegram", env, post, texts, direct=lambda s: s)
    return rig


async def _slack(stack: AsyncExitStack) -> Rig:
    fake = await stack.enter_async_context(FakeSlack(bot_token=slack_support.BOT_TOKEN))
    env = {
        "SWITCHBOARD_SLACK__BOT_TOKEN": slack_support.BOT_TOKEN,
        "SWITCHBOARD_SLACK__SIGNING_SECRET": slack_support.SECRET,
        "SWITCHBOARD_SLACK__API_BASE_URL": fake.api_url,
    }

    def post(sender: str, conversation: str, group: bool, text: str) -> tuple[str, bytes, dict[str, str]]:
        event = make_event(text, channel=conversation, channel_type="channel" if group else "im", user=sender)
        body, headers = sign_slack(event, slack_support.SECRET)
        return "/webhooks/slack", body, headers

    def texts() -> list[str]:
        return [json.dumps(c.params) for c in fake.sent()]

    rig = Rig("slack", env, post, texts, direct=lambda s: f"D{s}")
    return rig


async def _discord(stack: AsyncExitStack) -> Rig:
    fake = await stack.enter_async_context(
        FakeDiscord(discord_kit.TOKEN, bot_id=discord_kit.BOT_ID, application_id=discord_kit.APP_ID)
    )
    env = {
        "SWITCHBOARD_DISCORD__BOT_TOKEN": discord_kit.TOKEN,
        "SWITCHBOARD_DISCORD__PUBLIC_KEY": discord_kit.PUBLIC_KEY,
        "SWITCHBOARD_DISCORD__APPLICATION_ID": discord_kit.APP_ID,
        "SWITCHBOARD_DISCORD__API_BASE_URL": fake.api_url,
        "SWITCHBOARD_DISCORD__GATEWAY": "false",
    }

    def post(sender: str, conversation: str, group: bool, text: str) -> tuple[str, bytes, dict[str, str]]:
        interaction = make_command(
            "ask",
            text,
            application_id=discord_kit.APP_ID,
            channel_id=conversation,
            guild_id="200" if group else None,
            user_id=sender,
        )
        body, headers = sign_interaction(interaction, discord_kit.KEY)
        return "/webhooks/discord", body, headers

    def texts() -> list[str]:
        return [json.dumps(c.body) for c in fake.calls if c.method in ("POST", "PATCH")]

    rig = Rig("discord", env, post, texts, direct=lambda s: f"9{s}")
    return rig


async def _teams(stack: AsyncExitStack) -> Rig:
    fake = await stack.enter_async_context(FakeTeams(app_id=teams_kit.APP_ID, app_password=teams_kit.PASSWORD))
    rig: Rig

    def post(sender: str, conversation: str, group: bool, text: str) -> tuple[str, bytes, dict[str, str]]:
        activity = teams_kit.payload("group_mention.json" if group else "personal.json", fake.service_url)
        activity["id"] = f"17646{rig.next_id():08d}"
        activity["from"]["aadObjectId"] = sender  # Teams' principal: the user's Entra (AAD) object id
        activity["conversation"]["id"] = conversation
        activity["text"] = f"<at>Switchboard</at> {text}" if group else text
        body, headers = teams_kit.signed_request(fake, activity)
        return "/webhooks/teams", body, headers

    def texts() -> list[str]:
        return [json.dumps(c.body) for c in fake.sent()]

    rig = Rig("teams", teams_kit.teams_env(fake), post, texts, direct=lambda s: f"a:personal-{s}")
    return rig


async def _whatsapp(stack: AsyncExitStack) -> Rig:
    fake = await stack.enter_async_context(FakeWhatsApp())
    env = {
        "SWITCHBOARD_WHATSAPP__ACCESS_TOKEN": "EAAdefault",
        "SWITCHBOARD_WHATSAPP__APP_SECRET": WA_SECRET,
        "SWITCHBOARD_WHATSAPP__VERIFY_TOKEN": "verify-me",
        "SWITCHBOARD_WHATSAPP__PHONE_NUMBER_ID": PHONE_NUMBER_ID,
        "SWITCHBOARD_WHATSAPP__GRAPH_BASE_URL": fake.graph_url,
    }

    def post(sender: str, conversation: str, group: bool, text: str) -> tuple[str, bytes, dict[str, str]]:
        body, headers = sign_whatsapp(text_delivery(text, sender=sender), WA_SECRET)
        return "/webhooks/whatsapp", body, headers

    def texts() -> list[str]:
        return list(fake.state.texts())

    rig = Rig("whatsapp", env, post, texts, direct=lambda s: s, groups=False)
    return rig


RIGS = {"telegram": _telegram, "slack": _slack, "discord": _discord, "teams": _teams, "whatsapp": _whatsapp}


@dataclass
class Gateway:
    rig: Rig
    client: TestClient
    redis: redis.Redis

    @property
    def router(self) -> IngestRouter:
        return self.client.app[ROUTER]

    async def say(self, sender: str, text: str = "hello", *, group: str | None = None) -> None:
        conversation = group if group is not None else self.rig.direct(sender)
        path, body, headers = self.rig.post(sender, conversation, group is not None, text)
        resp = await self.client.post(path, data=body, headers=headers)
        assert resp.status < 300, await resp.text()
        if self.router.gate is not None:
            await self.router.gate.drain()

    def queued(self) -> int:
        return sum(int(self.redis.llen(key)) for key in self.redis.keys("sb:*:inbox"))

    def answers(self) -> int:
        return sum(REFUSAL in text for text in self.rig.texts())

    def events(self, kind: str) -> list[Any]:
        found = []
        for key in self.redis.keys("sb:*:events"):
            for _, fields in self.redis.xrange(key):
                if fields[b"kind"].decode() == kind:
                    found.append(EventAdapter.validate_json(fields[b"data"]))
        return found


def _config(channel: str, access: dict[str, Any]) -> str:
    data = yaml.safe_load(MINIMAL_CONFIG)
    data["channels"] = {channel: {"require_mention": False, "access": {"refusal": REFUSAL, **access}}}
    return yaml.safe_dump(data)


@pytest.fixture
async def gateway_for(
    base_env: dict[str, str], tmp_path: Path, aiohttp_client: Any, sync_redis: redis.Redis
) -> AsyncIterator[Callable[[str, dict[str, Any]], Any]]:
    async with AsyncExitStack() as stack:

        async def make(channel: str, access: dict[str, Any]) -> Gateway:
            rig = await RIGS[channel](stack)
            config = tmp_path / "access.yaml"
            config.write_text(_config(channel, access))
            env = base_env | rig.env | {"SWITCHBOARD_CONFIG": str(config), "SWITCHBOARD_QUEUE__INGEST_TIMEOUT_S": "1.0"}
            client = await aiohttp_client(create_app(load_settings(env), listeners=False))
            return Gateway(rig, client, sync_redis)

        yield make


ALL = list(RIGS)
WITH_GROUPS = [name for name in RIGS if name != "whatsapp"]


@pytest.mark.parametrize("channel", ALL)
async def test_open_is_the_default_and_admits_everyone_unlooked_at(gateway_for: Any, channel: str) -> None:
    gw = await gateway_for(channel, {})
    assert gw.router.gate is None  # nothing configured to check: no gate, no cost
    await gw.say(gw.rig.sender)
    await gw.say(gw.rig.other)
    assert gw.queued() == 2 and gw.answers() == 0


@pytest.mark.parametrize("channel", ALL)
async def test_allowlist_admits_the_listed_and_refuses_the_rest_with_one_answer(gateway_for: Any, channel: str) -> None:
    gw = await gateway_for(channel, {"mode": "allowlist", "allow": [f"{channel}:{IDS[channel]['sender']}"]})
    await gw.say(gw.rig.sender)
    assert gw.queued() == 1 and gw.answers() == 0
    [received] = gw.events("message_received")
    assert received.access == f"allowlist:{channel}:{gw.rig.sender}" and received.role == "user"
    for _ in range(3):
        await gw.say(gw.rig.other, "let me in")
    assert gw.queued() == 1, "a refused sender's message reached the queue"
    assert gw.answers() == 1, "the refusal answer is sent once per notice interval"
    refused = gw.events("access_refused")
    assert len(refused) == 3 and [r.answered for r in refused].count(True) == 1
    assert {(r.reason, r.rule, r.sender) for r in refused} == {("not_allowed", "allowlist", gw.rig.other)}
    metrics = await (await gw.client.get("/metrics")).text()
    assert f'channel="{channel}",reason="access_refused"}} 3.0' in metrics


@pytest.mark.parametrize("channel", ["slack", "teams", "whatsapp"])
async def test_allowlist_by_workspace_tenant_or_number(gateway_for: Any, channel: str) -> None:
    gw = await gateway_for(channel, {"mode": "allowlist", "allow": [IDS[channel]["facet"]]})
    await gw.say(gw.rig.sender)
    assert gw.queued() == 1
    [received] = gw.events("message_received")
    assert received.access.startswith("allowlist:")


@pytest.mark.parametrize("channel", WITH_GROUPS)
async def test_group_rules(gateway_for: Any, channel: str) -> None:
    """An allowed group with ``*`` admits every member; an unlisted group is refused; direct chats follow ``mode``."""
    ids = IDS[channel]
    access = {
        "mode": "allowlist",
        "allow": [f"{channel}:{ids['sender']}"],
        "groups": {ids["group"]: {"allow": ["*"]}, ids["other_group"]: {"allow": [f"{channel}:{ids['sender']}"]}},
    }
    gw = await gateway_for(channel, access)
    await gw.say(gw.rig.other, group=gw.rig.group)
    assert gw.queued() == 1, "a member of an allowed group with allow: ['*'] is admitted"
    await gw.say(gw.rig.other, group=gw.rig.other_group)
    assert gw.queued() == 1, "a member not listed in the group's allow is refused"
    await gw.say(gw.rig.sender, group=gw.rig.other_group)
    assert gw.queued() == 2
    await gw.say(gw.rig.sender, group=gw.rig.unlisted)
    await gw.say(gw.rig.other)
    assert gw.queued() == 2
    reasons = sorted(r.reason for r in gw.events("access_refused"))
    assert reasons == ["group_not_allowed", "not_allowed", "not_allowed_in_group"]


@pytest.mark.parametrize("channel", WITH_GROUPS)
async def test_groups_none_keeps_the_bot_to_direct_chats(gateway_for: Any, channel: str) -> None:
    gw = await gateway_for(channel, {"groups": "none"})
    await gw.say(gw.rig.sender, group=gw.rig.group)
    await gw.say(gw.rig.sender, group=gw.rig.group)
    assert gw.queued() == 0 and gw.answers() == 1
    await gw.say(gw.rig.sender)
    assert gw.queued() == 1


@pytest.mark.parametrize("channel", ALL)
async def test_pairing_refuses_an_unknown_sender_with_one_code(gateway_for: Any, channel: str) -> None:
    gw = await gateway_for(channel, {"mode": "pairing"})
    await gw.say(gw.rig.other, "hi")
    await gw.say(gw.rig.other, "hello?")
    assert gw.queued() == 0
    assert gw.answers() == 1
    [issued] = gw.events("pairing_code_issued")
    assert issued.sender == gw.rig.other and issued.expires_at > time.time() + 3500
    assert [r.answered for r in gw.events("access_refused")] == [True, False]
    codes = gw.redis.keys("sb:{access:default}:code:*")
    assert len(codes) == 1  # at most one live code per sender, stored by its hash
    [answer] = [t for t in gw.rig.texts() if REFUSAL in t]
    code = answer.split("pairing code is ")[1][:7]
    stored = [gw.redis.dump(key) or b"" for key in gw.redis.keys("sb:{access:*")]
    assert stored and not any(code.encode() in value for value in stored), "the code itself is never stored"
