"""Hostile model output rendered for Telegram, Slack and Discord: never refused by the platform (unbalanced tags,
a cut inside an escape), never a mention that notifies anyone, never a link the platform would act on."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from switchboard.channels.discord.adapter import DiscordChannel
from switchboard.channels.discord.fake.platform import FakeDiscord
from switchboard.channels.registry import BuildContext
from switchboard.channels.slack.fake.platform import FakeSlack
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.core.actions import SendText
from switchboard.core.messages import ConversationRef
from tests.channels._discord_fixtures import APP_ID, BOT_ID, Sending
from tests.channels._discord_fixtures import TOKEN as DISCORD_TOKEN
from tests.channels._discord_fixtures import settings as discord_settings
from tests.channels.slack_support import BOT_TOKEN as SLACK_TOKEN
from tests.channels.slack_support import Progress, in_channel, make_channel
from tests.channels.test_telegram import BOT, TOKEN, settings
from tests.fakes.telegram_api import FakeTelegram, RecordingSend, check_html

HOSTILE = [
    '</b><a href="https://evil.example">login</a><b>',
    "<b>unclosed <i>tags",
    "&amp; &lt; & < > &#0; &#x110000; &bogus; &",
    "[tap me](tg://user?id=123456789)",
    "[tap me](TG://USER?ID=123456789)",
    "[tap me](tg://openmessage?user_id=123456789)",
    "[x](javascript:alert(1)) [y](data:text/html,hi) [z](vbscript:x)",
    '[q](http://x.example/"onmouseover="alert(1))',
    "@everyone @here <!channel> <!here> <!everyone> <@U0HUMAN> <@U0HUMAN|bob> <!subteam^S0TEAM|@team>",
    "<https://evil.example|https://bank.example> <mailto:a@b.example|x>",
    "**bold `code** inside` ** __ ~~ ||spoiler||",
    "```\nunclosed fence <b>&amp;",
    "\u202eevil\u202c \x00 nul \u200b\ufeff a\u0301\u0301\u0301",
    "&" * 5000,
    "<" * 5000,
    "a" * 4095 + "&<>",
    "😀" * 3000,
    ">" * 300 + " deep quote",
    "[" * 3000 + "]" * 3000,
    "*" * 9000,
    "# " * 2000,
    "| a | b |\n|---|---|\n" + "| <!here> | @everyone |\n" * 300,
]
IDS = [f"{i}:{text[:12]!r}" for i, text in enumerate(HOSTILE)]


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        yield server


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(bot_token=SLACK_TOKEN) as server:
        yield server


@pytest.fixture
async def discord() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(DISCORD_TOKEN, bot_id=BOT_ID, application_id=APP_ID) as server:
        yield server


_USER_LINK = re.compile(r"tg://(user|openmessage)", re.IGNORECASE)


@pytest.mark.parametrize("text", HOSTILE, ids=IDS)
async def test_telegram_renders_hostile_output_that_telegram_accepts_and_that_pings_nobody(
    telegram: FakeTelegram, text: str
) -> None:
    adapter = TelegramChannel(settings(telegram.base_url))
    group = ConversationRef(channel="telegram", conversation="-1001234", extra={"chat_type": "supergroup"})
    try:
        receipt = await adapter.perform(SendText(text=text), group, RecordingSend())
    finally:
        await adapter.aclose()
    sent = [call.params["text"] for call in telegram.sent(-1001234)]
    assert receipt.parts == len(sent) >= 1
    for markup in sent:
        check_html(markup)  # what Telegram's HTML mode would refuse
        hrefs = re.findall(r'href="([^"]*)"', markup)
        assert not [h for h in hrefs if _USER_LINK.match(h)], hrefs  # a tg://user link mentions (and notifies)
        assert all(h.lower().startswith(("http://", "https://", "mailto:", "tg://")) for h in hrefs), hrefs


@pytest.mark.parametrize("text", HOSTILE, ids=IDS)
async def test_slack_renders_hostile_output_that_slack_accepts_and_that_pings_nobody(
    slack: FakeSlack, text: str
) -> None:
    adapter = make_channel(slack.api_url)
    try:
        receipt = await adapter.perform(SendText(text=text), in_channel(), Progress())
    finally:
        await adapter.aclose()
    posts = [c for c in slack.calls if c.method == "chat.postMessage"]
    assert receipt.parts == len(posts) >= 1 and all(c.status == 200 and not c.error for c in posts)
    assert [p for c in slack.calls for p in c.pings] == []


@pytest.mark.parametrize("text", HOSTILE, ids=IDS)
async def test_discord_sends_hostile_output_that_discord_accepts_and_that_pings_nobody(
    discord: FakeDiscord, text: str
) -> None:
    adapter = DiscordChannel(discord_settings(discord.api_url), BuildContext(account="default"))
    conversation = ConversationRef(channel="discord", conversation="300", extra={"channel_id": "300"})
    try:
        receipt = await adapter.perform(SendText(text=text), conversation, Sending())
    finally:
        await adapter.aclose()
    posts = [c for c in discord.calls if c.method == "POST" and "messages" in c.route]
    assert receipt.parts == len(posts) >= 1 and all(c.status == 200 for c in posts)
    for call in posts:
        assert call.body["allowed_mentions"] == {"parse": []}


NESTED = [
    "intro\n\n" + ">" * 25 + " hidden-quote\n\noutro",
    "intro\n\n" + "- " * 12 + "hidden-item\n\noutro",
    "intro\n\n" + "1. " * 12 + "hidden-number\n\noutro",
    "intro\n\n" + "> - " * 10 + "hidden-mixed\n\noutro",
]


@pytest.mark.parametrize("text", NESTED, ids=["quotes", "bullets", "numbers", "mixed"])
async def test_deeply_nested_markdown_is_never_dropped_silently(
    telegram: FakeTelegram, slack: FakeSlack, text: str
) -> None:
    """markdown-it stops parsing past 20 levels of nesting and drops the rest of the block: the words vanished."""
    words = [w for w in text.split() if w.startswith(("intro", "hidden", "outro"))]
    adapter = TelegramChannel(settings(telegram.base_url))
    chat = ConversationRef(channel="telegram", conversation="42")
    try:
        await adapter.perform(SendText(text=text), chat, RecordingSend())
    finally:
        await adapter.aclose()
    shown = " ".join(check_html(call.params["text"]) for call in telegram.sent(42))
    assert all(word in shown for word in words), shown[:300]
    slack_adapter = make_channel(slack.api_url)
    try:
        await slack_adapter.perform(SendText(text=text), in_channel(), Progress())
    finally:
        await slack_adapter.aclose()
    posted = " ".join(str(c.params.get("text")) for c in slack.calls if c.method == "chat.postMessage")
    assert all(word in posted for word in words), posted[:300]


@pytest.mark.parametrize("ticks", [3, 4, 5, 7, 8, 11])
async def test_a_run_of_backticks_in_text_never_opens_a_slack_code_block(slack: FakeSlack, ticks: int) -> None:
    """``_esc`` defused the first three ticks of a run only: five backticks left a live fence (invalid mrkdwn)."""
    adapter = make_channel(slack.api_url)
    try:
        await adapter.perform(SendText(text=f"a{'`' * ticks} and b"), in_channel(), Progress())
    finally:
        await adapter.aclose()
    posts = [c for c in slack.calls if c.method == "chat.postMessage"]
    assert posts and all(c.status == 200 and not c.error for c in posts), [(c.status, c.error) for c in posts]
    assert all("```" not in str(c.params.get("text")) for c in posts)
