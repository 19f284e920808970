"""Scheduled jobs under crashes: real worker processes SIGKILLed and Redis killed and restarted while occurrences
fall due; every occurrence is accepted into its session exactly once and its message reaches the chat."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.channels.telegram.fake.platform import FakeTelegram
from switchboard.core.schedules import ScheduleSpec
from switchboard.queue.embedded import EmbeddedRedis
from switchboard.queue.keys import GlobalKeys
from switchboard.queue.schedules import create_job, get_job, job_session
from tests.waiting import wait_until

from .harness import WorkerPool, chaos_env, chat_of, event_log, replies

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

JOBS = 36
CHATS = 12
SPREAD_S = 18.0
"""The jobs fall due one every half second over this long, from a few seconds after the workers are up."""
G = GlobalKeys()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A server of this test's own (own data dir, AOF), so it can be killed and restarted."""
    server = EmbeddedRedis(tmp_path / "private-redis", port=0)
    server.start()
    yield server
    if server.process is not None:
        os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


def _job(index: int, due: float) -> ScheduleSpec:
    return ScheduleSpec.model_validate(
        {
            "id": f"chaos-{index}",
            "target": {"channel": "telegram", "conversation": str(chat_of(index % CHATS)), "agent": "assistant"},
            "action": "message",
            "text": f"scheduled note {index}",
            "at": dt.datetime.fromtimestamp(due, dt.UTC).isoformat(),
            "grace_s": 120,
        }
    )


async def test_scheduled_jobs_run_once_per_occurrence_through_worker_kills_and_a_redis_restart(
    base_env: dict[str, str],
    private_redis: EmbeddedRedis,
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
    record_property: Callable[[str, Any], None],
) -> None:
    env = chaos_env(
        base_env | {"SWITCHBOARD_REDIS_URL": private_redis.url}, fake.base_url, QUEUE__SCHEDULE_POLL_S="0.1"
    )
    client = aioredis.Redis.from_url(private_redis.url)
    pool = pools(env, 2)
    await pool.ready()
    start = time.time() + 2.0
    jobs = [_job(i, start + i * SPREAD_S / JOBS) for i in range(JOBS)]
    for job in jobs:
        await create_job(client, job)

    # Chaos while they fall due: both workers SIGKILLed (the supervisor restarts them), Redis SIGKILLed and
    # restarted on its data dir, then a worker killed again.
    kills = 0
    await asyncio.sleep(4.0)
    pool.kill(0)
    kills += 1
    await asyncio.sleep(2.0)
    pool.kill(1)
    kills += 1
    await asyncio.sleep(2.0)
    private_redis.kill()
    await asyncio.sleep(1.5)
    private_redis.start()
    await client.aclose()
    client = aioredis.Redis.from_url(private_redis.url)
    await asyncio.sleep(3.0)
    pool.kill(0)
    kills += 1

    texts = {job.text for job in jobs}

    def all_sent() -> bool:
        return texts <= {reply.text for reply in replies(fake)}

    await wait_until(all_sent, "every scheduled message reaches its chat", timeout=90.0)

    # Exactly once into each session: one accepted message per occurrence, whatever fired it how often.
    accepted: Counter[str] = Counter()
    for index in range(CHATS):
        for fact in await event_log(client, index):
            if fact["kind"] == "message_received" and str(fact.get("sender", "")).startswith("schedule:"):
                accepted[fact["sender"].removeprefix("schedule:")] += 1
    assert accepted == Counter({job.id: 1 for job in jobs})
    for job in jobs:
        view = await get_job(client, job.id)
        assert view is not None and view.next_at is None, job.id
        assert job_session(job).endswith(job.target.conversation)
    assert await client.zcard(G.schedules_due) == 0
    await asyncio.sleep(0.5)  # the last occurrence's record is written just after its message is accepted
    assert await client.zcard(G.schedules_inflight) == 0

    # At the chat: each at least once; a kill between a send and its record may repeat one (Telegram takes no
    # idempotency key), never more than once per kill.
    sent = Counter(reply.text for reply in replies(fake) if reply.text in texts)
    duplicates = sum(count - 1 for count in sent.values())
    record_property("schedule_duplicates_at_chat", duplicates)
    assert duplicates <= kills, sent
    await client.aclose()


async def test_a_yaml_job_is_stored_by_the_workers_and_delivered(
    base_env: dict[str, str],
    redis_url: str,
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
) -> None:
    env = chaos_env(base_env, fake.base_url, QUEUE__SCHEDULE_POLL_S="0.1")
    due = dt.datetime.fromtimestamp(time.time() + 4, dt.UTC).isoformat()
    config = Path(env["SWITCHBOARD_CONFIG"])
    config.write_text(
        config.read_text()
        + "\nschedules:\n"
        + f"  - {{id: from-yaml, target: {{channel: telegram, conversation: '{chat_of(3)}'}}, action: message,\n"
        + f"     text: 'hello from the YAML file', at: '{due}'}}\n"
    )
    pool = pools(env, 2)  # both store the same job at start: one job, one occurrence
    await pool.ready()
    await wait_until(
        lambda: "hello from the YAML file" in {r.text for r in replies(fake)}, "the YAML job is delivered", timeout=30
    )
    await asyncio.sleep(1.0)
    assert [r.text for r in replies(fake)].count("hello from the YAML file") == 1
    client = aioredis.Redis.from_url(redis_url)
    view = await get_job(client, "from-yaml")
    await client.aclose()
    assert view is not None and view.spec.created_by == "config" and view.fired == 1
