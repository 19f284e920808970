"""Invariant 3 when Redis itself fails (reliability R5, R6): frozen, then killed and restarted on its data dir."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.channels.telegram.fake.platform import FakeTelegram
from switchboard.queue.embedded import EmbeddedRedis
from tests.waiting import wait_until

from .checker import Signal, check
from .harness import Gateway, WorkerPool, chaos_env, collect, settled, text

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(150)]

SESSIONS = 40
FROZEN_PROBE = SESSIONS
"""Session of the message posted while Redis is frozen (it may land after the freeze: FIFO then puts it first)."""
KILLED_PROBE = SESSIONS + 1
"""Session of the message posted while Redis is dead."""
RECOVERY_BOUND_S = 20.0
"""Everything acknowledged is answered within this long after Redis is back (ten lease TTLs; R6 allows 60 s for a
backlog of 500 messages, this one has 120 short turns)."""
WEBHOOK_BOUND_S = 2.5
"""Under Slack's 3 s: the platform must hear 503 (and retry) rather than time out."""
HEALTHY_BOUND_S = 5.0
FREEZE_S = 3.0


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A server of this test's own (fixed loopback port, own data dir), so it can be frozen, killed and restarted."""
    server = EmbeddedRedis(tmp_path / "private-redis", port=0)
    server.start()
    yield server
    if server.process is not None:
        os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


async def _health(gateway: Gateway) -> int:
    async with gateway.client.get(f"{gateway.url}/healthz") as response:
        await response.read()
        return response.status


async def test_redis_outage_answers_503_then_recovers_without_losing_acknowledged_messages(
    base_env: dict[str, str],
    private_redis: EmbeddedRedis,
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
    gateways: Callable[[dict[str, str]], Gateway],
    record_property: Callable[[str, Any], None],
    tmp_path: Path,
) -> None:
    env = chaos_env(base_env | {"SWITCHBOARD_REDIS_URL": private_redis.url}, fake.base_url, OFFLINE__DELAY_MS="300")
    client = aioredis.Redis.from_url(private_redis.url)
    gateway = gateways(env)
    await gateway.start()
    pool = pools(env, 2)
    await pool.ready()
    notes: list[str] = []
    config = {text(k): text(v) for k, v in (await client.config_get("appendonly")).items()}
    assert config == {"appendonly": "yes"}, "R5 config guard: the server must run with AOF on"

    async def burst(index: int) -> None:
        """Message ``index`` of every session, acknowledged before the outage that follows."""
        await asyncio.gather(*(gateway.send(s, index) for s in range(SESSIONS)))

    # 1. Redis frozen (SIGSTOP): the webhook cannot commit and must say so in time
    await burst(0)
    assert private_redis.process is not None
    os.kill(private_redis.process.pid, signal.SIGSTOP)
    try:
        frozen = await gateway.send(FROZEN_PROBE, 0)
        frozen_health = await _health(gateway)
        stall_s = frozen.done_at - frozen.sent_at
        await asyncio.sleep(max(0.0, FREEZE_S - stall_s))
    finally:
        os.kill(private_redis.process.pid, signal.SIGCONT)
    notes.append(f"frozen Redis: webhook {frozen.status} after {stall_s:.2f}s, /healthz {frozen_health}")
    assert frozen.status == 503 and stall_s <= WEBHOOK_BOUND_S and frozen_health == 503, notes

    # 2. Redis killed (SIGKILL) with a backlog acknowledged but not yet answered, then restarted on its data dir
    await burst(1)
    await burst(2)
    pid = private_redis.process.pid
    private_redis.kill()
    pool.signals.append(Signal(time.time(), "REDIS_DOWN", None, pid))
    killed = await gateway.send(KILLED_PROBE, 0)
    killed_s = killed.done_at - killed.sent_at
    killed_health = await _health(gateway)
    await asyncio.sleep(1.0)
    restarting = time.monotonic()
    private_redis.start()
    await wait_until(lambda: _is_healthy(gateway), timeout=HEALTHY_BOUND_S + 5, interval=0.05, what="/healthz 200")
    healthy_s = time.monotonic() - restarting
    notes.append(
        f"killed Redis: webhook {killed.status} after {killed_s:.2f}s, /healthz {killed_health}; "
        f"healthy {healthy_s:.2f}s after the restart began"
    )
    assert killed.status == 503 and killed_s <= WEBHOOK_BOUND_S and killed_health == 503, notes
    assert healthy_s <= HEALTHY_BOUND_S, notes

    await client.aclose()  # its connection died with the server
    client = aioredis.Redis.from_url(private_redis.url)

    # 3. the platform retries what got 503 (same update ids): accepted once, whether or not the first try landed
    try:
        retried = [await gateway.send(p.session, p.index) for p in (frozen, killed)]
        assert [p.status for p in retried] == [200, 200], retried
        back = time.monotonic() - restarting
        await wait_until(
            lambda: settled(client),
            timeout=RECOVERY_BOUND_S - back,
            what=f"every acknowledged message handled within {RECOVERY_BOUND_S:g}s of Redis restarting",
        )
    finally:
        history = await collect(client, range(SESSIONS + 2), fake, gateway.posted, pool.signals)
        (tmp_path / "history.json").write_text(history.dumps())
        report = check(history)
        print("\n[R5/R6 Redis outage] " + "; ".join(notes))
        print(report.summary())
        record_property("chaos_redis_outage", "; ".join(notes) + "\n" + report.summary())
        await client.aclose()
    acked = {(p.session, p.index) for p in gateway.posted if p.status == 200}
    assert len(acked) == 3 * SESSIONS + 2, report.summary()
    assert not report.lost and not report.dead_lettered, report.summary()
    # a run whose reply went out just before Redis died could not record it: counted, and nothing else repeats
    assert report.duplicate_replies <= report.counters["send_window_duplicates"], report.summary()
    assert not report.inversions and not report.misrouted, report.summary()
    assert report.max_runs_per_session == 1 and not report.stale_epochs, report.summary()
    assert pool.restarts == 0, pool.logs()


async def _is_healthy(gateway: Gateway) -> bool:
    try:
        return await _health(gateway) == 200
    except Exception:
        return False
