"""Concurrency inside one worker: how many sessions' turns run at once when the model takes 2 s per answer.

One ``switchboard worker`` process with ``SWITCHBOARD_OFFLINE__DELAY_MS=2000`` (the offline model standing in for
a slow model); S sessions (default 100, more than the worker's cap of concurrent drains) each get one message
at the same moment through the Telegram webhook. From every session's event log, each run's
``run_started`` → ``run_completed`` interval; the peak number of overlapping intervals is how many turns ran
at once. The worker's RSS is sampled every 20 ms with psutil. Side by side: the same worker idle before the
load, and the time a strictly sequential worker would need (S × 2 s).

    python -m bench.concurrency
    python -m bench.concurrency --sessions 64 --delay-ms 2000
    python -m bench.concurrency --quick

The abuse limits are checked on every message, as in production, but set far above the load (``HIGH_LIMITS``: the
default sessions per sender and inbox depth are no concern here, but the bench must not depend on them); a run that
saw any message dropped by a limit fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import time

import aiohttp
import psutil

from bench._harness import (
    SUMMARY_HEADERS,
    Row,
    cores,
    fmt,
    median,
    parser,
    pin,
    render_table,
    rounds_of,
    verdicts,
    workdir,
)
from bench._stack import HIGH_LIMITS, Replies, Stack, dropped, gateway
from switchboard.queue.connection import async_client
from switchboard.queue.eventlog import read_events
from switchboard.queue.fanout import each_shard
from switchboard.settings import QueueSettings
from switchboard.types import SessionKey

TARGET_CONCURRENT = 50
TARGET_RSS_MIB = 150.0
TOKEN = re.compile(r"conc\d+x\d+y")


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """The largest number of intervals open at the same instant (an end at t closes before a start at t)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    peak = current = 0
    for _, step in edges:
        current += step
        peak = max(peak, current)
    return peak


async def run_intervals(redis_url: str) -> list[tuple[float, float]]:
    """``(run_started, run_completed)`` times of every completed run, from the sessions' event logs."""
    redis = async_client(redis_url)
    try:
        members = [m for ms in await each_shard(redis, lambda pipe, s: pipe.zrange(s.sessions, 0, -1)) for m in ms]
        out = []
        for member in members:
            key = SessionKey(member.decode() if isinstance(member, bytes) else str(member))
            started: dict[str, float] = {}
            for event in await read_events(redis, key, 500):
                mid = str(event.get("message_id"))
                if event["kind"] == "run_started":
                    started[mid] = float(event["at"])
                elif event["kind"] == "run_completed" and mid in started:
                    out.append((started.pop(mid), float(event["at"])))
        return out
    finally:
        await redis.aclose()


async def sample_rss(proc: psutil.Process, stop: asyncio.Event, peak: list[float]) -> None:
    """Keep the highest RSS (MiB) of ``proc`` in ``peak[0]`` until ``stop``."""
    while not stop.is_set():
        with contextlib.suppress(psutil.Error):
            peak[0] = max(peak[0], proc.memory_info().rss / 2**20)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.02)


async def one_round(
    stack: Stack, http: aiohttp.ClientSession, round_no: int, sessions: int, delay_ms: int
) -> dict[str, float]:
    """Send one message to each of ``sessions`` sessions at once; measure overlap, wall time and peak RSS."""
    idle = stack.worker.rss_mib()
    peak = [idle]
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(stack.worker.ps, stop, peak))
    base = 3_000_000 + round_no * 10_000
    tokens = {f"conc{round_no}x{s}y" for s in range(sessions)}
    began = time.time()
    await asyncio.gather(
        *(stack.send(http, base + s, base + s, f"slow echo conc{round_no}x{s}y please") for s in range(sessions))
    )
    replies = Replies(TOKEN, since=stack.since)
    await replies.collect(http, stack.fake_url, tokens, timeout=60 + sessions * delay_ms / 1000)
    stack.since = replies.since
    wall = max(replies.seen.values(), default=began) - began
    stop.set()
    await sampler
    intervals = [iv for iv in await run_intervals(stack.redis.url) if iv[0] >= began - 1]
    return {
        "sessions": sessions,
        "replies": len(tokens & replies.seen.keys()),
        "peak": peak_overlap(intervals),
        "runs": len(intervals),
        "wall_s": wall,
        "sequential_s": sessions * delay_ms / 1000,
        "idle_rss": idle,
        "peak_rss": peak[0],
    }


async def run(argv: list[str] | None = None) -> list[Row]:
    """Run the benchmark, print its tables, return the summary rows."""
    p = parser(__doc__.splitlines()[0] if __doc__ else "concurrency")
    p.add_argument("--sessions", type=int, default=None, help="sessions sent a message at once (default 100, quick 6)")
    p.add_argument(
        "--delay-ms", type=int, default=None, help="offline model delay per answer (default 2000, quick 300)"
    )
    ns = p.parse_args(argv)
    rounds = rounds_of(ns)
    sessions = ns.sessions or (6 if ns.quick else 100)
    delay_ms = ns.delay_ms if ns.delay_ms is not None else (300 if ns.quick else 2000)
    worker_cpus, other_cpus = cores()
    pin(os.getpid(), other_cpus)
    print(
        f"concurrency: {rounds} round(s), {sessions} sessions at once, model delay {delay_ms} ms, one worker; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    results = []
    with workdir("sb-bench-conc-") as tmp:
        env = {"SWITCHBOARD_OFFLINE__DELAY_MS": str(delay_ms)}
        async with (
            gateway(tmp, web_cpus=other_cpus, worker_cpus=worker_cpus, worker_env=env, web_env=HIGH_LIMITS) as stack,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=sessions + 8)) as http,
        ):
            for r in range(1, rounds + 1):
                res = await one_round(stack, http, r, sessions, delay_ms)
                results.append(res)
                print(
                    f"  round {r}: {res['peak']} turns at once, {res['wall_s']:.1f} s for {sessions} replies, "
                    f"peak RSS {res['peak_rss']:.0f} MiB",
                    flush=True,
                )
            drops = dropped(stack.redis.url)
    print(f"messages dropped by abuse limits: {drops}")
    if drops:
        raise RuntimeError(f"{drops} messages were dropped by the abuse limits: the figures would be wrong")
    return verdicts(report(results, delay_ms, str(QueueSettings().concurrency)), ns.quick)


def report(results: list[dict[str, float]], delay_ms: int, cap: str) -> list[Row]:
    """Print the tables; return the summary rows."""
    rows = [
        [
            i,
            int(r["sessions"]),
            int(r["replies"]),
            int(r["runs"]),
            int(r["peak"]),
            fmt(r["wall_s"], 2),
            fmt(r["sequential_s"], 1),
            fmt(r["idle_rss"]),
            fmt(r["peak_rss"]),
        ]
        for i, r in enumerate(results, start=1)
    ]
    print()
    print(
        render_table(
            f"Concurrency inside one worker (model delay {delay_ms} ms, worker cap {cap})",
            [
                "round",
                "sessions",
                "replies",
                "runs in event logs",
                "turns at once (peak)",
                "wall s, all replies",
                "baseline: one at a time, s",
                "worker RSS idle MiB",
                "worker RSS peak MiB",
            ],
            rows,
        )
    )
    peak = median([r["peak"] for r in results])
    rss = max(r["peak_rss"] for r in results)
    return [
        Row(
            "concurrency",
            "turns running at once in one worker",
            f"{peak:.0f}",
            f"≥ {TARGET_CONCURRENT}",
            peak >= TARGET_CONCURRENT,
        ),
        Row("concurrency", "worker peak RSS", f"{rss:.0f} MiB", f"≤ {TARGET_RSS_MIB:.0f} MiB", rss <= TARGET_RSS_MIB),
    ]


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.concurrency``."""
    rows = asyncio.run(run(argv))
    print(render_table("Summary", SUMMARY_HEADERS, [r.cells() for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
