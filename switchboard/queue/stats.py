"""Worker-side figures kept in Redis, so the web tier's ``/metrics`` shows every worker's work.

Counters live in one hash (:attr:`GlobalKeys.stats`), fenced-write refusals in one counter per logical shard
(:attr:`ShardKeys.fenced_rejections`, so a fenced script stays in its session's slot), summed by one ``MGET`` of
every shard's counter at read time. Latencies (``queue_wait``, ``run``) are histograms of per-bucket counts plus
``sum`` and ``count``, incremented inside the drain's completion script.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import redis.asyncio as aioredis

from switchboard.queue.connection import AsyncClient
from switchboard.queue.keys import GlobalKeys, ShardKeys
from switchboard.queue.segments import Segments, parse_segments

__all__ = [
    "QUEUE_WAIT_BUCKETS",
    "RUN_DURATION_BUCKETS",
    "Histogram",
    "Stats",
    "bucket_field",
    "fenced_total",
    "read_stats",
    "record_usage",
]

QUEUE_WAIT_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds (seconds) of the queue-wait histogram; ``+Inf`` is implied."""
RUN_DURATION_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Upper bounds (seconds) of the run-duration histogram; ``+Inf`` is implied."""

_GLOBAL = GlobalKeys()
_FENCED: Final = tuple(shard.fenced_rejections for shard in ShardKeys.every())
_COUNTERS: Final = (
    "accepted",
    "deduplicated",
    "runs_completed",
    "runs_failed",
    "dead_letters",
    "send_window_duplicates",
    "runs_deferred",
    "messages_dropped",
    "send_dead_letters",
    "delivery_sent",
    "delivery_delivered",
    "delivery_read",
    "delivery_failed",
    "egress_allowed",
    "egress_refused",
)
_USAGE: Final = ("credits", "input_tokens", "output_tokens")


def bucket_field(value: float, bounds: Sequence[float]) -> str:
    """The histogram field a value is counted in: the smallest bound ≥ value, or ``le:+Inf``."""
    for bound in bounds:
        if value <= bound:
            return f"le:{bound:g}"
    return "le:+Inf"


@dataclass(frozen=True, slots=True)
class Histogram:
    """A histogram in Prometheus shape: cumulative counts per upper bound (the last bound is ``inf``)."""

    buckets: tuple[tuple[float, int], ...]
    sum: float
    count: int


@dataclass(frozen=True, slots=True)
class Stats:
    """Plain numbers for the ``/metrics`` collector."""

    accepted: int
    deduplicated: int
    runs_completed: int
    runs_failed: int
    dead_letters: int
    send_window_duplicates: int
    runs_deferred: int
    messages_dropped: int
    send_dead_letters: int
    fenced_rejections: int
    runnable_sessions: int
    queue_wait: Histogram
    run_duration: Histogram
    delivery_sent: int = 0
    delivery_delivered: int = 0
    delivery_read: int = 0
    delivery_failed: int = 0
    credits: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    egress_allowed: int = 0
    egress_refused: int = 0
    segments: Segments = field(default_factory=Segments)
    """The figures by agent, version, tool and tenant (:mod:`switchboard.queue.segments`)."""


def _int(value: bytes | str | None) -> int:
    return int(float(value)) if value else 0


def _histogram(raw: dict[bytes, bytes], bounds: Sequence[float]) -> Histogram:
    fields = {k.decode(): v for k, v in raw.items()}
    running = 0
    buckets: list[tuple[float, int]] = []
    for bound in (*bounds, math.inf):
        running += _int(fields.get(f"le:{bound:g}" if bound != math.inf else "le:+Inf"))
        buckets.append((bound, running))
    # the count is the buckets' total (a ``count`` field written by earlier versions always equals it)
    return Histogram(buckets=tuple(buckets), sum=float(fields.get("sum", b"0") or 0), count=running)


def _sum(values: Sequence[bytes | str | None]) -> int:
    return sum(_int(v) for v in values)


async def fenced_total(redis: AsyncClient) -> int:
    """Writes refused by fencing so far, over every shard (one ``MGET`` of the shards' counters).

    On a cluster, one ``MGET`` per slot, pipelined per node.
    """
    if isinstance(redis, aioredis.RedisCluster):
        return _sum(await redis.mget_nonatomic(_FENCED))
    return _sum(await redis.mget(_FENCED))


async def read_stats(redis: AsyncClient) -> Stats:
    """Read every counter and histogram in one round trip (two on a cluster: the shards' counters apart)."""
    cluster = redis if isinstance(redis, aioredis.RedisCluster) else None
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(_GLOBAL.stats)  # the counters, and the segmented figures (bounded by their label caps)
        if cluster is None:  # a cluster's MGET stays in one slot: read below, per slot
            pipe.mget(_FENCED)  # every shard's counter: one command, read only at scrape time
        pipe.zcard(_GLOBAL.runnable)
        pipe.hgetall(_GLOBAL.histogram("queue_wait"))
        pipe.hgetall(_GLOBAL.histogram("run"))
        replies = await pipe.execute()
    if cluster is not None:
        totals, runnable, wait, run = replies
        fenced = await cluster.mget_nonatomic(_FENCED)
    else:
        totals, fenced, runnable, wait, run = replies
    counters = [totals.get(name.encode()) for name in _COUNTERS]
    usage = [totals.get(name.encode()) for name in _USAGE]
    values = dict(zip(_COUNTERS, (_int(v) for v in counters), strict=True))
    return Stats(
        **values,
        fenced_rejections=_sum(fenced),
        runnable_sessions=int(runnable),
        queue_wait=_histogram(wait, QUEUE_WAIT_BUCKETS),
        run_duration=_histogram(run, RUN_DURATION_BUCKETS),
        credits=float(usage[0] or 0),
        input_tokens=_int(usage[1]),
        output_tokens=_int(usage[2]),
        segments=parse_segments(totals),
    )


async def record_usage(redis: aioredis.Redis, *, credits: float, input_tokens: int, output_tokens: int) -> None:
    """Add one turn's metered usage to the deployment-wide totals."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hincrbyfloat(_GLOBAL.stats, "credits", credits)
        pipe.hincrby(_GLOBAL.stats, "input_tokens", input_tokens)
        pipe.hincrby(_GLOBAL.stats, "output_tokens", output_tokens)
        await pipe.execute()
