"""Exactly-once web chat replies under SIGKILL: real workers, real web chat sessions, the web streams counted.

The web chat's delivery is a Redis write, so the reply's stream entry and its outbox ``sent`` record are one fenced
script: a worker killed at any point cannot make a re-run append the same reply twice. (Before, a kill between the
two writes duplicated a reply: one in 500 messages with 10 kills.)
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.channels.telegram.fake.platform import FakeTelegram
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.stats import read_stats
from switchboard.types import SessionKey
from switchboard.web.webchat.access import hash_token
from tests.waiting import wait_until

from .harness import Gateway, WorkerPool, chaos_env, settled, text

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

SESSIONS = 40
MESSAGES = 8
WORKERS = 3
KILLS = 20
KILL_GAP_S = (0.3, 0.8)
POST_GAP_S = 0.15
SEND_ATTEMPTS = 5
"""As the web chat's client: a post answered 503 (Redis did not confirm in time) is sent again with its client_id."""
MAX_ATTEMPTS = "20"
"""A kill counts as an attempt; this many keeps every message answered rather than dead-lettered (not measured)."""


async def test_sigkilled_workers_never_duplicate_a_web_chat_reply(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
    gateways: Callable[[dict[str, str]], Gateway],
    record_property: Callable[[str, Any], None],
) -> None:
    rng = random.Random(20261201)
    env = chaos_env(
        base_env,
        fake.base_url,
        OFFLINE__DELAY_MS="30",
        QUEUE__MAX_ATTEMPTS=MAX_ATTEMPTS,
        LIMITS__SESSIONS_PER_ADDRESS_PER_HOUR="0",
        LIMITS__MESSAGES_PER_SESSION_PER_MINUTE="0",
        LIMITS__MESSAGES_PER_SENDER_PER_MINUTE="0",
    )
    gateway = gateways(env)
    await gateway.start()
    pool = pools(env, WORKERS)
    await pool.ready()

    tokens: list[str] = []
    for _ in range(SESSIONS):
        async with gateway.client.post(f"{gateway.url}/api/chat/sessions") as response:
            assert response.status == 201, await response.text()
            tokens.append((await response.json())["token"])
    keys = [SessionKey(text(await async_redis.get(GlobalKeys().web_token(hash_token(t))))) for t in tokens]
    accepted: dict[int, list[str]] = {i: [] for i in range(SESSIONS)}
    unconfirmed: list[str] = []

    async def sender(session: int) -> None:
        headers = {"Authorization": f"Bearer {tokens[session]}"}
        for index in range(MESSAGES):
            body = {"text": f"w{session}-m{index}", "client_id": uuid.uuid4().hex}
            for _attempt in range(SEND_ATTEMPTS):  # as the web chat's own client: a 503 is sent again, same client_id
                async with gateway.client.post(f"{gateway.url}/api/chat/messages", json=body, headers=headers) as r:
                    if r.status == 503 and _attempt < SEND_ATTEMPTS - 1:
                        unconfirmed.append(body["client_id"])  # Redis did not confirm in time (a starved machine)
                        await asyncio.sleep(0.5)
                        continue
                    assert r.status == 202, await r.text()
                    accepted[session].append((await r.json())["message_id"])
                    break
            await asyncio.sleep(POST_GAP_S * rng.uniform(0.5, 1.5))

    async def chaos() -> None:
        """Kill a worker that holds a web chat session's lease (inside a run or a send), or any after 1 s."""
        while len(pool.signals) < KILLS:
            await asyncio.sleep(rng.uniform(*KILL_GAP_S))
            waited = 0.0
            while True:
                alive = pool.alive()
                leases = await async_redis.mget([SessionKeys(k).lease for k in keys])
                busy = {text(v).split(":", 1)[1] for v in leases if v}
                running = [slot for slot in alive if pool.worker_id(slot) in busy]
                if running or (alive and waited >= 1.0):
                    pool.kill(rng.choice(running or alive))
                    break
                await asyncio.sleep(0.005)
                waited += 0.005

    started = time.monotonic()
    await asyncio.gather(chaos(), *(sender(s) for s in range(SESSIONS)))
    await wait_until(lambda: settled(async_redis), timeout=120, interval=0.25, what="every message handled")
    elapsed = time.monotonic() - started

    replies: Counter[str] = Counter()
    for key in keys:
        entries: Any = await async_redis.xrange(SessionKeys(key).web)
        for _id, fields in entries:
            if fields[b"type"] == b"message":
                replies[json.loads(fields[b"data"])["reply_to"]] += 1
    posted = [m for ids in accepted.values() for m in ids]
    duplicates = {m: n for m, n in replies.items() if n > 1}
    unanswered = [m for m in posted if replies[m] == 0]
    stats = await read_stats(async_redis)
    print(
        f"\n[web exactly-once] {len(posted)} web chat messages in {SESSIONS} sessions, {len(pool.signals)} SIGKILLs "
        f"in {elapsed:.1f}s: duplicate replies in the web streams={sum(n - 1 for n in duplicates.values())}, "
        f"unanswered={len(unanswered)}, runs_completed={stats.runs_completed}, dead_letters={stats.dead_letters}, "
        f"send_window_duplicates={stats.send_window_duplicates}, posts sent again after a 503={len(unconfirmed)}"
    )
    record_property("web_duplicate_replies", sum(n - 1 for n in duplicates.values()))
    record_property("web_posts_sent_again_after_503", len(unconfirmed))
    assert len(posted) == SESSIONS * MESSAGES and len(pool.signals) == KILLS
    assert not duplicates, duplicates
    assert not unanswered and stats.dead_letters == 0, (unanswered, stats)
    assert stats.send_window_duplicates == 0  # no send window: nothing was even possibly duplicated
