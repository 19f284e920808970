"""Budgets and linked identities through the real gateway: signed webhooks, real Redis, the worker, fake platforms."""

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

from switchboard.channels.slack.fake.payloads import make_slash_command, sign_request
from switchboard.channels.slack.fake.platform import FakeSlack
from switchboard.cli.worker import run_worker
from switchboard.queue.budgets import Budgets
from switchboard.queue.keys import SessionKeys
from switchboard.queue.people import People
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from switchboard.web.app import create_app
from tests.channels.slack_support import BOT_TOKEN as SLACK_TOKEN
from tests.channels.slack_support import SECRET as SLACK_SECRET
from tests.channels.test_telegram import BOT, SECRET, TOKEN
from tests.fakes.telegram_api import FakeTelegram, check_html, make_update, sign_update
from tests.waiting import wait_until

CONFIG = """
default_agent: assistant
agents:
  assistant:
    profile: {name: Assistant}
    instructions: You are a test assistant.
    limits: {max_output_tokens: 64}
prices:
  offline: {input: 1.0, output: 1.0}
identity: {self_link: true}
"""
TG_SESSION = "default/assistant/telegram/default/501"


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=TOKEN, username=BOT) as server:
        yield server


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(bot_token=SLACK_TOKEN) as server:
        yield server


def gateway_env(
    base_env: dict[str, str], tmp_path: Path, telegram: FakeTelegram, slack: FakeSlack, budgets: str
) -> dict[str, str]:
    config = tmp_path / "budgets.yaml"
    config.write_text(CONFIG + budgets)
    return base_env | {
        "SWITCHBOARD_CONFIG": str(config),
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": TOKEN,
        "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
        "SWITCHBOARD_TELEGRAM__API_BASE_URL": telegram.base_url,
        "SWITCHBOARD_SLACK__BOT_TOKEN": SLACK_TOKEN,
        "SWITCHBOARD_SLACK__SIGNING_SECRET": SLACK_SECRET,
        "SWITCHBOARD_SLACK__API_BASE_URL": slack.api_url,
    }


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

    async def telegram(self, text: str, chat_id: int = 501) -> None:
        self.update_id += 1
        update = make_update(text, chat_id=chat_id, update_id=self.update_id)
        if text.startswith("/"):  # as Telegram marks a command
            update["message"]["entities"] = [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
        body, headers = sign_update(update, SECRET)
        assert (await self.client.post("/webhooks/telegram", data=body, headers=headers)).status == 200

    async def slack_command(self, command: str, text: str) -> None:
        body, headers = sign_request(make_slash_command(command, text), SLACK_SECRET, form=True)
        assert (await self.client.post("/webhooks/slack", data=body, headers=headers)).status == 200


@pytest.fixture
async def start(
    base_env: dict[str, str], tmp_path: Path, telegram: FakeTelegram, slack: FakeSlack, aiohttp_client: Any
) -> AsyncIterator[Callable[[str], Awaitable[Gateway]]]:
    stops: list[tuple[asyncio.Event, asyncio.Task[None]]] = []

    async def started(budgets: str) -> Gateway:
        env = gateway_env(base_env, tmp_path, telegram, slack, budgets)
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


async def events(redis: aioredis.Redis, session: str) -> list[dict[str, Any]]:
    found: Any = await redis.xrange(SessionKeys(SessionKey(session)).events)
    out = []
    for _id, fields in found:
        kind = fields[b"kind"].decode()
        data = json.loads(fields[b"data"]) if b"data" in fields else {}
        out.append({"kind": kind, **data})
    return out


HARD_STOP = "This assistant has used its budget for today; it resets at 00:00 UTC."


async def test_a_used_up_daily_budget_answers_one_clear_message_and_never_asks_the_model(
    start: Callable[[str], Awaitable[Gateway]], telegram: FakeTelegram, async_redis: aioredis.Redis
) -> None:
    # the first turn costs 0.096 credits (80 tokens in, 16 out); the second's worst case (its estimated input with a
    # margin, and 64 tokens out) does not fit in what is left, so the model is not asked: the budget closes for the day
    gateway = await start("budgets:\n  - {scope: tenant, period: day, credits: 0.4, alert_at: [0.2, 1.0]}\n")
    await gateway.telegram("first question")
    await gateway.until(lambda: len(replies(telegram)) == 1, "the first answer")
    assert "first question" in replies(telegram)[0]  # the offline model answered within the budget
    for n, text in enumerate(("second question", "third question"), start=2):
        await gateway.telegram(text)
        await gateway.until(lambda n=n: len(replies(telegram)) == n, f"answer {n}")  # type: ignore[misc]
    log = await events(async_redis, TG_SESSION)
    assert replies(telegram)[1:] == [HARD_STOP, HARD_STOP]
    metered = [e for e in log if e["kind"] == "usage_metered"]
    steps = [e for e in log if e["kind"] == "step"]
    assert len(steps) == 1 and metered[0]["credits"] > 0  # only the first turn reached the model
    assert all(m["credits"] == 0 for m in metered[1:])
    exhausted = [e for e in log if e["kind"] == "budget_exhausted"]
    assert len(exhausted) == 1 and exhausted[0]["scope"] == "tenant" and exhausted[0]["credits"] == 0.4
    assert [e["threshold"] for e in log if e["kind"] == "budget_alerted"] == [0.2]
    [row] = await Budgets(async_redis, ()).live("default")
    assert row.spent == pytest.approx(metered[0]["credits"]) and row.spent <= 0.4


async def test_usage_shows_the_users_own_spend_against_their_budgets(
    start: Callable[[str], Awaitable[Gateway]], telegram: FakeTelegram
) -> None:
    gateway = await start("budgets:\n  - {scope: user, period: month, credits: 100}\n")
    await gateway.telegram("hello")
    await gateway.until(lambda: len(replies(telegram)) == 1, "the answer")
    await gateway.telegram("/usage")
    await gateway.until(lambda: len(replies(telegram)) == 2, "the usage")
    usage = replies(telegram)[1]
    spent = re.search(r"you, this month: ([\d.]+) of 100 credits \(0%\); resets on 1 \w+ at 00:00 UTC", usage)
    assert usage.startswith("Your usage:") and spent is not None and float(spent.group(1)) > 0


async def test_a_person_links_two_channels_with_a_code_and_their_budget_follows_them(
    start: Callable[[str], Awaitable[Gateway]],
    telegram: FakeTelegram,
    slack: FakeSlack,
    async_redis: aioredis.Redis,
) -> None:
    gateway = await start("budgets:\n  - {scope: user, period: day, credits: 0.4}\n")
    await gateway.telegram("/link")
    await gateway.until(lambda: len(replies(telegram)) == 1, "a link code on Telegram")
    code = re.search(r"link code is (\d{8})", replies(telegram)[0])
    assert code is not None
    await gateway.slack_command("/link", "00000000")  # a wrong code links nothing
    await gateway.until(lambda: len(slack.sent(channel="C0GENERAL")) == 1, "the refusal on Slack")
    assert "wrong or has expired" in str(slack.sent(channel="C0GENERAL")[0].params["text"])
    await gateway.slack_command("/link", code.group(1))
    await gateway.until(lambda: len(slack.sent(channel="C0GENERAL")) == 2, "the link confirmed on Slack")
    assert "Linked:" in str(slack.sent(channel="C0GENERAL")[1].params["text"])
    people = await People(async_redis).everyone("default")
    [(person, principals)] = people.items()
    assert sorted(p.split(":")[0] for p in principals) == ["slack", "telegram"]
    await gateway.slack_command("/link", code.group(1))  # used once
    await gateway.until(lambda: len(slack.sent(channel="C0GENERAL")) == 3, "the reused code refused")
    assert "wrong or has expired" in str(slack.sent(channel="C0GENERAL")[2].params["text"])

    await gateway.telegram("spend on telegram")  # the person's budget is spent on Telegram...
    await gateway.until(lambda: len(replies(telegram)) == 2, "the answer on Telegram")
    await gateway.slack_command("/ask", "and now on slack")  # ... and is used up on Slack too
    await gateway.until(lambda: len(slack.sent(channel="C0GENERAL")) == 4, "the answer on Slack")
    await gateway.slack_command("/ask", "once more on slack")
    await gateway.until(lambda: len(slack.sent(channel="C0GENERAL")) == 5, "the hard stop on Slack")
    assert slack.sent(channel="C0GENERAL")[4].params["text"] == (
        "You have used your budget for today; it resets at 00:00 UTC."
    )
    [row] = await Budgets(async_redis, ()).live("default")
    assert row.scope == "user" and row.subject == person


async def test_an_operator_link_makes_one_budget_for_the_persons_accounts(
    start: Callable[[str], Awaitable[Gateway]],
    telegram: FakeTelegram,
    slack: FakeSlack,
    async_redis: aioredis.Redis,
) -> None:
    gateway = await start("budgets:\n  - {scope: user, period: day, credits: 0.4}\n")
    linked = await People(async_redis).link("default", ["telegram:501", "slack:U0HUMAN"], "alice", by="cli")
    assert linked.kind == "person_linked"
    await gateway.telegram("spend on telegram")
    await gateway.until(lambda: len(replies(telegram)) == 1, "the answer on Telegram")
    await gateway.slack_command("/ask", "first on slack")  # what is left cannot pay for a step: closed
    await gateway.until(lambda: len(slack.sent(channel="C0GENERAL")) == 1, "the hard stop on Slack")
    await gateway.slack_command("/usage", "")
    await gateway.until(lambda: len(slack.sent(channel="C0GENERAL")) == 2, "the usage on Slack")
    sent = [str(c.params["text"]) for c in slack.sent(channel="C0GENERAL")]
    assert sent[0] == "You have used your budget for today; it resets at 00:00 UTC."
    assert "you, today: " in sent[1] and "of 0.4 credits" in sent[1]
    [row] = await Budgets(async_redis, ()).live("default")
    assert (row.scope, row.subject) == ("user", "alice") and row.spent > 0


async def test_two_workers_racing_for_the_last_credits_end_at_most_one_runs_cost_over(
    base_env: dict[str, str],
    tmp_path: Path,
    telegram: FakeTelegram,
    slack: FakeSlack,
    aiohttp_client: Any,
    async_redis: aioredis.Redis,
) -> None:
    """Two chats' messages at once, two workers: both may be admitted on the same credits left; each is capped by it."""
    env = gateway_env(base_env, tmp_path, telegram, slack, "budgets:\n  - {scope: tenant, period: day, credits: 0.5}\n")
    client = await aiohttp_client(create_app(load_settings(env), listeners=False))
    stop = asyncio.Event()
    workers = [asyncio.create_task(run_worker(load_settings(env), stop)) for _ in range(2)]
    gateway = Gateway(client, workers[0])
    try:
        for round_ in range(3):
            chats = (601 + 2 * round_, 602 + 2 * round_)
            await asyncio.gather(*(gateway.telegram(f"race {round_}", chat_id=chat) for chat in chats))
            for chat in chats:
                await gateway.until(lambda chat=chat: len(replies(telegram, chat)) == 1, f"the answer in {chat}")  # type: ignore[misc]
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*workers, return_exceptions=True), 30)
    metered = []
    for chat in range(601, 607):
        log = await events(async_redis, f"default/assistant/telegram/default/{chat}")
        metered += [e["credits"] for e in log if e["kind"] == "usage_metered" and e["credits"] > 0]
    [spent] = await Budgets(async_redis, load_settings(env).file.budgets).spent(
        (await Budgets(async_redis, load_settings(env).file.budgets).admit("default", "assistant", "x", "x")).counters
    )
    assert metered and spent == pytest.approx(sum(metered))
    assert spent - 0.5 <= max(metered) + 1e-9  # over by at most one run's metered cost
    stopped = [chat for chat in range(601, 607) if replies(telegram, chat) == [HARD_STOP]]
    assert stopped and len(metered) + len(stopped) == 6  # the budget ran out: the rest got the hard stop
