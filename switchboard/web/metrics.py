"""Prometheus metrics for ``/metrics``: this process's ingest counters plus queue figures read from Redis.

Worker-side figures (queue wait, run duration, dead letters) are kept in Redis by the queue layer,
so any web process shows the whole deployment's numbers.

Label values come only from this code, never from a request: a ``channel`` label is one of the channel names
the process was told about (:meth:`Metrics.allow_channels`) or ``unknown``, so nothing an outsider sends (say,
``POST /webhooks/<random name>``) can create a series. The ``agent``, ``version``, ``tool`` and ``tenant`` labels of the
segmented figures are bounded the same way, by the workers that write them (:mod:`switchboard.queue.segments`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from switchboard.core.workspaces.disk import read_total_bytes
from switchboard.queue.segments import Segments
from switchboard.queue.stats import Stats

__all__ = ["CONTENT_TYPE", "UNKNOWN_CHANNEL", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UNKNOWN_CHANNEL = "unknown"
"""The ``channel`` label of every request for a channel name this process does not serve."""


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
            ("runs_deferred", s.runs_deferred, "Turns put off because the model provider asked to wait"),
            ("dead_letters", s.dead_letters, "Messages set aside after repeated failures"),
            ("send_dead_letters", s.send_dead_letters, "Replies produced but never delivered (the send was given up)"),
            ("messages_dropped", s.messages_dropped, "Platform messages dropped by an abuse limit (answered 2xx)"),
            ("fenced_rejections", s.fenced_rejections, "Writes refused because their lease epoch was stale"),
            ("send_window_duplicates", s.send_window_duplicates, "Sends repeated after a crash inside the send window"),
            ("credits", s.credits, "Credits metered from the price table"),
            ("input_tokens", s.input_tokens, "Model input tokens"),
            ("output_tokens", s.output_tokens, "Model output tokens"),
            ("egress_allowed", s.egress_allowed, "Sandbox and tool requests the egress policy let out"),
            ("egress_refused", s.egress_refused, "Sandbox and tool requests the egress policy refused"),
        ):
            yield CounterMetricFamily(f"switchboard_{name}", help_text, value=value)
        deliveries = CounterMetricFamily(
            "switchboard_delivery_statuses", "Delivery and read reports from the platforms", labels=["status"]
        )
        for status, count in (
            ("sent", s.delivery_sent),
            ("delivered", s.delivery_delivered),
            ("read", s.delivery_read),
            ("failed", s.delivery_failed),
        ):
            deliveries.add_metric([status], count)
        yield deliveries
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
        yield from _segments(s.segments)


def _segments(seg: Segments) -> Iterable[Metric]:
    """The figures by agent, version, tool and tenant."""
    turns = HistogramMetricFamily(
        "switchboard_agent_turn_seconds",
        "Turns that ran their model, by how long they took (count: turns completed)",
        labels=["agent", "version", "tenant"],
    )
    for (agent, version, tenant), (buckets, total) in sorted(seg.turns.items()):
        turns.add_metric(
            [agent, version, tenant],
            [("+Inf" if math.isinf(le) else f"{le:g}", float(count)) for le, count in buckets],
            sum_value=total,
        )
    yield turns
    counters: list[tuple[str, str, list[str], Mapping[Any, float]]] = [
        ("switchboard_agent_credits", "Credits the turns cost (cost per task: over the turn count)",
         ["agent", "version", "tenant"], seg.credits),
        ("switchboard_agent_stops", "Turns a budget ended early, by budget (deadline: a timeout)",
         ["agent", "version", "tenant", "reason"], seg.stops),
        ("switchboard_tool_calls", "Tool calls by outcome", ["agent", "tool", "tenant", "outcome"], seg.tools),
        ("switchboard_tool_retries", "Tool runs repeated by the gateway after a retryable failure",
         ["agent", "tool", "tenant"], seg.retries),
        ("switchboard_approvals_requested", "Approvals asked of a person (a tool call, or a held reply)",
         ["agent", "tenant", "kind"], seg.approvals),
        ("switchboard_agent_runs_ended",
         "Attempts that failed (retried or dead-lettered) and runs cancelled, by agent and tenant",
         ["agent", "tenant", "outcome"], seg.runs),
        ("switchboard_review_verdicts",
         "Sampled runs by a reviewer's first verdict (completion as people judge it)",
         ["agent", "tenant", "verdict"], seg.reviews),
    ]  # fmt: skip
    for name, help_text, labels, values in counters:
        family = CounterMetricFamily(name, help_text, labels=labels)
        for key, value in sorted(values.items()):
            family.add_metric(list(key), value)
        yield family


class _WorkspaceCollector(Collector):
    """Disk held by every session workspace under one root (the usage ledger the workers keep), and its bound."""

    def __init__(self, root: Path, quota_bytes: int) -> None:
        self.root = root
        self.quota_bytes = quota_bytes

    def collect(self) -> Iterable[Metric]:
        used = read_total_bytes(self.root)  # a few bytes from a local file: cheap enough for a scrape
        yield GaugeMetricFamily("switchboard_workspace_bytes", "Bytes held by all session workspaces", value=used or 0)
        yield GaugeMetricFamily(
            "switchboard_workspace_quota_bytes", "Most all session workspaces may hold", value=self.quota_bytes
        )


class Metrics:
    """One registry per process (tests create several apps, so no global registry)."""

    def __init__(self, channels: Iterable[str] = ("web",)) -> None:
        """Create the registry.

        Args:
            channels: the channel names that may appear as a label (more with :meth:`allow_channels`); any other
                name is counted as ``unknown``. The web chat is always on, hence the default.
        """
        self._channels: set[str] = set(channels)
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
        self._ingested: dict[tuple[str, bool], int] = {}
        """Messages counted since the last scrape, by (channel, duplicate), added to the counters by :meth:`render`:
        ``Counter.labels(...).inc()`` takes a lock per call, a measurable part of a webhook's CPU. Counted on the event
        loop's thread only, so the plain counts need none."""
        self._rejected = Counter(
            "switchboard_requests_rejected",
            "Requests refused, by reason",
            ["channel", "reason"],
            registry=self.registry,
        )
        self._queue = _QueueCollector()
        self.registry.register(self._queue)

    def watch_workspaces(self, root: Path, quota_bytes: int) -> None:
        """Also export the disk used by the session workspaces under ``root`` and their total quota."""
        self.registry.register(_WorkspaceCollector(root, quota_bytes))

    def allow_channels(self, channels: Iterable[str]) -> None:
        """Let these channel names appear as label values (the enabled channels, known at start-up)."""
        self._channels.update(channels)

    def _channel(self, name: str) -> str:
        return name if name in self._channels else UNKNOWN_CHANNEL

    def ingested(self, channel: str, *, duplicate: bool) -> None:
        """Count one message accepted or deduplicated."""
        key = (self._channel(channel), duplicate)
        counts = self._ingested
        counts[key] = counts.get(key, 0) + 1

    def rejected(self, channel: str, reason: str) -> None:
        """Count one refused request (``reason`` is a code of ours, never text from the request)."""
        self._rejected.labels(self._channel(channel), reason).inc()

    def render(self, snapshot: Stats | None, live_workers: int | None) -> bytes:
        """The exposition text, with the deployment-wide figures just read from Redis."""
        self._queue.snapshot = snapshot
        self._queue.live_workers = live_workers
        counted, self._ingested = self._ingested, {}
        for (channel, duplicate), count in counted.items():
            (self._deduplicated if duplicate else self._accepted).labels(channel).inc(count)
        return generate_latest(self.registry)
