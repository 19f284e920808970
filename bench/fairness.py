"""Fairness under a flood: how long a newcomer's first reply waits while busy sessions hold every worker slot.

One ``switchboard worker`` (cap 64 concurrent drains) with the offline model taking a fixed time per answer
(``SWITCHBOARD_OFFLINE__DELAY_MS``, default 500 ms: one turn). 70 sessions × 60 queued messages flood it through
the Telegram webhook; once the flood is queued, newcomers (fresh sessions) send one message each, a few seconds
apart. Latency is from the gateway's 200 to the fake Bot API receiving the reply.

Side by side, in one run: the worker as it was (``SWITCHBOARD_QUEUE__FAIR_TURNS=0``: a drain keeps its slot until
its inbox is empty) and with fairness on (the default: a session yields its slot after its turn while others
wait). For each, the idle latency of a lone message first (same stack, before the flood), then the newcomers'
latency under the flood, the turn's duration (``run_started`` → ``run_completed`` of the flood's runs, from the
event logs) and the time the whole flood took (what yielding costs in throughput).
Target (issue #6, item 8): newcomer latency under the flood ≤ idle latency + one turn.

    python -m bench.fairness
    python -m bench.fairness --sessions 70 --messages 60 --delay-ms 500 --newcomers 5
    python -m bench.fairness --quick
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from dataclasses import dataclass

import aiohttp

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
from bench._stack import Replies, Stack, gateway
from bench.concurrency import run_intervals

TOKEN = re.compile(r"(?:fl|nc|id)\d+x\d+x\d+y")
SENDERS = 32
NEWCOMER_GAP_S = 2.0
"""Pause between newcomers (each is a new session with one message)."""
NO_LIMITS = {
    "SWITCHBOARD_LIMITS__MESSAGES_PER_SESSION_PER_MINUTE": "0",
    "SWITCHBOARD_LIMITS__MESSAGES_PER_SENDER_PER_MINUTE": "0",
    "SWITCHBOARD_LIMITS__INBOX_DEPTH": "0",
}
"""The flood is deliberate: the web tier's abuse limits would drop most of it."""


@dataclass
class Result:
    """One configuration's figures (medians over rounds)."""

    name: str
    idle_s: list[float]
    newcomer_s: list[float]
    turn_s: list[float]
    flood_s: list[float]
    replies: int
    expected: int


async def _idle(stack: Stack, http: aiohttp.ClientSession, tag: int, count: int) -> list[float]:
    """Lone messages to fresh sessions on the idle stack, one at a time: ack → reply."""
    out = []
    for i in range(count):
        token = f"id{tag}x{i}x0y"
        chat = 7_000_000 + tag * 1_000 + i
        acked = await stack.send(http, chat, chat, f"echo {token}")
        replies = Replies(TOKEN, since=stack.since)
        await replies.collect(http, stack.fake_url, {token}, timeout=30)
        stack.since = max(stack.since, replies.since)
        if token in replies.seen:
            out.append(replies.seen[token] - acked)
    return out


async def _flood_round(
    stack: Stack, http: aiohttp.ClientSession, tag: int, sessions: int, messages: int, newcomers: int, delay_s: float
) -> tuple[list[float], float, int, int]:
    """Flood, then newcomers; returns (newcomer latencies, flood wall time, replies seen, replies expected)."""
    base = 5_000_000 + tag * 10_000
    flood = [(base + s, f"fl{tag}x{s}x{i}y") for i in range(messages) for s in range(sessions)]
    expected = {token for _, token in flood}
    newcomer_tokens = [f"nc{tag}x{n}x0y" for n in range(newcomers)]
    expected |= set(newcomer_tokens)
    replies = Replies(TOKEN, since=stack.since)
    collector = asyncio.create_task(
        replies.collect(http, stack.fake_url, expected, timeout=120 + sessions * messages * delay_s / 16)
    )
    pending = list(enumerate(flood))
    pending.reverse()
    began = time.time()

    async def sender() -> None:
        while pending:
            n, (chat, token) = pending.pop()
            await stack.send(http, chat, base * 100 + n, f"echo {token}")

    await asyncio.gather(*(sender() for _ in range(SENDERS)))
    acked: dict[str, float] = {}
    for n, token in enumerate(newcomer_tokens):
        await asyncio.sleep(NEWCOMER_GAP_S if n else 1.0)
        chat = 8_000_000 + tag * 1_000 + n
        acked[token] = await stack.send(http, chat, chat, f"echo {token}")
    await collector
    stack.since = max(stack.since, replies.since)
    latencies = [replies.seen[t] - acked[t] for t in newcomer_tokens if t in replies.seen]
    flood_done = max((replies.seen[t] for _, t in flood if t in replies.seen), default=began)
    return latencies, flood_done - began, len(expected & replies.seen.keys()), len(expected)


async def measure(
    name: str,
    worker_env: dict[str, str],
    *,
    rounds: int,
    sessions: int,
    messages: int,
    newcomers: int,
    delay_s: float,
) -> Result:
    """One stack with ``worker_env``: idle latency, then ``rounds`` floods with newcomers."""
    worker_cpus, other_cpus = cores()
    result = Result(name, [], [], [], [], 0, 0)
    with workdir("sb-bench-fair-") as tmp:
        async with (
            gateway(
                tmp, web_cpus=other_cpus, worker_cpus=worker_cpus, worker_env=worker_env, web_env=NO_LIMITS
            ) as stack,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=SENDERS + 8)) as http,
        ):
            result.idle_s = await _idle(stack, http, 0, 5)
            for r in range(1, rounds + 1):
                began = time.time()
                latencies, flood_s, seen, expected = await _flood_round(
                    stack, http, r, sessions, messages, newcomers, delay_s
                )
                turns = [end - start for start, end in await run_intervals(stack.redis.url) if start >= began]
                result.newcomer_s += latencies
                result.turn_s.append(median(turns))
                result.flood_s.append(flood_s)
                result.replies += seen
                result.expected += expected
                print(
                    f"  {name}, round {r}: newcomers waited {[round(x, 2) for x in latencies]} s; "
                    f"turn {median(turns):.2f} s; flood of {sessions * messages} took {flood_s:.1f} s",
                    flush=True,
                )
    return result


async def run(argv: list[str] | None = None) -> list[Row]:
    """Run the benchmark, print its tables, return the summary rows."""
    p = parser(__doc__.splitlines()[0] if __doc__ else "fairness")
    p.add_argument("--sessions", type=int, default=None, help="flooding sessions (default 70, quick 6)")
    p.add_argument("--messages", type=int, default=None, help="queued messages per flooding session (60, quick 20)")
    p.add_argument("--delay-ms", type=int, default=None, help="offline model delay = one turn (500, quick 200)")
    p.add_argument("--newcomers", type=int, default=None, help="newcomers per flood (default 5, quick 2)")
    p.add_argument("--concurrency", type=int, default=None, help="the worker's slot cap (default 64, quick 4)")
    ns = p.parse_args(argv)
    rounds = rounds_of(ns) if ns.rounds else 1
    sessions = ns.sessions or (6 if ns.quick else 70)
    messages = ns.messages or (20 if ns.quick else 60)
    delay_ms = ns.delay_ms if ns.delay_ms is not None else (200 if ns.quick else 500)
    newcomers = ns.newcomers or (2 if ns.quick else 5)
    concurrency = ns.concurrency or (4 if ns.quick else 64)
    _, other_cpus = cores()
    pin(os.getpid(), other_cpus)
    print(
        f"fairness: {rounds} flood(s) per configuration of {sessions} sessions × {messages} messages, "
        f"{newcomers} newcomers each, model delay {delay_ms} ms, worker cap {concurrency}; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    common = {"SWITCHBOARD_OFFLINE__DELAY_MS": str(delay_ms), "SWITCHBOARD_QUEUE__CONCURRENCY": str(concurrency)}
    kw = {"rounds": rounds, "sessions": sessions, "messages": messages, "newcomers": newcomers}
    results = [
        await measure(
            "baseline (FAIR_TURNS=0)", {**common, "SWITCHBOARD_QUEUE__FAIR_TURNS": "0"}, delay_s=delay_ms / 1000, **kw
        ),
        await measure("fair (default)", common, delay_s=delay_ms / 1000, **kw),
    ]
    return verdicts(report(results, sessions, messages, delay_ms), ns.quick)


def report(results: list[Result], sessions: int, messages: int, delay_ms: int) -> list[Row]:
    """Print the table; return the summary rows."""
    rows = []
    for r in results:
        idle, newcomer, turn = median(r.idle_s), median(r.newcomer_s), median(r.turn_s)
        rows.append(
            [
                r.name,
                fmt(idle, 2),
                fmt(newcomer, 2),
                fmt(max(r.newcomer_s, default=float("nan")), 2),
                fmt(turn, 2),
                fmt((newcomer - idle) / turn, 2),
                fmt(median(r.flood_s), 1),
                f"{r.replies}/{r.expected}",
            ]
        )
    print()
    print(
        render_table(
            f"Newcomer latency under a flood of {sessions} sessions × {messages} messages (model delay {delay_ms} ms)",
            [
                "worker",
                "idle latency s",
                "newcomer latency s (median)",
                "newcomer max s",
                "one turn s",
                "newcomer wait beyond idle, in turns",
                "whole flood s",
                "replies",
            ],
            rows,
        )
    )
    fair = results[-1]
    idle, newcomer, turn = median(fair.idle_s), median(fair.newcomer_s), median(fair.turn_s)
    base = results[0]
    return [
        Row(
            "fairness",
            "newcomer latency under flood (fair / baseline)",
            f"{newcomer:.2f} s / {median(base.newcomer_s):.2f} s (idle {idle:.2f} s, turn {turn:.2f} s)",
            "≤ idle + one turn",
            newcomer <= idle + turn,
        )
    ]


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.fairness``."""
    rows = asyncio.run(run(argv))
    print(render_table("Summary", SUMMARY_HEADERS, [r.cells() for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
