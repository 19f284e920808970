"""Telegram under ``switchboard run`` without a bot token, and ``switchboard simulate telegram "text"``.

``run`` starts the fake Bot API with a made-up token and webhook secret and points the Telegram block at it;
``simulate`` posts a signed ``Update`` from a new private chat (or, with ``--group``, in a group, mentioning the bot
with ``--mention``) to the gateway and reads the replies the fake received for that chat.
"""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Mapping

import aiohttp
from pydantic import SecretStr

from switchboard.channels.registry import FakePlatform, SampleRequest, Simulation
from switchboard.channels.telegram.fake.html import check_html
from switchboard.channels.telegram.fake.platform import FakeTelegram
from switchboard.channels.telegram.fake.updates import make_update, sign_update
from switchboard.channels.telegram.settings import TelegramSettings

__all__ = ["SIMULATION"]


class _Running(FakePlatform):
    def __init__(self, fake: FakeTelegram) -> None:
        self.fake = fake

    async def stop(self) -> None:
        await self.fake.stop()


async def _start(block: TelegramSettings) -> tuple[TelegramSettings, FakePlatform]:
    token = f"100000:{secrets.token_urlsafe(24)}"
    fake = FakeTelegram(token=token)
    base_url = await fake.start()
    simulated = block.model_copy(
        update={
            "bot_token": SecretStr(token),
            "secret_token": SecretStr(secrets.token_urlsafe(24)),
            "api_base_url": base_url,
            "bot_username": block.bot_username or "switchboard_demo_bot",
            "transport": "webhook",
        }
    )
    return simulated, _Running(fake)


def _details(block: TelegramSettings) -> dict[str, str]:
    secret = block.secret_token.get_secret_value() if block.secret_token else ""
    return {"fake_url": block.api_base_url, "secret_token": secret, "bot_username": block.bot_username or ""}


SIMULATED_USER = 6_999_999
"""The one simulated Telegram user (``telegram:6999999``): each message comes from them in a fresh chat, so its reply
is read back alone, and access control sees the same person every time."""


def _request(details: Mapping[str, str], text: str) -> SampleRequest:
    chat_id = 7_000_000 + random.randrange(1_000_000)
    update = make_update(
        text, chat_id=chat_id, update_id=int(time.time() * 1000) % 2_000_000_000, user_id=SIMULATED_USER
    )
    if text.startswith("/") and len(text) > 1:  # Telegram marks a leading command, so it reaches the bot as one
        update["message"]["entities"] = [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
    body, headers = sign_update(update, details["secret_token"])
    return SampleRequest(body=body, headers=headers, conversation=str(chat_id))


def _group_request(details: Mapping[str, str], text: str, group: str, mention: bool) -> SampleRequest:
    try:
        chat_id = int(group)
    except ValueError:
        raise SystemExit(
            f"switchboard: a Telegram group id is a number, such as -1001234567890 (got {group!r})"
        ) from None
    username = details.get("bot_username") or None
    update = make_update(
        text,
        chat_id=chat_id,
        update_id=int(time.time() * 1000) % 2_000_000_000,
        message_id=int(time.time() * 1000) % 2_000_000_000,
        chat_type="supergroup",
        user_id=SIMULATED_USER,
        mention=username if mention else None,
    )
    body, headers = sign_update(update, details["secret_token"])
    return SampleRequest(body=body, headers=headers, conversation=str(chat_id))


async def _replies(http: aiohttp.ClientSession, details: Mapping[str, str], conversation: str) -> list[str]:
    url = details["fake_url"].rstrip("/") + "/_fake/calls"
    async with http.get(url, params={"chat_id": conversation}) as resp:
        calls = await resp.json()
    texts: list[str] = []
    for call in calls:
        text = str(call.get("params", {}).get("text", ""))
        try:
            texts.append(check_html(text) if call["params"].get("parse_mode") == "HTML" else text)
        except ValueError:
            texts.append(text)
    return texts


SIMULATION: Simulation[TelegramSettings] = Simulation(
    start=_start, details=_details, request=_request, replies=_replies, group_request=_group_request
)
"""How ``switchboard run`` fakes Telegram and how ``switchboard simulate telegram`` speaks to it."""
