"""A process running a listener host for one Telegram bot that long-polls the fake Bot API (killed by the tests).

Usage: ``python -m tests.queue.listener_process REDIS_URL FAKE_URL TOKEN HOLDER_ID LEASE_MS``. What its listener
receives is appended to the Redis list ``test:emitted:<HOLDER_ID>`` (one update's dedup key per entry).
"""

from __future__ import annotations

import asyncio
import sys

import redis.asyncio as aioredis

from switchboard.channels.base import Channel, Emit, Inbound
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.channels.telegram.settings import TelegramSettings
from switchboard.queue.holders import ListenerHost


async def main(redis_url: str, fake_url: str, token: str, holder: str, lease_ms: int) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    block = TelegramSettings.model_validate({"bot_token": token, "api_base_url": fake_url, "transport": "polling"})
    adapter = TelegramChannel(block, poll_timeout=1, poll_backoff=(0.05, 0.2))

    def emit_for(channel: Channel) -> Emit:
        async def emit(inbound: Inbound) -> None:
            for message in inbound.messages:
                await redis.rpush(f"test:emitted:{holder}", message.dedup_key)

        return emit

    await ListenerHost(redis, [adapter], emit_for, lease_ms=lease_ms, holder_id=holder).run()


if __name__ == "__main__":
    url, fake, token, holder, lease = sys.argv[1:6]
    asyncio.run(main(url, fake, token, holder, int(lease)))
