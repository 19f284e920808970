"""The drain's merged steps under real worker processes: a reply's parts, the releasing completion, the drain entry.

A drain's first begin takes the lease, its last completion releases the drain and closes its entry, and a send's
part is recorded only before the next platform call: each is a place where a SIGKILL or a message landing at the
same moment could lose, repeat or strand something.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterable

import pytest
import redis.asyncio as aioredis

from switchboard.channels.telegram.fake.platform import FakeTelegram
from switchboard.queue.keys import SessionKeys, ShardKeys
from switchboard.queue.stats import read_stats
from tests.shardindexes import count_of
from tests.waiting import wait_until

from .checker import check
from .harness import Gateway, WorkerPool, chaos_env, chat_of, collect, key_of, lease_holders, replies, settled

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]

LONG_WORD = "x" * 5_000
"""The offline model repeats it: a reply over Telegram's 4,096 characters, sent as two messages."""
RETRY_AFTER_S = 6
"""The 429 on the reply's second part: the worker waits this long, holding the first part sent, and is killed."""


async def test_a_worker_killed_waiting_out_a_429_between_parts_never_sends_a_part_twice(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
    gateways: Callable[[dict[str, str]], Gateway],
) -> None:
    """Part 1 goes out, part 2 gets a 429, and the worker is SIGKILLed while it waits: part 1 is never sent again.

    A part is recorded once the next platform call is due; the wait on a 429 comes before that call, so the part sent
    must be recorded before the wait, or a worker killed in it (seconds, not the microseconds of a send window) has
    the next one send the part again.
    """
    env = chaos_env(base_env, fake.base_url, OFFLINE__DELAY_MS="0")
    gateway = gateways(env)
    await gateway.start()
    pool = pools(env, 1)
    await pool.ready(timeout=30)
    fake.fail_next(1, retry_after=RETRY_AFTER_S, method="sendMessage", after=1)
    posted = await gateway.send(0, 0, text=LONG_WORD)
    assert posted.status == 200

    def limited() -> bool:
        return any(c.method == "sendMessage" and c.status == 429 for c in fake.calls)

    await wait_until(limited, timeout=30, what="the second part refused with a 429")
    assert len(replies(fake)) == 1  # the first part went out
    time.sleep(0.3)  # the worker is in its wait now (its outbox retry), well before the retry is due
    pool.kill(0)
    await wait_until(lambda: settled(async_redis), timeout=60, interval=0.25, what="the message answered")
    texts = [r.text for r in replies(fake) if r.chat_id == chat_of(0)]
    assert len(texts) == 2, [t[:40] + f"...({len(t)})" for t in texts]
    assert LONG_WORD[:100] in texts[0] and len(texts[0]) + len(texts[1]) > len(LONG_WORD), texts


async def test_a_worker_killed_inside_a_parts_send_repeats_only_that_part_and_counts_it(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
    gateways: Callable[[dict[str, str]], Gateway],
) -> None:
    """SIGKILL while the platform takes the second part (it delivers it): that part goes out twice, counted; none else.

    The first part was recorded before the second part's call; the second, in flight when the worker died, is the
    one send the next worker cannot know about: it is sent again and counted in ``send_window_duplicates``.
    """
    env = chaos_env(base_env, fake.base_url, OFFLINE__DELAY_MS="0")
    gateway = gateways(env)
    await gateway.start()
    pool = pools(env, 1)
    await pool.ready(timeout=30)
    fake.fail_next(1, retry_after=1, method="sendMessage", after=1)  # the second part waits 1 s, then ...
    fake.delay_next(1, 3, method="sendMessage")  # ... is delivered 3 s after its call
    assert (await gateway.send(0, 0, text=LONG_WORD)).status == 200

    def delayed() -> bool:
        return sum(1 for c in fake.calls if c.method == "sendMessage") == 2 and not fake.state.plan

    await wait_until(delayed, timeout=30, what="the second part's retry in flight")
    time.sleep(0.3)
    pool.kill(0)
    await wait_until(lambda: settled(async_redis), timeout=60, interval=0.25, what="the message answered")
    await wait_until(lambda: len(replies(fake)) >= 3, timeout=10, what="the killed worker's part delivered too")
    await asyncio.sleep(0.5)  # nothing more comes
    texts = [r.text for r in replies(fake) if r.chat_id == chat_of(0)]
    assert len(texts) == 3 and texts[1] == texts[2] != texts[0], [t[:20] + f"...({len(t)})" for t in texts]
    assert LONG_WORD[:100] in texts[0]
    stats = await read_stats(async_redis)
    assert stats.send_window_duplicates == 1 and stats.runs_completed == 1


SESSIONS = 30
MESSAGES = 6


async def test_drains_released_by_their_last_completion_strand_nothing_and_leak_no_rq_bookkeeping(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
    gateways: Callable[[dict[str, str]], Gateway],
) -> None:
    """Messages land as their session's drain ends (before, during and after its releasing step): each answered once.

    Every session gets its messages a few milliseconds to a few turns apart, so some land just before the last
    completion (the drain goes on), some in the same moment, some between the release and the worker's next dequeue
    (a new drain job). Afterwards no drain flag, lease or runnable mark is left, and no drain entry: none queued in
    the sessions' shards, none in their running sets.
    """
    rng = random.Random(2026_12_07)
    env = chaos_env(base_env, fake.base_url, OFFLINE__DELAY_MS="3")
    gateway = gateways(env)
    await gateway.start()
    pool = pools(env, 2)
    await pool.ready(timeout=30)

    async def sender(session: int) -> None:
        for index in range(MESSAGES):
            assert (await gateway.send(session, index)).status == 200
            await asyncio.sleep(rng.choice([0.0, 0.01, 0.03, 0.06, 0.1, 0.2]))

    await asyncio.gather(*(sender(s) for s in range(SESSIONS)))
    await wait_until(lambda: settled(async_redis), timeout=90, interval=0.25, what="every message answered")
    report = check(await collect(async_redis, range(SESSIONS), fake, gateway.posted))
    assert report.acked == SESSIONS * MESSAGES and not report.lost and not report.duplicates, report.summary()
    assert not report.inversions and report.max_runs_per_session == 1, report.summary()
    await _nothing_left_behind(async_redis, env, range(SESSIONS))


FROZEN_SESSIONS = 3


async def test_a_worker_frozen_past_its_lease_writes_nothing_and_leaks_no_rq_bookkeeping_when_resumed(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
    gateways: Callable[[dict[str, str]], Gateway],
) -> None:
    """SIGSTOP the worker that took the sessions (its first step took the lease with the turn) until the other
    worker has answered them and its last completions released the drains; then SIGCONT: the resumed worker's turns
    are fenced (nothing of theirs lands), every message is answered once, and no drain job, flag or lease is left.
    """
    env = chaos_env(base_env, fake.base_url, OFFLINE__DELAY_MS="1500")
    gateway = gateways(env)
    await gateway.start()
    pool = pools(env, 1)
    await pool.ready(timeout=30)
    for session in range(FROZEN_SESSIONS):
        assert (await gateway.send(session, 0)).status == 200

    async def all_taken() -> bool:
        return sum(len(s) for s in (await lease_holders(async_redis, range(FROZEN_SESSIONS))).values()) == 3

    await wait_until(all_taken, timeout=20, what="the first worker running every session")
    pool.stop(0)
    other = pools(env, 1)  # a second pool: the frozen worker's supervisor leaves a stopped worker alone anyway
    await other.ready(timeout=30)
    await wait_until(lambda: settled(async_redis), timeout=60, interval=0.25, what="answered by the other worker")
    before = await read_stats(async_redis)
    pool.cont(0)
    await asyncio.sleep(3.0)  # the resumed worker's model answers (1.5 s) and its writes are refused
    report = check(await collect(async_redis, range(FROZEN_SESSIONS), fake, gateway.posted, pool.signals))
    assert not report.lost and not report.duplicates and not report.stale_epochs, report.summary()
    assert not report.completions and report.takeovers >= FROZEN_SESSIONS, report.summary()
    after = await read_stats(async_redis)
    assert after.runs_completed == before.runs_completed == FROZEN_SESSIONS
    refused = after.fenced_rejections - before.fenced_rejections
    assert refused or pool.grep(r"lost the lease|was lost"), pool.logs()  # it did resume, and was stopped
    await _nothing_left_behind(async_redis, env, range(FROZEN_SESSIONS))


async def _nothing_left_behind(redis: aioredis.Redis, env: dict[str, str], sessions: Iterable[int]) -> None:
    """No drain flag, lease or runnable mark left, and no drain entry queued or running in the sessions' shards."""
    keys = [SessionKeys(key_of(s)) for s in sessions]
    shards = sorted({k.shard.shard for k in keys})

    async def bookkeeping() -> dict[str, object]:
        return {
            "drain flags": sum([await redis.exists(k.drain) for k in keys]),
            "leases": sum([await redis.exists(k.lease) for k in keys]),
            "runnable": await count_of(redis, lambda s: s.runnable),
            "queued": sum([await redis.llen(ShardKeys(n).drainq) for n in shards]),
            "running": [m for n in shards for m in await redis.zrange(ShardKeys(n).wip, 0, -1)],
        }

    clean = {"drain flags": 0, "leases": 0, "runnable": 0, "queued": 0, "running": []}
    seen: dict[str, object] = {}

    async def cleaned() -> bool:
        seen.update(await bookkeeping())
        return seen == clean

    await wait_until(cleaned, timeout=30, what=lambda: f"nothing left behind; left: {seen}")
    await asyncio.sleep(1.5)  # a reaper pass or two later: still nothing (nothing it would repair)
    assert await bookkeeping() == clean
