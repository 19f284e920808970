"""Worker-side figures kept in Redis, so the web tier's ``/metrics`` shows every worker's work.

Counters live in one hash per logical shard (:attr:`ShardKeys.stats`, written by the scripts of the shard's sessions,
so each stays in its session's slot), fenced-write refusals in the same hash (field ``fenced_rejections``). Latencies
(``queue_wait``, ``run``) are per-shard histograms of per-bucket counts plus ``sum``, incremented inside the drain's
completion script. A read sums every shard's in one pipeline (:func:`read_stats`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import redis.asyncio as aioredis

from switchboard.queue.connection import AsyncClient
from switchboard.queue.fanout import ALL_SHARDS, each_shard, sum_counts
from switchboard.queue.keys import FENCED_FIELD, SessionKeys, ShardKeys
from switchboard.queue.segments import Segments, parse_segments
from switchboard.types import SessionKey

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


def _histograms(raw: Sequence[Mapping[bytes, bytes]], bounds: Sequence[float]) -> Histogram:
    summed = sum_counts(raw)
    return _histogram({k.encode(): v.encode() for k, v in summed.items()}, bounds)


async def fenced_total(redis: AsyncClient) -> int:
    """Writes refused by fencing so far, over every shard (one pipeline of an ``HGET`` per shard)."""
    replies = await each_shard(redis, lambda pipe, shard: pipe.hget(shard.stats, FENCED_FIELD))
    return sum(_int(v) for v in replies)


async def read_stats(redis: AsyncClient) -> Stats:
    """Read every counter and histogram of every shard in one pipeline (4 commands a shard, 4,096 in all).

    On a single node that is one round trip; redis-py's cluster client splits the pipeline per node.
    """

    def per_shard(pipe: Any, shard: ShardKeys) -> None:
        pipe.hgetall(shard.stats)  # the counters, the fenced writes, the segmented figures (bounded by label caps)
        pipe.zcard(shard.runnable)
        pipe.hgetall(shard.histogram("queue_wait"))
        pipe.hgetall(shard.histogram("run"))

    async with redis.pipeline(transaction=False) as pipe:
        for shard in ALL_SHARDS:
            per_shard(pipe, shard)
        replies = await pipe.execute()
    totals = sum_counts(replies[0::4])
    values = {name: _int(totals.get(name)) for name in _COUNTERS}
    return Stats(
        **values,
        fenced_rejections=_int(totals.get(FENCED_FIELD)),
        runnable_sessions=sum(int(n) for n in replies[1::4]),
        queue_wait=_histograms(replies[2::4], QUEUE_WAIT_BUCKETS),
        run_duration=_histograms(replies[3::4], RUN_DURATION_BUCKETS),
        credits=float(totals.get("credits") or 0),
        input_tokens=_int(totals.get("input_tokens")),
        output_tokens=_int(totals.get("output_tokens")),
        segments=parse_segments(totals),
    )


async def record_usage(
    redis: aioredis.Redis, session: SessionKey, *, credits: float, input_tokens: int, output_tokens: int
) -> None:
    """Add one turn's metered usage to the totals (in the session's shard, which :func:`read_stats` sums)."""
    stats = SessionKeys(session).shard.stats
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hincrbyfloat(stats, "credits", credits)
        pipe.hincrby(stats, "input_tokens", input_tokens)
        pipe.hincrby(stats, "output_tokens", output_tokens)
        await pipe.execute()
