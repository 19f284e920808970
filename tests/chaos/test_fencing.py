"""Invariant 1 against a zombie (reliability R2): a worker frozen past its lease, then resumed, writes nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.channels.telegram.fake.platform import FakeTelegram
from switchboard.queue.stats import fenced_total
from tests.waiting import wait_until

from .checker import check
from .harness import Gateway, WorkerPool, chaos_env, collect, event_log, lease_holders, settled

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

FREEZE_AT_S = (0.1, 1.35, 1.35)
"""When each iteration freezes its worker, in seconds after the run started. Early: on resume the lease keeper
notices the loss first and the drain stops without writing. Late (just before the model answers): on resume the
turn goes on, and either its next write reaches Redis, which refuses it (the counter rises), or — when the reply
streams, whose every delta first checks the lease — the keeper's answer arrives first and the drain stops before
that write. Either way nothing of the zombie's is accepted (``stale_epochs``, ``completions`` below)."""
ITERATIONS = len(FREEZE_AT_S)
SESSIONS_PER_ITERATION = 4
MESSAGES = 2
WORKERS = 3
MODEL_DELAY_MS = 1500
"""Long turns, so the freeze lands while the model is thinking (not inside the send window)."""
STOP_S = 8.0
"""Four times the 2 s lease: the other workers take the sessions over meanwhile. A frozen worker's shards pass to the
others when its liveness key has expired (one lease), the takeover loop has seen it (half a heartbeat), the live
workers have recomputed their shares (one heartbeat) and looked at the new shards (one more): about 4 s, so twice the
lease was too tight a window for the sharded drain queue."""


async def _fenced(redis: aioredis.Redis) -> int:
    return await fenced_total(redis)


async def _starts(redis: aioredis.Redis, session: int) -> list[dict[str, Any]]:
    return [e for e in await event_log(redis, session) if e["kind"] == "run_started"]


async def _victim(redis: aioredis.Redis, pool: WorkerPool, sessions: list[int]) -> tuple[int, str, list[int], float]:
    """A worker holding leases of ``sessions`` with a run that started < 0.1 s ago: (slot, worker id, held, start)."""
    found: list[tuple[int, str, list[int], float]] = []

    async def running() -> bool:
        now = time.time()
        for worker, held in (await lease_holders(redis, sessions)).items():
            slot = pool.slot_of(worker)
            latest = [(await _starts(redis, s))[-1:] for s in held]
            fresh = [e[0]["at"] for e in latest if e and now - e[0]["at"] < 0.1]
            if slot is not None and fresh:
                found.append((slot, worker, held, max(fresh)))
                return True
        return False

    await wait_until(running, timeout=20, interval=0.01, what="a worker inside a run")
    return found[0]


async def _epochs(redis: aioredis.Redis, sessions: list[int]) -> dict[int, int]:
    return {s: max(e["epoch"] for e in await _starts(redis, s)) for s in sessions}


async def _freeze(redis: aioredis.Redis, pool: WorkerPool, sessions: list[int], freeze_at: float) -> str:
    """Freeze a worker ``freeze_at`` s into a run for :data:`STOP_S`, check the takeover, resume it; returns a note."""
    slot, worker, held, run_start = await _victim(redis, pool, sessions)
    await asyncio.sleep(max(0.0, run_start + freeze_at - time.time()))
    epochs = await _epochs(redis, held)
    before = await _fenced(redis)
    pool.stop(slot)
    try:
        await asyncio.sleep(STOP_S)
        after = await _epochs(redis, held)
    finally:
        pool.cont(slot)
    assert all(after[s] > epochs[s] for s in held), f"{held} not taken over while {worker} was frozen: {after}"
    if freeze_at > 1.0:
        zombie = rf"stopped: epoch ({'|'.join(str(e) for e in epochs.values())}) lost the lease"

        async def stopped_or_refused() -> bool:
            return await _rose(redis, before) or bool(pool.grep(zombie))

        await wait_until(stopped_or_refused, timeout=10, what="the resumed worker's next write refused, or it stopped")
    await wait_until(lambda: settled(redis), timeout=20, what="every message handled after the freeze")
    return (
        f"froze {worker} {freeze_at:g}s into a run of sessions {held} (epochs {epochs} -> {after}) for "
        f"{STOP_S:g}s; writes refused after it resumed: {await _fenced(redis) - before}"
    )


async def test_frozen_worker_is_fenced_after_its_lease_passes_on(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    fake: FakeTelegram,
    pools: Callable[[dict[str, str], int], WorkerPool],
    gateways: Callable[[dict[str, str]], Gateway],
    record_property: Callable[[str, Any], None],
    tmp_path: Path,
) -> None:
    env = chaos_env(base_env, fake.base_url, OFFLINE__DELAY_MS=str(MODEL_DELAY_MS))
    gateway = gateways(env)
    await gateway.start()
    pool = pools(env, WORKERS)
    await pool.ready()
    notes: list[str] = []
    all_sessions: list[int] = []
    for iteration, freeze_at in enumerate(FREEZE_AT_S):
        sessions = list(range(iteration * SESSIONS_PER_ITERATION, (iteration + 1) * SESSIONS_PER_ITERATION))
        all_sessions += sessions
        for index in range(MESSAGES):
            await asyncio.gather(*(gateway.send(s, index) for s in sessions))
        notes.append(f"iteration {iteration}: " + await _freeze(async_redis, pool, sessions, freeze_at))
    try:
        await wait_until(lambda: settled(async_redis), timeout=40, what="every message handled")
    finally:
        history = await collect(async_redis, all_sessions, fake, gateway.posted, pool.signals)
        (tmp_path / "history.json").write_text(history.dumps())
        report = check(history)
        lost_lease = pool.grep(r"lost the lease")
        print("\n[R2 zombie fencing] " + "\n".join(notes))
        print(report.summary())
        print(f"zombie log lines: {len(lost_lease)}; e.g. {lost_lease[:2]}")
        record_property("chaos_fencing", report.summary())
    total = len(all_sessions) * MESSAGES
    assert report.acked == total and report.answered == total, report.summary()
    assert not report.lost and not report.duplicates and not report.dead_lettered, report.summary()
    assert not report.stale_epochs and not report.completions and not report.orphan_terminals, report.summary()
    assert not report.unexplained_takeovers and report.takeovers >= ITERATIONS, report.summary()
    late = sum(1 for at in FREEZE_AT_S if at > 1.0)
    assert report.counters["fenced_rejections"] + len(lost_lease) >= late, report.summary()
    assert report.counters["send_window_duplicates"] == 0, report.summary()
    # every plain answer is one model step: a zombie's step fact, had it been accepted, would be one too many
    kinds = [e["kind"] for s in all_sessions for e in history.events[s]]
    assert kinds.count("step") == kinds.count("run_completed") == total, report.summary()
    assert not report.inversions, report.summary()


async def _rose(redis: aioredis.Redis, before: int) -> bool:
    return await _fenced(redis) > before
