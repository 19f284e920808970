"""Every button tap on Telegram is acknowledged with ``answerCallbackQuery``: signed webhooks, a real worker, the fake.

Approve, deny, an ``offer_choice`` answer (no notice), and refused presses (already decided, not the tapper's to
decide, expired) with the refusal as the notice.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.cli.worker import run_worker
from switchboard.core.approvals.decisions import NOT_YOURS_TEXT
from switchboard.core.approvals.records import parse_option_id
from switchboard.queue.keys import SessionKeys
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from switchboard.web.app import create_app
from tests.channels.test_telegram import BOT, PAYLOADS, SECRET, TOKEN
from tests.fakes.telegram_api import FakeTelegram, make_update, sign_update
from tests.waiting import wait_until

CHAT = 7301
SESSION = SessionKey(f"default/assistant/telegram/default/{CHAT}")
CONFIG = """
default_agent: assistant
agents:
  assistant:
    profile: {name: Assistant}
    instructions: You are a test assistant.
    tools: [offer_choice, write_file]
    policy:
      rules:
        - {name: notes, tool: write_file, decide: approve, reason: a person checks notes}
      approvals: {expire_after_s: 3600, approvers: [requester]}
channels:
  telegram: {send_rate: 0, chat_send_rate: 0}
"""
_UPDATES = itertools.count(90_000)


@dataclass
class Chat:
    """The gateway's webhook (signed posts) and the fake Bot API, with a worker running."""

    send: Callable[[dict[str, Any]], Awaitable[tuple[int, bytes]]]
    fake: FakeTelegram
    redis: aioredis.Redis

    async def post(self, update: dict[str, Any]) -> int:
        status, _ = await self.send(update)
        return status

    async def say(self, text: str) -> None:
        assert await self.post(make_update(text, chat_id=CHAT, update_id=next(_UPDATES))) == 200

    async def tap(self, data: str, *, user_id: int | None = None) -> str:
        """Tap the button carrying ``data`` on the latest message that has it; the callback query's id."""
        markups = self.fake.state.markups.items()
        message_id = max(m for (chat, m), markup in markups if chat == CHAT and data in str(markup))
        update = self.fake.press_button(CHAT, message_id, data, next(_UPDATES))
        if user_id is not None:
            update["callback_query"]["from"]["id"] = user_id
        assert await self.post(update) == 200
        return str(update["callback_query"]["id"])

    def buttons(self) -> list[list[str]]:
        """The ``callback_data`` of each inline keyboard sent to the chat, oldest first."""
        return [
            [str(b["callback_data"]) for row in markup["inline_keyboard"] for b in row]
            for (chat, _), markup in sorted(self.fake.state.markups.items())
            if chat == CHAT
        ]

    async def until(self, check: Callable[[], bool], what: str) -> None:
        await wait_until(check, lambda: f"{what}; bot said {self.texts()}")

    async def answered(self, query: str) -> str | None:
        """The notice ``answerCallbackQuery`` carried for ``query`` (waits until it was answered)."""
        await self.until(lambda: query in self.fake.state.answered, f"answerCallbackQuery({query})")
        return self.fake.state.answered[query]

    async def approval_buttons(self, count: int) -> tuple[str, str]:
        """Wait for the ``count``-th approval offer; its approve and deny ``callback_data``."""

        def offers() -> list[list[str]]:
            return [b for b in self.buttons() if b and parse_option_id(b[0]) is not None]

        await self.until(lambda: len(offers()) >= count, "an approval offer")
        approve, deny = offers()[count - 1][:2]
        return approve, deny

    def texts(self) -> list[str]:
        return [str(call.params.get("text", "")) for call in self.fake.sent(CHAT)]


@pytest.fixture
async def chat(aiohttp_client: Any, base_env: dict[str, str], tmp_path: Path, redis_url: str) -> AsyncIterator[Chat]:
    config = tmp_path / "taps.yaml"
    config.write_text(CONFIG)
    async with FakeTelegram(token=TOKEN, username=BOT) as fake:
        env = {
            **base_env,
            "SWITCHBOARD_CONFIG": str(config),
            "SWITCHBOARD_TELEGRAM__BOT_TOKEN": TOKEN,
            "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": SECRET,
            "SWITCHBOARD_TELEGRAM__API_BASE_URL": fake.base_url,
        }
        client = await aiohttp_client(create_app(load_settings(env)))

        async def send(update: dict[str, Any]) -> tuple[int, bytes]:
            body, headers = sign_update(update, SECRET)
            resp = await client.post("/webhooks/telegram", data=body, headers=headers)
            return int(resp.status), await resp.read()

        stop = asyncio.Event()
        worker = asyncio.create_task(run_worker(load_settings(env), stop))
        redis = aioredis.Redis.from_url(redis_url)
        try:
            yield Chat(send, fake, redis)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(worker, return_exceptions=True), 30)
            await redis.aclose()
            if worker.done() and not worker.cancelled() and worker.exception() is not None:
                raise AssertionError("the worker died") from worker.exception()


def note(name: str) -> str:
    return "/tool write_file " + json.dumps({"path": f"{name}.txt", "content": name})


async def test_an_offer_choice_answer_is_acknowledged_without_a_notice(chat: Chat) -> None:
    options = [{"id": "fruit.banana", "label": "Bananas"}, {"id": "fruit.apple", "label": "Apples"}]
    await chat.say("/tool offer_choice " + json.dumps({"question": "Which fruit?", "options": options}))
    await chat.until(lambda: ["fruit.banana", "fruit.apple"] in chat.buttons(), "the offer's buttons")
    query = await chat.tap("fruit.banana")
    assert await chat.answered(query) is None  # the spinner stops; nothing to say
    await chat.until(lambda: any("fruit.banana" in t for t in chat.texts()), "the agent's answer to the tap")
    assert [c.params["callback_query_id"] for c in chat.fake.sent(method="answerCallbackQuery")] == [query]


async def test_approve_and_deny_are_acknowledged_and_refused_presses_say_why(chat: Chat) -> None:
    await chat.say(note("first"))
    approve, deny = await chat.approval_buttons(1)
    pressed = await chat.tap(approve)
    assert await chat.answered(pressed) is None  # applied: the tool runs, the model answers
    await chat.until(lambda: any("write_file returned" in t for t in chat.texts()), "the approved call's outcome")
    (ack,) = [c for c in chat.fake.sent(method="answerCallbackQuery") if c.params["callback_query_id"] == pressed]
    outcome = [c for c in chat.fake.sent(CHAT) if "write_file returned" in str(c.params.get("text"))]
    assert outcome[0].seq > ack.seq  # the press is answered before the approved action's outcome is sent

    again = await chat.answered(await chat.tap(approve))  # already decided
    assert again is not None and again.startswith("That was already approved")
    late_deny = await chat.answered(await chat.tap(deny))
    assert late_deny is not None and "already approved" in late_deny

    await chat.say(note("second"))
    approve, deny = await chat.approval_buttons(2)
    stranger = await chat.answered(await chat.tap(approve, user_id=4242))  # not the requester
    assert stranger == NOT_YOURS_TEXT
    assert await chat.answered(await chat.tap(deny)) is None  # denied: the model is told it did not happen

    await chat.say(note("third"))
    approve, _ = await chat.approval_buttons(3)
    found = parse_option_id(approve)
    assert found is not None
    await chat.redis.hset(SessionKeys(SESSION).approval(found[0]), "expires_at", "1")  # time passed
    expired = await chat.answered(await chat.tap(approve))
    assert expired is not None and "expired" in expired

    calls = chat.fake.sent(method="answerCallbackQuery")
    assert len(calls) == len({c.params["callback_query_id"] for c in calls}) == 6  # each tap once, none missed


async def test_a_tap_no_turn_will_answer_is_answered_in_the_webhooks_answer(chat: Chat) -> None:
    game = json.loads((PAYLOADS / "callback_query_game.json").read_text())
    status, body = await chat.send(game)
    assert status == 200
    assert json.loads(body) == {"method": "answerCallbackQuery", "callback_query_id": game["callback_query"]["id"]}
    await chat.say("hello")  # a queued message is answered with the plain OK
    assert await chat.send(make_update("again", chat_id=CHAT, update_id=next(_UPDATES))) == (200, b'{"ok":true}')
