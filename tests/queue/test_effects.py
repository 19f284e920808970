"""Effect records in Redis: a re-run of a turn repeats no write, other arguments are refused, zombies are fenced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.core.effects import EFFECT_TTL_S, EffectRecord
from switchboard.core.replay import ReplayModel
from switchboard.core.tools import ToolContext
from switchboard.errors import FencedWriteError
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease
from switchboard.queue.store import RedisSessionStore
from switchboard.settings import QueueSettings
from switchboard.types import SessionKey
from tests.core.turns import (
    MemorySink,
    Payload,
    agent,
    answer_step,
    calls_step,
    make_tool,
    registry_with,
    request,
    runtime,
)


async def store_for(client: aioredis.Redis, session: SessionKey, settings: QueueSettings) -> RedisSessionStore:
    lease = await Lease(client, worker_id="w1", lease_ms=60_000).acquire(session)
    assert lease is not None
    return RedisSessionStore.for_lease(client, lease, settings)


async def test_a_rerun_of_the_turn_repeats_no_write(
    client: aioredis.Redis, queue_settings: QueueSettings, tmp_path: Path
) -> None:
    runs: list[int] = []

    async def charge(args: Payload, ctx: ToolContext) -> Any:
        runs.append(args.n)
        return {"charged": args.n}

    registry = registry_with(make_tool("charge", charge, input=Payload, side_effect="write"))
    turn = request("charge me", agent_=agent(tools=["charge"]), run_id="run-A")
    store = await store_for(client, turn.session_key, queue_settings)
    script = [calls_step(("charge", {"n": 5}), step=1), answer_step("charged", step=2)]

    for _ in range(2):  # the same turn, run again after a crash: same run id, same store
        await runtime(tmp_path, model=ReplayModel(script), registry=registry).run_turn(turn, MemorySink(), store)

    assert runs == [5]
    keys = [k async for k in client.scan_iter(match=SessionKeys(turn.session_key).effect("*"))]
    assert len(keys) == 1
    assert EFFECT_TTL_S >= 24 * 3600 and await client.pttl(keys[0]) > 24 * 3600 * 1000


async def test_records_are_compared_by_arguments_and_fenced_by_the_lease(
    client: aioredis.Redis, queue_settings: QueueSettings
) -> None:
    session = SessionKey("t/a/web/default/fx")
    store = await store_for(client, session, queue_settings)

    assert await store.effect_begin("k1", EffectRecord("sha-a")) is None
    assert await store.effect_begin("k1", EffectRecord("sha-b")) == EffectRecord("sha-a", "started")
    done = EffectRecord("sha-a", "done", {"tool": "t", "ok": True})
    await store.effect_finish("k1", done)
    assert await store.effect_begin("k1", EffectRecord("sha-a")) == done
    await store.effect_begin("k2", EffectRecord("sha-c"))
    await store.effect_finish("k2", None)  # a failure releases the claim
    assert await store.effect_begin("k2", EffectRecord("sha-d")) is None

    await client.delete(SessionKeys(session).lease)  # the lease passes to another worker
    assert await Lease(client, worker_id="w2", lease_ms=60_000).acquire(session) is not None
    with pytest.raises(FencedWriteError):
        await store.effect_begin("k3", EffectRecord("sha-e"))
    with pytest.raises(FencedWriteError):
        await store.effect_finish("k1", None)
    assert await client.exists(SessionKeys(session).effect("k1")) == 1
