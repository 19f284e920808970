"""``/metrics`` label values come from this code, never from a request."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from switchboard.queue.connection import async_client
from switchboard.queue.keys import ShardKeys
from switchboard.queue.stats import read_stats
from switchboard.settings import load_settings
from switchboard.web.app import create_app
from switchboard.web.metrics import UNKNOWN_CHANNEL, Metrics


def _series(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {
        (sample.name, tuple(sorted(sample.labels.items())))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def _scrape(client: TestClient[Any, Any]) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    resp = await client.get("/metrics")
    assert resp.status == 200
    return _series(await resp.text())


async def test_a_thousand_made_up_channel_names_create_no_series(base_env: dict[str, str], aiohttp_client: Any) -> None:
    client: TestClient[Any, Any] = await aiohttp_client(create_app(load_settings(base_env)))
    await client.post("/webhooks/warmup", data=b"{}")  # the one "unknown" series exists from here on
    before = await _scrape(client)

    async def probe(i: int) -> None:
        name = secrets.token_hex(8)
        path = f"/webhooks/{name}" if i % 2 else f"/webhooks/{name}/{secrets.token_hex(4)}"
        resp = await (client.post(path, data=b"{}") if i % 3 else client.get(path))
        assert resp.status == 404

    for start in range(0, 1_000, 100):
        await asyncio.gather(*(probe(i) for i in range(start, start + 100)))
    after = await _scrape(client)
    assert after == before
    channels = {dict(labels).get("channel") for _, labels in after} - {None}
    assert channels <= {"web", UNKNOWN_CHANNEL}
    rejected = [s for s in after if s[0] == "switchboard_requests_rejected_total"]
    assert rejected == [
        ("switchboard_requests_rejected_total", (("channel", UNKNOWN_CHANNEL), ("reason", "unknown_channel")))
    ]


def test_only_allowed_channel_names_become_label_values() -> None:
    metrics = Metrics()
    metrics.allow_channels(["telegram"])
    for name in ("web", "telegram", "slack", "x" * 500):
        metrics.ingested(name, duplicate=False)
        metrics.rejected(name, "bad_signature")
    text = metrics.render(None, None).decode()
    accepted = {
        dict(labels)["channel"]: name for name, labels in _series(text) if name == "switchboard_messages_accepted_total"
    }
    assert set(accepted) == {"web", "telegram", UNKNOWN_CHANNEL}
    assert 'switchboard_messages_accepted_total{channel="unknown"} 2.0' in text


async def test_deferrals_drops_and_send_dead_letters_are_exported(sync_redis: Any, redis_url: str) -> None:
    sync_redis.hset(ShardKeys(7).stats, mapping={"runs_deferred": 3, "messages_dropped": 5, "send_dead_letters": 7})
    client = async_client(redis_url)
    try:
        snapshot = await read_stats(client)
    finally:
        await client.aclose()
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(Metrics().render(snapshot, None).decode())
        for sample in family.samples
    }
    assert samples["switchboard_runs_deferred_total"] == 3
    assert samples["switchboard_messages_dropped_total"] == 5
    assert samples["switchboard_send_dead_letters_total"] == 7
