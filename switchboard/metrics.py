"""Prometheus metrics for ``/metrics``: this process's ingest counters plus queue figures read from Redis.

Worker-side figures (queue wait, run duration, dead letters) are kept in Redis by the queue layer,
so any web process shows the whole deployment's numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from switchboard.queue.stats import Stats

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _QueueCollector(Collector):
    """Exports the last snapshot of the deployment-wide figures read from Redis."""

    def __init__(self) -> None:
        self.snapshot: Stats | None = None
        self.live_workers: int | None = None

    def collect(self) -> Iterable[Metric]:
        s = self.snapshot
        if self.live_workers is not None:
            yield GaugeMetricFamily(
                "switchboard_live_workers", "Workers with a recent heartbeat", value=self.live_workers
            )
        if s is None:
            return
        yield GaugeMetricFamily(
            "switchboard_queue_depth", "Sessions with messages waiting (runnable)", value=s.runnable_sessions
        )
        for name, value, help_text in (
            ("runs_completed", s.runs_completed, "Runs that delivered their reply"),
            ("runs_failed", s.runs_failed, "Attempts that failed (retried or dead-lettered)"),
            ("dead_letters", s.dead_letters, "Messages set aside after repeated failures"),
            ("fenced_rejections", s.fenced_rejections, "Writes refused because their lease epoch was stale"),
            ("send_window_duplicates", s.send_window_duplicates, "Sends repeated after a crash inside the send window"),
            ("credits", s.credits, "Credits metered from the price table"),
            ("input_tokens", s.input_tokens, "Model input tokens"),
            ("output_tokens", s.output_tokens, "Model output tokens"),
        ):
            yield CounterMetricFamily(f"switchboard_{name}", help_text, value=value)
        for name, hist, help_text in (
            ("queue_wait_seconds", s.queue_wait, "Time from accepted to run start"),
            ("run_duration_seconds", s.run_duration, "Time from run start to reply delivered"),
        ):
            yield HistogramMetricFamily(
                f"switchboard_{name}",
                help_text,
                buckets=[("+Inf" if math.isinf(le) else f"{le:g}", float(count)) for le, count in hist.buckets],
                sum_value=hist.sum,
            )


class Metrics:
    """One registry per process (tests create several apps, so no global registry)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._accepted = Counter(
            "switchboard_messages_accepted", "Messages durably queued", ["channel"], registry=self.registry
        )
        self._deduplicated = Counter(
            "switchboard_messages_deduplicated",
            "Platform retries dropped by dedup key",
            ["channel"],
            registry=self.registry,
        )
        self._rejected = Counter(
            "switchboard_requests_rejected",
            "Requests refused, by reason",
            ["channel", "reason"],
            registry=self.registry,
        )
        self._queue = _QueueCollector()
        self.registry.register(self._queue)
        self._ingested: dict[tuple[str, bool], Any] = {}
        """Labelled children by (channel, duplicate): ``labels()`` costs more than the increment itself."""

    def ingested(self, channel: str, *, duplicate: bool) -> None:
        """Count one message accepted or deduplicated."""
        child = self._ingested.get((channel, duplicate))
        if child is None:
            child = (self._deduplicated if duplicate else self._accepted).labels(channel)
            self._ingested[(channel, duplicate)] = child
        child.inc()

    def rejected(self, channel: str, reason: str) -> None:
        """Count one refused request."""
        self._rejected.labels(channel, reason).inc()

    def render(self, snapshot: Stats | None, live_workers: int | None) -> bytes:
        """The exposition text, with the deployment-wide figures just read from Redis."""
        self._queue.snapshot = snapshot
        self._queue.live_workers = live_workers
        return generate_latest(self.registry)
