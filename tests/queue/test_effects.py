"""Effect records in Redis: a re-run of a turn repeats no write, other arguments are refused, zombies are fenced.

A deliberate repeat of the same call later in the run is its own action (its occurrence is part of the key), and a
re-run of the turn by another worker maps every call to the record its earlier attempt left.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.core.agent.replay import ReplayModel
from switchboard.core.events import Event
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.effects import EFFECT_TTL_S, EffectRecord, effect_key
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


class WorkerKilled(BaseException):
    """The worker process dies here (nothing in the runtime catches it)."""


class KilledAfterCalls(MemorySink):
    """A sink whose worker dies once ``calls`` tool calls were recorded (the turn goes no further)."""

    def __init__(self, calls: int) -> None:
        super().__init__()
        self.calls = calls

    async def event(self, event: Event) -> None:
        await super().event(event)
        if len(self.of("tool_called")) >= self.calls:
            raise WorkerKilled


async def take_over(client: aioredis.Redis, session: SessionKey, settings: QueueSettings) -> RedisSessionStore:
    """The lease of a dead worker lapses and worker w2 takes the session: a store under the new epoch."""
    await client.delete(SessionKeys(session).lease)
    lease = await Lease(client, worker_id="w2", lease_ms=60_000).acquire(session)
    assert lease is not None
    return RedisSessionStore.for_lease(client, lease, settings)


def tool_results(model: ReplayModel) -> list[Any]:
    """What the model was shown for each tool call of the turn, in order."""
    return [json.loads(m.content) for m in model.requests[-1].messages if m.role == "tool"]


async def test_a_rerun_after_a_crash_between_two_identical_writes_runs_only_the_second(
    client: aioredis.Redis, queue_settings: QueueSettings, tmp_path: Path
) -> None:
    runs: list[str] = []

    async def charge(args: Payload, ctx: ToolContext) -> Any:
        runs.append(ctx.idempotency_key)
        return {"charged": args.n, "run": len(runs)}

    registry = registry_with(make_tool("charge", charge, input=Payload, side_effect="write"))
    turn = request("charge me twice", agent_=agent(tools=["charge"]), run_id="run-B")
    script = [
        calls_step(("charge", {"n": 5}), step=1),
        calls_step(("charge", {"n": 5}), step=2),
        answer_step("charged twice", step=3),
    ]
    first = await store_for(client, turn.session_key, queue_settings)
    with pytest.raises(WorkerKilled):  # w1 dies after the first charge was recorded, before the second
        await runtime(tmp_path, model=ReplayModel(script), registry=registry).run_turn(turn, KilledAfterCalls(1), first)
    assert len(runs) == 1

    second = await take_over(client, turn.session_key, queue_settings)
    model = ReplayModel(script)
    result = await runtime(tmp_path, model=model, registry=registry).run_turn(turn, MemorySink(), second)

    keys = [effect_key("run-B", "charge", {"n": 5}, n) for n in (1, 2)]
    assert result.text == "charged twice" and runs == keys  # the first not again, the second once
    assert tool_results(model) == [{"charged": 5, "run": 1}, {"charged": 5, "run": 2}]
    stored = {k async for k in client.scan_iter(match=SessionKeys(turn.session_key).effect("*"))}
    assert stored == {SessionKeys(turn.session_key).effect(k).encode() for k in keys}
    for key in keys:
        raw = await client.get(SessionKeys(turn.session_key).effect(key))
        assert raw is not None and EffectRecord.from_json(raw).status == "done"

    third = await take_over(client, turn.session_key, queue_settings)  # w2 died before the ack: run once more
    model = ReplayModel(script)
    await runtime(tmp_path, model=model, registry=registry).run_turn(turn, MemorySink(), third)
    assert runs == keys and tool_results(model) == [{"charged": 5, "run": 1}, {"charged": 5, "run": 2}]


async def test_a_repeat_whose_worker_died_mid_effect_is_not_run_again_on_the_rerun(
    client: aioredis.Redis, queue_settings: QueueSettings, tmp_path: Path
) -> None:
    runs: list[str] = []

    async def charge(args: Payload, ctx: ToolContext) -> Any:
        runs.append(ctx.idempotency_key)
        if len(runs) == 2:
            raise WorkerKilled  # the second charge went out; the worker died before recording it
        return {"charged": args.n, "run": len(runs)}

    registry = registry_with(make_tool("charge", charge, input=Payload, side_effect="write"))
    turn = request("charge me twice", agent_=agent(tools=["charge"]), run_id="run-C")
    script = [
        calls_step(("charge", {"n": 5}), step=1),
        calls_step(("charge", {"n": 5}), step=2),
        answer_step("maybe charged", step=3),
    ]
    first = await store_for(client, turn.session_key, queue_settings)
    with pytest.raises(WorkerKilled):
        await runtime(tmp_path, model=ReplayModel(script), registry=registry).run_turn(turn, MemorySink(), first)

    second = await take_over(client, turn.session_key, queue_settings)
    model = ReplayModel(script)
    await runtime(tmp_path, model=model, registry=registry).run_turn(turn, MemorySink(), second)

    assert runs == [effect_key("run-C", "charge", {"n": 5}, n) for n in (1, 2)]  # nothing ran on the re-run
    recorded, unknown = tool_results(model)
    assert recorded == {"charged": 5, "run": 1}  # the first charge: its recorded outcome
    assert unknown["error_class"] == "ambiguous"  # the second: in doubt, reported, not repeated


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
