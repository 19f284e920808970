"""The console's figures by agent version and tool: read from Redis, each operator sees their tenants only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from switchboard.core.events import ToolCalled, UsageMetered
from switchboard.queue.keys import ShardKeys
from switchboard.queue.segments import SegmentLabels, TurnTally, run_field
from tests.console.conftest import OPERATORS_CONFIG, Console


@pytest.fixture
async def console(
    base_env: dict[str, str], tmp_path: Path, make_console: Callable[[dict[str, str]], Awaitable[Console]]
) -> Console:
    config = tmp_path / "console.yaml"
    config.write_text(OPERATORS_CONFIG + "tenants: {other: {}}\n")
    return await make_console({**base_env, "SWITCHBOARD_CONFIG": str(config)})


async def record_turn(redis: aioredis.Redis, labels: SegmentLabels, tenant: str, seconds: float, ok: bool) -> None:
    """One turn's increments, as a worker writes them with the turn's closing facts."""
    tally = TurnTally(tenant=tenant)
    tally.see(ToolCalled(tool="current_time", ok=ok, duration_ms=3, error_class=None if ok else "validation"))
    tally.see(
        UsageMetered(
            model="offline",
            steps=2,
            tool_calls=1,
            input_tokens=10,
            output_tokens=5,
            credits=0.5,
            agent="assistant",
            prompt_version="abc123",
            duration_ms=seconds * 1000,
        )
    )
    for name, amount, is_float in tally.increments(labels):
        if is_float:
            await redis.hincrbyfloat(ShardKeys(0).stats, name, float(amount))
        else:
            await redis.hincrby(ShardKeys(0).stats, name, int(amount))


async def test_an_operator_sees_turns_latency_cost_and_tool_outcomes_of_their_tenants(
    console: Console, async_redis: aioredis.Redis
) -> None:
    labels = SegmentLabels.of(console.settings.file)
    for seconds, ok in ((0.3, True), (0.4, True), (4.0, False)):
        await record_turn(async_redis, labels, "default", seconds, ok)
    await record_turn(async_redis, labels, "other", 1.0, True)
    for tenant, outcome in (
        ("default", "failed"),
        ("default", "failed"),
        ("default", "cancelled"),
        ("other", "failed"),
    ):
        await async_redis.hincrby(ShardKeys(3).stats, run_field(labels, "assistant", tenant, outcome), 1)

    assert (await console.login("alice")).status == 200
    body = await (await console.client.get("/console/api/budgets")).json()

    [agent] = body["agents"]
    assert (agent["agent"], agent["version"], agent["tenant"], agent["turns"]) == ("assistant", "abc123", "default", 3)
    assert agent["p50_s"] <= 0.5 < agent["p95_s"] <= 5.0
    assert agent["cost_per_task"] == 0.5
    assert body["tools"] == [
        {
            "agent": "assistant",
            "tool": "current_time",
            "tenant": "default",
            "outcomes": {"ok": 2, "validation": 1},
            "retries": 0,
        }
    ]
    assert body["runs"] == [{"agent": "assistant", "tenant": "default", "failed": 2, "cancelled": 1}]
    assert (await console.login("bob")).status == 200
    other = await (await console.client.get("/console/api/budgets")).json()
    # bob's tenant is named like the overflow label ("other", several tenants summed): an operator scoped to tenants
    # never sees that row, nor alice's
    assert other["agents"] == other["tools"] == other["runs"] == []
