"""End to end: N sessions × M messages through ``switchboard web`` + ONE worker + the fake Telegram API.

Messages go in as signed Telegram webhooks; the offline model answers each with its text verbatim, so every
reply found in the fake's log names the message it answers. Latency is from the gateway's 200 (request
accepted) to the fake's receive time of the ``sendMessage`` (reply delivered).

- **full load**: every message sent as fast as 32 connections allow, sessions interleaved; messages/s is
  ``messages / (last reply − first send)`` — the worker's rate once the backlog builds;
- **half load**: an open-loop paced sender at half the target load (the issue's "≥ 500 msg/s … at half that
  load": 250 msg/s), or at half the full-load rate of the same round when that is lower; its p50/p99 are the
  latency targets.

The worker runs alone on one core; web, Redis, the fake and the sender share the other. The worker's CPU time
per message (psutil) says what a message costs it whatever the neighbours do. Side by side, the same run
measures what each turn's delivery costs at least: one ``sendChatAction`` + ``sendMessage`` pair against the
fake from this process — its round trip, and its client CPU through python-telegram-bot's ``Bot`` (httpx, as
``channels/telegram.py`` sends) and through a bare aiohttp session, 32 pairs in flight as in a busy worker.

    python -m bench.e2e                             # 100 sessions × 20 messages, 3 rounds
    python -m bench.e2e --sessions 200 --messages 10
    python -m bench.e2e --quick

The abuse limits are checked on every message, as in production, but set far above the load (``HIGH_LIMITS``: the
defaults would drop most of the flood); a run that saw any message dropped by a limit fails.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench._harness import (
    BOT_TOKEN,
    SUMMARY_HEADERS,
    Row,
    cores,
    fmt,
    median,
    parser,
    percentile,
    pin,
    render_table,
    rounds_of,
    verdicts,
    workdir,
)
from bench._stack import HIGH_LIMITS, Replies, Stack, dropped, gateway

TARGET_RATE = 500.0
TARGET_P50_MS = 10.0
TARGET_P99_MS = 50.0
CONNECTIONS = 32
TOKEN = re.compile(r"tok\d+x\d+x\d+y")


@dataclass
class Phase:
    """One measured phase of one round."""

    name: str
    messages: int
    rate: float
    """Messages per second delivered."""
    latencies_ms: list[float]
    missing: int
    duplicates: int
    offered: float = 0.0
    """The sender's rate (paced phases)."""
    worker_cpu_ms: float = float("nan")
    """Worker CPU time (user + system) per message: what one message costs it, whatever the neighbours do."""
    web_cpu_ms: float = float("nan")


def plan(round_no: int, sessions: int, messages: int, phase: int) -> list[tuple[int, str]]:
    """``(chat_id, token)`` for every message, sessions interleaved (message i of every session, then i+1)."""
    base = 2_000_000 + round_no * 100_000 + phase * 10_000
    return [(base + s, f"tok{round_no}{phase}x{s}x{i}y") for i in range(messages) for s in range(sessions)]


async def full_load(
    stack: Stack, http: aiohttp.ClientSession, items: list[tuple[int, str]], update0: int, name: str = "full load"
) -> Phase:
    """Send everything with ``CONNECTIONS`` requests in flight; wait for every reply."""
    accepted: dict[str, float] = {}
    queue = list(enumerate(items))
    queue.reverse()
    started = time.time()

    async def sender() -> None:
        while queue:
            n, (chat, token) = queue.pop()
            accepted[token] = await stack.send(http, chat, update0 + n, f"please echo {token} now")

    await asyncio.gather(*(sender() for _ in range(CONNECTIONS)))
    return await _finish(stack, http, name, accepted, started)


async def paced_load(
    stack: Stack, http: aiohttp.ClientSession, items: list[tuple[int, str]], update0: int, rate: float, name: str
) -> Phase:
    """Open loop: message k leaves at ``k / rate`` s whatever the answers do; wait for every reply."""
    accepted: dict[str, float] = {}
    tasks: list[asyncio.Task[None]] = []
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    started = time.time()

    async def one(n: int, chat: int, token: str) -> None:
        accepted[token] = await stack.send(http, chat, update0 + n, f"please echo {token} now")

    for n, (chat, token) in enumerate(items):
        delay = t0 + n / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(n, chat, token)))
    await asyncio.gather(*tasks)
    phase = await _finish(stack, http, name, accepted, started)
    phase.offered = rate
    return phase


async def _finish(
    stack: Stack, http: aiohttp.ClientSession, name: str, accepted: dict[str, float], started: float
) -> Phase:
    replies = Replies(TOKEN)
    replies.since = stack.since
    await replies.collect(http, stack.fake_url, set(accepted), timeout=60 + len(accepted) / 50)
    stack.since = replies.since
    delivered = {t: replies.seen[t] for t in accepted if t in replies.seen}
    latencies = [(delivered[t] - accepted[t]) * 1000 for t in delivered]
    last = max(delivered.values(), default=started)
    rate = len(delivered) / (last - started) if last > started else 0.0
    return Phase(name, len(accepted), rate, latencies, len(accepted) - len(delivered), replies.duplicates)


def _charge(phase: Phase, stack: Stack, before: tuple[float, float]) -> tuple[float, float]:
    """Record the worker's and the web tier's CPU per message since ``before``; return the new readings."""
    now = (stack.worker.cpu_s(), stack.web.cpu_s())
    count = max(phase.messages, 1)
    phase.worker_cpu_ms = (now[0] - before[0]) / count * 1000
    phase.web_cpu_ms = (now[1] - before[1]) / count * 1000
    return now


def command_counts(redis_url: str) -> dict[str, int]:
    """Calls per Redis command so far (``INFO commandstats``; commands run inside scripts are counted too)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items() if isinstance(v, dict)}


async def delivery_costs(stack: Stack, http: aiohttp.ClientSession, count: int) -> dict[str, float]:
    """Round trip (ms) of one ``sendChatAction`` + ``sendMessage`` pair, and client CPU ms per pair by client."""
    from telegram import Bot
    from telegram.request import HTTPXRequest

    base = f"{stack.fake_url}/bot{BOT_TOKEN}"
    took = []
    for i in range(count):
        t = time.perf_counter()
        async with http.post(f"{base}/sendChatAction", json={"chat_id": 42, "action": "typing"}) as resp:
            await resp.read()
        async with http.post(f"{base}/sendMessage", json={"chat_id": 42, "text": f"floor {i}"}) as resp:
            await resp.read()
        took.append((time.perf_counter() - t) * 1000)

    async def aio_pair(i: int) -> None:
        async with http.post(f"{base}/sendChatAction", json={"chat_id": 42, "action": "typing"}) as resp:
            await resp.json()
        async with http.post(f"{base}/sendMessage", json={"chat_id": 42, "text": f"floor {i}"}) as resp:
            await resp.json()

    bot = Bot(BOT_TOKEN, base_url=f"{stack.fake_url}/bot", request=HTTPXRequest(connection_pool_size=128))
    await bot.initialize()

    async def ptb_pair(i: int) -> None:
        await bot.send_chat_action(42, "typing")
        await bot.send_message(42, f"floor {i}")

    async def cpu_ms(pair: Callable[[int], Awaitable[None]]) -> float:
        started = time.process_time()
        for k in range(0, count, CONNECTIONS):
            await asyncio.gather(*(pair(i) for i in range(k, min(k + CONNECTIONS, count))))
        return (time.process_time() - started) / count * 1000

    try:
        return {"round_trip": median(took), "aiohttp_cpu": await cpu_ms(aio_pair), "ptb_cpu": await cpu_ms(ptb_pair)}
    finally:
        await bot.shutdown()


async def run(argv: list[str] | None = None) -> list[Row]:
    """Run the benchmark, print its tables, return the summary rows."""
    p = parser(__doc__.splitlines()[0] if __doc__ else "e2e")
    p.add_argument("--sessions", type=int, default=None, help="sessions (default 100, quick 4)")
    p.add_argument("--messages", type=int, default=None, help="messages per session (default 20, quick 3)")
    p.add_argument("--profile", type=Path, default=None, help="run web and worker under cProfile, .prof files here")
    ns = p.parse_args(argv)
    rounds = rounds_of(ns)
    sessions = ns.sessions or (4 if ns.quick else 100)
    messages = ns.messages or (3 if ns.quick else 20)
    worker_cpus, other_cpus = cores()
    pin(os.getpid(), other_cpus)
    print(
        f"e2e: {rounds} round(s) of {sessions} sessions × {messages} messages; worker on CPU "
        f"{sorted(worker_cpus or [])}, web + Redis + fake + sender on CPU {sorted(other_cpus or [])}; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    fulls: list[Phase] = []
    halves: list[Phase] = []
    floors: list[dict[str, float]] = []
    commands: dict[str, float] = {}
    with workdir("sb-bench-e2e-") as tmp:
        async with gateway(
            tmp, web_cpus=other_cpus, worker_cpus=worker_cpus, web_env=HIGH_LIMITS, profile_dir=ns.profile
        ) as stack:
            connector = aiohttp.TCPConnector(limit=CONNECTIONS * 4)
            async with aiohttp.ClientSession(connector=connector) as http:
                await full_load(stack, http, plan(0, 2, 2, 0), 1, name="warm-up")
                for r in range(1, rounds + 1):
                    cpu = (stack.worker.cpu_s(), stack.web.cpu_s())
                    counts = command_counts(stack.redis.url)
                    full = await full_load(stack, http, plan(r, sessions, messages, 1), r * 1_000_000)
                    cpu = _charge(full, stack, cpu)
                    if r == 1:
                        after = command_counts(stack.redis.url)
                        commands = {k: (v - counts.get(k, 0)) / full.messages for k, v in after.items()}
                    fulls.append(full)
                    rate = max(min(full.rate, TARGET_RATE) / 2, 1.0)
                    half = await paced_load(
                        stack, http, plan(r, sessions, messages, 2), r * 1_000_000 + 500_000, rate, "half load"
                    )
                    _charge(half, stack, cpu)
                    halves.append(half)
                    floors.append(await delivery_costs(stack, http, 32 if ns.quick else 320))
                    print(
                        f"  round {r}: full {full.rate:,.0f} msg/s (p50 {percentile(full.latencies_ms, 50):.1f} ms), "
                        f"half {half.rate:,.0f} msg/s p50 {percentile(half.latencies_ms, 50):.1f} ms "
                        f"p99 {percentile(half.latencies_ms, 99):.1f} ms",
                        flush=True,
                    )
            worker_rss = stack.worker.rss_mib()
            drops = dropped(stack.redis.url)
    print(f"messages dropped by abuse limits: {drops}")
    if drops:
        raise RuntimeError(f"{drops} messages were dropped by the abuse limits: the figures would be wrong")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return verdicts(report(fulls, halves, floors, sessions, messages, worker_rss, commands), ns.quick)


def report(
    fulls: list[Phase],
    halves: list[Phase],
    floors: list[dict[str, float]],
    sessions: int,
    messages: int,
    worker_rss: float,
    commands: dict[str, float],
) -> list[Row]:
    """Print the tables; return the summary rows."""
    rows = []
    for i, (full, half) in enumerate(zip(fulls, halves, strict=True), start=1):
        for ph in (full, half):
            rows.append(
                [
                    i,
                    ph.name,
                    ph.messages,
                    fmt(ph.offered) if ph.offered else "as fast as possible",
                    fmt(ph.rate),
                    fmt(percentile(ph.latencies_ms, 50), 1),
                    fmt(percentile(ph.latencies_ms, 99), 1),
                    fmt(max(ph.latencies_ms, default=float("nan")), 1),
                    fmt(ph.worker_cpu_ms, 2),
                    fmt(ph.web_cpu_ms, 2),
                    ph.missing,
                    ph.duplicates,
                ]
            )
    print()
    print(
        render_table(
            f"End to end, one worker ({sessions} sessions × {messages} messages per phase)",
            [
                "round",
                "phase",
                "messages",
                "offered msg/s",
                "delivered msg/s",
                "p50 ms",
                "p99 ms",
                "max ms",
                "worker CPU ms/msg",
                "web CPU ms/msg",
                "missing",
                "duplicate replies",
            ],
            rows,
        )
    )
    rate = median([f.rate for f in fulls])
    p50 = median([percentile(h.latencies_ms, 50) for h in halves])
    p99 = median([percentile(h.latencies_ms, 99) for h in halves])
    print(
        render_table(
            "End to end, medians",
            ["figure", "value"],
            [
                ["messages/s through one worker (full load)", fmt(rate)],
                [
                    "accepted → delivered p50 / p99 at full load, ms",
                    f"{fmt(median([percentile(f.latencies_ms, 50) for f in fulls]))} / "
                    f"{fmt(median([percentile(f.latencies_ms, 99) for f in fulls]))}",
                ],
                ["accepted → delivered p50 / p99 at half load, ms", f"{fmt(p50)} / {fmt(p99)}"],
                ["worker CPU per message at full load, ms", fmt(median([f.worker_cpu_ms for f in fulls]), 2)],
                [
                    "→ messages/s one worker could do on a core of its own (1000 / CPU ms)",
                    fmt(1000 / median([f.worker_cpu_ms for f in fulls])),
                ],
                ["web tier CPU per message at full load, ms", fmt(median([f.web_cpu_ms for f in fulls]), 2)],
                [
                    "baseline: one sendChatAction + sendMessage round trip to the fake, ms",
                    fmt(median([f["round_trip"] for f in floors]), 2),
                ],
                [
                    "baseline: client CPU of that pair via python-telegram-bot Bot (httpx), ms",
                    fmt(median([f["ptb_cpu"] for f in floors]), 2),
                ],
                [
                    "baseline: client CPU of that pair via a bare aiohttp session, ms",
                    fmt(median([f["aiohttp_cpu"] for f in floors]), 2),
                ],
                ["worker RSS after the run, MiB", fmt(worker_rss)],
                [
                    "missing / duplicate replies (all rounds)",
                    f"{sum(p.missing for p in fulls + halves)} / {sum(p.duplicates for p in fulls + halves)}",
                ],
            ],
        )
    )
    top = sorted(((v, k) for k, v in commands.items() if v >= 0.05), reverse=True)
    print(
        render_table(
            f"Redis commands per message, full load of round 1 (total {sum(commands.values()):.1f}; "
            "commands run inside Lua scripts are counted under their own names too)",
            ["command", "per message"],
            [[k, f"{v:.2f}"] for v, k in top[:15]],
        )
    )
    return [
        Row("e2e", "messages/s through one worker", fmt(rate), f"≥ {TARGET_RATE:.0f}", rate >= TARGET_RATE),
        Row(
            "e2e",
            "p50 accepted → delivered, half load",
            f"{fmt(p50)} ms",
            f"≤ {TARGET_P50_MS:.0f} ms",
            p50 <= TARGET_P50_MS,
        ),
        Row(
            "e2e",
            "p99 accepted → delivered, half load",
            f"{fmt(p99)} ms",
            f"≤ {TARGET_P99_MS:.0f} ms",
            p99 <= TARGET_P99_MS,
        ),
        Row(
            "e2e",
            "missing / duplicate replies",
            f"{sum(p.missing for p in fulls + halves)} / {sum(p.duplicates for p in fulls + halves)}",
            "0 / 0",
            sum(p.missing + p.duplicates for p in fulls + halves) == 0,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.e2e``."""
    rows = asyncio.run(run(argv))
    print(render_table("Summary", SUMMARY_HEADERS, [r.cells() for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
