"""Scheduling precision under load: how late 10,000 scheduled occurrences reach their sessions.

10,000 one-off ``message`` jobs across 1,000 Telegram sessions fall due within one minute (``--spread-s 60``,
evenly) or all at the same instant (``--spread-s 0``: one cron expression shared by every user, the worst case).
Lateness of an occurrence = the time ingest accepted its message (the stored record's ``received_at``) minus its due
time. Measured side by side on one Redis, in one process:

- ``switchboard``: two :class:`~switchboard.queue.schedules.Scheduler` loops (two workers' worth) polling every
  ``--poll-s`` (the default ``SWITCHBOARD_QUEUE__SCHEDULE_POLL_S``), claiming each occurrence with the Lua claim;
- baseline ``sleep loop``: one task that sleeps until each due time and ingests the occurrence with the same
  ingestor — no claim, no durability, no second scheduler (what a cron thread inside a single process would do).

Nothing here asserts on a timing.

    python -m bench.schedules
    python -m bench.schedules --jobs 10000 --spread-s 60 --poll-s 1.0
    python -m bench.schedules --quick
"""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from bench._harness import SUMMARY_HEADERS, Row, fmt, median, parser, percentile, render_table, workdir
from switchboard.core.messages import ConversationRef, InboundMessage, Scheduled, Sender, session_key
from switchboard.core.schedules import ScheduleSpec, occurrence_key
from switchboard.queue import scripts
from switchboard.queue.connection import async_client
from switchboard.queue.embedded import EmbeddedRedis
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.schedules import Scheduler, create_job
from switchboard.settings import QueueSettings
from switchboard.types import SessionKey

SESSIONS = 1000
LEAD_S = 3.0
"""The first occurrence falls due this long after every job is stored."""
SETTINGS_BASE = {"name": "benchsched", "events_maxlen": 100}


@dataclass
class Result:
    name: str
    lateness_s: list[float]
    expected: int


def _spec(index: int, due: float) -> ScheduleSpec:
    return ScheduleSpec.model_validate(
        {
            "id": f"b{index}",
            "target": {"channel": "telegram", "conversation": str(5_000_000 + index % SESSIONS), "agent": "assistant"},
            "action": "message",
            "text": f"occurrence {index}",
            "at": dt.datetime.fromtimestamp(due, dt.UTC),
            "grace_s": 3600,
        }
    )


async def _lateness(redis: aioredis.Redis, jobs: int) -> list[float]:
    """Every accepted occurrence's ``received_at - due_at``, read back from the sessions' message records."""
    out: list[float] = []
    for session in range(SESSIONS):
        keys = SessionKeys(_session(session))
        for raw in (await redis.hgetall(keys.messages)).values():
            message = InboundMessage.model_validate_json(raw)
            assert isinstance(message.event, Scheduled)
            out.append(message.received_at - message.event.due_at)
    if len(out) != jobs:
        print(f"warning: {len(out)} of {jobs} occurrences accepted", file=sys.stderr)
    return out


def _session(index: int) -> SessionKey:
    return session_key("default", "assistant", "telegram", "default", str(5_000_000 + index))


def _dues(jobs: int, spread_s: float, start: float) -> list[float]:
    return [start + (spread_s * i / jobs if spread_s else 0.0) for i in range(jobs)]


async def _switchboard(url: str, jobs: int, spread_s: float, poll_s: float) -> Result:
    redis = async_client(url)
    await redis.flushall()
    await scripts.load_all(redis)
    settings = QueueSettings.model_validate({**SETTINGS_BASE, "schedule_poll_s": poll_s})
    dues = _dues(jobs, spread_s, time.time() + LEAD_S + jobs / 4000)
    for start in range(0, jobs, 500):
        await asyncio.gather(*(create_job(redis, _spec(i, dues[i])) for i in range(start, min(jobs, start + 500))))
    stop = asyncio.Event()
    clients = [async_client(url) for _ in range(2)]
    loops = [asyncio.create_task(Scheduler(c, settings).run(stop)) for c in clients]
    await asyncio.sleep(max(dues) - time.time() + 1.0)
    deadline = time.time() + 120
    while time.time() < deadline and await redis.zcard("sb:{schedules}:due"):
        await asyncio.sleep(0.2)
    await asyncio.sleep(poll_s + 0.5)
    stop.set()
    await asyncio.gather(*loops)
    lateness = await _lateness(redis, jobs)
    for c in clients:
        await c.aclose()
    await redis.aclose()
    return Result(f"switchboard (2 schedulers, poll {poll_s:g} s)", lateness, jobs)


async def _sleep_loop(url: str, jobs: int, spread_s: float) -> Result:
    redis = async_client(url)
    await redis.flushall()
    await scripts.load_all(redis)
    ingestor = Ingestor(redis, QueueSettings.model_validate(SETTINGS_BASE))
    dues = _dues(jobs, spread_s, time.time() + LEAD_S)
    specs = [_spec(i, dues[i]) for i in range(jobs)]

    async def fire(spec: ScheduleSpec, due: float) -> None:
        t = spec.target
        await ingestor.ingest(
            InboundMessage(
                dedup_key=occurrence_key(spec.id, due),
                conversation=ConversationRef(agent=t.agent, channel="telegram", conversation=t.conversation),
                sender=Sender(id=f"schedule:{spec.id}"),
                text=spec.text,
                event=Scheduled(job_id=spec.id, action="message", due_at=due),
            )
        )

    pending: set[asyncio.Task[None]] = set()
    for spec, due in zip(specs, dues, strict=True):
        wait = due - time.time()
        if wait > 0:
            await asyncio.sleep(wait)
        task = asyncio.create_task(fire(spec, due))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    lateness = await _lateness(redis, jobs)
    await redis.aclose()
    return Result("baseline: sleep loop (1 process, no claim)", lateness, jobs)


def _rows(results: list[Result], spread_s: float) -> tuple[list[list[str]], list[Row]]:
    table, rows = [], []
    for r in results:
        p50, p99 = median(r.lateness_s), percentile(r.lateness_s, 99)
        worst = max(r.lateness_s) if r.lateness_s else float("nan")
        table.append([r.name, f"{len(r.lateness_s)}/{r.expected}", fmt(p50 * 1000), fmt(p99 * 1000), fmt(worst * 1000)])
        if r.name.startswith("switchboard"):
            metric = f"p99 lateness, {r.expected} due within {spread_s:g} s"
            rows.append(Row("schedules", metric, f"{p99:.2f} s", "≤ poll interval + 1 s", None))
    return table, rows


async def run(argv: list[str]) -> list[Row]:
    """Both schedulers on a fresh embedded Redis; prints the table, returns the summary rows."""
    p = parser(__doc__ or "")
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--spread-s", type=float, default=60.0)
    p.add_argument("--poll-s", type=float, default=1.0)
    args = p.parse_args(argv)
    jobs = 300 if args.quick else args.jobs
    spread = 3.0 if args.quick else args.spread_s
    with workdir("bench-schedules") as tmp:
        server = EmbeddedRedis(tmp / "redis", port=0)
        server.start()
        try:
            ours = await _switchboard(server.url, jobs, spread, args.poll_s)
            base = await _sleep_loop(server.url, jobs, spread)
        finally:
            server.stop()
    table, rows = _rows([ours, base], spread)
    print(f"\n{jobs} occurrences due within {spread:g} s, {SESSIONS} sessions; lateness = accepted − due\n")
    print(render_table("Scheduling precision", ["scheduler", "accepted", "median ms", "p99 ms", "max ms"], table))
    print(render_table("Summary", SUMMARY_HEADERS, [r.cells() for r in rows]))
    return rows


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1:]))
