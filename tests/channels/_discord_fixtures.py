"""Shared pieces of the Discord adapter tests: the fake, the adapter on it, a send context, signed requests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from nacl.signing import SigningKey

from switchboard.channels.base import FileData, RawRequest
from switchboard.channels.discord.adapter import DiscordChannel
from switchboard.channels.discord.fake.platform import FakeDiscord, bot_token, sign_interaction
from switchboard.channels.discord.settings import DiscordSettings
from switchboard.channels.registry import BuildContext
from switchboard.errors import DeliveryError

BOT_ID = "880000000000000001"
APP_ID = "900"
TOKEN = bot_token(BOT_ID)
KEY = SigningKey(bytes(range(32)))
PUBLIC_KEY = KEY.verify_key.encode().hex()


@dataclass
class Sending:
    """A send context as the outbox gives one: the idempotency key and the parts already sent."""

    idempotency_key: str = "run-1:reply-1"
    sent: tuple[str, ...] = ()
    files: dict[str, FileData] = field(default_factory=dict)
    paced: int = 0

    async def part_sent(self, platform_id: str) -> None:
        self.sent = (*self.sent, platform_id)

    async def pace(self) -> None:
        self.paced += 1

    async def read_file(self, path: str) -> FileData:
        if path not in self.files:
            raise DeliveryError(f"no such file {path}", channel="discord", retryable=False)
        return self.files[path]


def request(body: bytes, headers: dict[str, str] | None = None, account: str = "default") -> RawRequest:
    return RawRequest("POST", "/webhooks/discord", CIMultiDictProxy(CIMultiDict(headers or {})), {}, body, account)


def signed(payload: dict[str, Any] | bytes, key: SigningKey = KEY, timestamp: str | None = None) -> RawRequest:
    body, headers = sign_interaction(payload, key, timestamp=timestamp)
    return request(body, headers)


def settings(api_base_url: str = "http://127.0.0.1:9/api/v10", **overrides: Any) -> DiscordSettings:
    values: dict[str, Any] = {
        "bot_token": TOKEN,
        "public_key": PUBLIC_KEY,
        "application_id": APP_ID,
        "api_base_url": api_base_url,
        **overrides,
    }
    return DiscordSettings.model_validate(values)


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(TOKEN, bot_id=BOT_ID, application_id=APP_ID) as server:
        yield server


@pytest.fixture
async def channel(fake: FakeDiscord) -> AsyncIterator[DiscordChannel]:
    adapter = DiscordChannel(settings(fake.api_url), BuildContext(account="default"))
    await adapter.start()
    yield adapter
    await adapter.aclose()
