"""Takeover after a crash (issue #6, item 11), with real worker processes and the default heartbeat.

The lease is set to 30 s here, so a recovery faster than the lease can only come from the heartbeat takeover: the
old code waited for the lease to lapse (≥ 30 s), so the bound below (15 s, three times the ≤ 5 s the design aims
at, generous for a 2-core CI box) fails on it. The measured times are printed; they are what docs/benchmarks.md reports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.channels.telegram.fake.platform import FakeTelegram
from tests.waiting import wait_until

from .checker import check, message_text
from .harness import Gateway, WorkerPool, chaos_env, collect, event_log, lease_holders, replies

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]

LEASE_MS = "30000"
"""Far longer than a heartbeat takeover: lease expiry cannot explain a fast recovery."""
KILLS = 4
SESSIONS_PER_KILL = 6
WORKERS = 2
MODEL_DELAY_MS = "1000"
"""Runs long enough for the kill to land inside them."""
RECOVERY_BOUND_S = 15.0
"""Half the lease: only the heartbeat takeover gets below it (the old code needed ≥ 30 s)."""


def _answered(fake: FakeTelegram, wanted: set[str]) -> set[str]:
    return {t for r in replies(fake) for t in wanted if t in r.text}


async def test_a_sigkilled_workers_sessions_are_answered_within_seconds(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
    gateways: Callable[[dict[str, str]], Gateway],
    record_property: Callable[[str, Any], None],
    tmp_path: Path,
) -> None:
    env = chaos_env(
        base_env,
        fake.base_url,
        QUEUE__LEASE_MS=LEASE_MS,
        QUEUE__REAPER_INTERVAL_S="2",
        QUEUE__MAX_ATTEMPTS="5",
        OFFLINE__DELAY_MS=MODEL_DELAY_MS,
    )
    gateway = gateways(env)
    await gateway.start()
    pool = pools(env, WORKERS)
    await pool.ready()
    recoveries: list[float] = []
    all_sessions: list[int] = []
    for kill in range(KILLS):
        sessions = list(range(kill * SESSIONS_PER_KILL, (kill + 1) * SESSIONS_PER_KILL))
        all_sessions += sessions
        await asyncio.gather(*(gateway.send(s, 0) for s in sessions))
        victim: list[int] = []

        async def inside_runs(sessions: list[int] = sessions, victim: list[int] = victim) -> bool:
            for worker in await lease_holders(async_redis, sessions):
                slot = pool.slot_of(worker)
                if slot is not None:
                    victim.append(slot)
                    return True
            return False

        await wait_until(inside_runs, timeout=20, interval=0.02, what="a worker inside a run")
        await asyncio.sleep(0.3)  # well inside the 1 s runs
        wanted = {message_text(s, 0) for s in sessions}
        outstanding = wanted - _answered(fake, wanted)
        killed_at = time.monotonic()
        pool.kill(victim[0])
        await wait_until(
            lambda outstanding=outstanding: _answered(fake, outstanding) == outstanding,  # type: ignore[misc]
            timeout=RECOVERY_BOUND_S + 10,
            interval=0.05,
            what=f"messages outstanding at kill {kill} answered",
        )
        recoveries.append(time.monotonic() - killed_at)
        await pool.ready()
    history = await collect(async_redis, all_sessions, fake, gateway.posted, pool.signals)
    (tmp_path / "history.json").write_text(history.dumps())
    report = check(history)
    ordered = sorted(recoveries)
    print(
        f"\n[takeover] lease {int(LEASE_MS) // 1000} s, default heartbeat; {KILLS} SIGKILLs; kill → every outstanding "
        f"message answered (s): {[round(s, 2) for s in recoveries]}; max {ordered[-1]:.2f} s"
    )
    print(report.summary())
    record_property("takeover_seconds", recoveries)
    assert max(recoveries) < RECOVERY_BOUND_S, recoveries
    total = len(all_sessions)
    assert report.acked == total and report.answered == total, report.summary()
    assert not report.lost and not report.dead_lettered and not report.inversions, report.summary()
    assert not report.unexplained_duplicates, report.summary()
    assert report.max_runs_per_session == 1 and not report.stale_epochs, report.summary()
    assert not report.unexplained_takeovers and report.takeovers >= KILLS, report.summary()
    assert pool.grep(r"took over \d+ sessions from dead workers"), pool.logs()


async def test_a_worker_busy_with_a_ten_second_turn_is_not_taken_over(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
    gateways: Callable[[dict[str, str]], Gateway],
) -> None:
    env = chaos_env(base_env, fake.base_url, QUEUE__LEASE_MS=LEASE_MS, OFFLINE__DELAY_MS="10000")
    gateway = gateways(env)
    await gateway.start()
    pool = pools(env, WORKERS)
    await pool.ready()
    await gateway.send(0, 0)
    wanted = {message_text(0, 0)}
    await wait_until(lambda: _answered(fake, wanted) == wanted, timeout=40, what="the slow reply")
    starts = [e for e in await event_log(async_redis, 0) if e["kind"] == "run_started"]
    assert len(starts) == 1, starts  # one run, one epoch: nobody took the busy worker for dead
    assert len([r for r in replies(fake) if message_text(0, 0) in r.text]) == 1
    assert not pool.grep(r"took over \d+ sessions"), pool.logs()
    assert not pool.grep(r"lost the lease"), pool.logs()
    assert pool.restarts == 0
