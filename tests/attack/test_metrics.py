"""The ingest counters in the Prometheus exposition: each series exported once, with any channel name."""

from __future__ import annotations

import time

import prometheus_client
from prometheus_client.parser import text_string_to_metric_families

from switchboard.web.metrics import UNKNOWN_CHANNEL, Metrics

TOKEN, BOT_ID, BOT, SECRET = "123456:TEST-token-abcdefghijklmnopqrstuv", 123456, "hostile_bot", "hostile-Secret_1"
INGEST = ("switchboard_messages_accepted_", "switchboard_messages_deduplicated_")


def series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in found, f"series {key} exported twice"
            found[key] = sample.value
    return found


# ── the ingest counters, counted between scrapes ────────────────────────────────────────────────────────────


def test_the_exposition_parses_and_counts_each_series_once() -> None:
    metrics, first = Metrics(["telegram", "web"]), time.time()
    renders = [metrics.render(None, None).decode()]
    for channel, duplicate, times in [("telegram", 0, 3), ("web", 1, 2), ("slack", 0, 1), ("x" * 500, 1, 1)]:
        for _ in range(times):
            metrics.ingested(channel, duplicate=bool(duplicate))
    renders.append(metrics.render(None, None).decode())
    for text in renders:  # HELP and TYPE once per family, with no series as with some
        lines = text.splitlines()
        for name in ("switchboard_messages_accepted_total", "switchboard_messages_deduplicated_total"):
            assert sum(x.startswith(f"# HELP {name} ") for x in lines) == lines.count(f"# TYPE {name} counter") == 1
    assert not [k for k in series(renders[0]) if k[0].startswith(INGEST)]
    found = {k: v for k, v in series(renders[1]).items() if k[0].startswith(INGEST)}
    families = {f.name: f.type for f in text_string_to_metric_families(renders[1])}
    assert families["switchboard_messages_accepted"] == families["switchboard_messages_deduplicated"] == "counter"
    expected = {("accepted", "telegram"): 3, ("accepted", UNKNOWN_CHANNEL): 1, ("deduplicated", "web"): 2}
    expected[("deduplicated", UNKNOWN_CHANNEL)] = 1
    totals = {(f"switchboard_messages_{kind}_total", (("channel", ch),)): n for (kind, ch), n in expected.items()}
    assert {k: v for k, v in found.items() if k[0].endswith("_total")} == totals
    created = {k: v for k, v in found.items() if k[0].endswith("_created")}
    assert set(created) == {(f"switchboard_messages_{kind}_created", (("channel", ch),)) for kind, ch in expected}
    assert all(first - 1 <= v <= time.time() + 1 for v in created.values())
    for _ in range(5):
        metrics.ingested("telegram", duplicate=False)
    again = series(metrics.render(None, None).decode())
    assert again[("switchboard_messages_accepted_total", (("channel", "telegram"),))] == 8
    assert {k: again[k] for k in created} == created  # a series' creation time is set once


def test_the_ingest_series_obey_prometheus_clients_switch_for_created_series() -> None:
    """The ingest series leave out ``_created`` under prometheus_client's switch, as the other counters do."""
    prometheus_client.disable_created_metrics()
    try:
        metrics = Metrics(["telegram"])
        metrics.ingested("telegram", duplicate=False)
        metrics.rejected("telegram", "bad_signature")
        found = series(metrics.render(None, None).decode())
    finally:
        prometheus_client.enable_created_metrics()
    assert (
        "switchboard_requests_rejected_created",
        (("channel", "telegram"), ("reason", "bad_signature")),
    ) not in found
    assert [k for k in found if k[0].endswith("_created")] == []
