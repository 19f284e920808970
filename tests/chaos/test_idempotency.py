"""The idempotency store under load and crashes: the real :class:`ToolGateway` over the real Redis effect store.

- 16 threads, each with its own event loop and Redis connection, make 1,000 calls each of the same write call (one
  idempotency key): the tool runs once; every other caller gets the stored result — one that arrives while the one
  execution is in flight waits for it (``switchboard.core.tools.effects.running``).
- 100 calls under the same key with other arguments: all refused (``idempotency_conflict``), none runs.
- The record's TTL is at least 24 h.
- 50 crashes of real worker processes between "effect done" and "result recorded" (the tool SIGKILLs its own
  worker right after its effect): 0 re-executions, 50/50 routed to reconciliation (``ControlService.effects_in_doubt``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from pydantic import BaseModel, Field

from switchboard.control import ControlService, OperatorScope
from switchboard.core.messages import session_key
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.tools.effects import EFFECT_TTL_S
from switchboard.core.tools.gateway import CallScope, ToolGateway, ToolOutcome
from switchboard.core.workspaces.disk import workspace_for
from switchboard.queue.connection import async_client
from switchboard.queue.effects import RedisEffects
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease, LeaseToken
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from tests.shardindexes import doubts_of
from tests.waiting import wait_until

from .harness import Gateway, chaos_env, chat_of, event_log, key_of, replies, settled
from .toolpool import ToolWorkerPool, agent_yaml, tool_env, tool_pools
from .toolworker import executions

__all__ = ["tool_pools"]

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

THREADS = 16
CALLS = 1_000
MISMATCHES = 100
EFFECT_S = 0.005
"""How long the one execution takes (a downstream call): other callers race it meanwhile."""
SESSION: SessionKey = session_key("default", "assistant", "telegram", "default", "r7-store")


class Charge(BaseModel):
    ref: str
    amount: int = Field(gt=0)


def charging_tool(runs: list[tuple[str, int]]) -> Tool:
    """A write keyed by ``ref`` alone: the same ``ref`` with another amount is the same action with other arguments."""

    async def charge(args: Charge, ctx: ToolContext) -> dict[str, Any]:
        runs.append((args.ref, args.amount))  # list.append is atomic under the GIL: a count across threads
        await asyncio.sleep(EFFECT_S)
        return {"charged": args.amount, "ref": args.ref, "execution": len(runs)}

    return Tool(
        name="charge",
        description="Charge once per reference.",
        input=Charge,
        fn=charge,
        side_effect="write",
        risk="low",
        key_fields=("ref",),
    )


def make_ctx(tmp_path: Path, effects: RedisEffects) -> ToolContext:
    return ToolContext(
        session_key=SESSION,
        tenant="default",
        run_id="run-r7",
        actor="telegram:42",
        workspace=workspace_for(tmp_path / "ws", SESSION),
        idempotency_key="",
        effects=effects,
        agent="assistant",
    )


def hammer(
    url: str,
    tmp_path: Path,
    token: str,
    epoch: int,
    tool: Tool,
    calls: list[dict[str, Any]],
    barrier: threading.Barrier,
) -> list[ToolOutcome]:
    """One thread: its own loop, connection, gateway and effect store; makes ``calls`` one after another."""

    async def run() -> list[ToolOutcome]:
        client = async_client(url)
        gateway = ToolGateway(ToolRegistry([tool]), workspace_root=tmp_path / "ws")
        ctx = make_ctx(tmp_path, RedisEffects(client, SESSION, token, epoch))
        outcomes = []
        try:
            await client.ping()
            barrier.wait()
            for args in calls:  # a fresh scope per call: every call is occurrence 1 of its action, one key
                outcomes.append(await gateway.call("charge", args, ctx, scope=CallScope()))
        finally:
            await client.aclose()
        return outcomes

    return asyncio.run(run())


async def lease_of(client: aioredis.Redis) -> LeaseToken:
    """The session's lease, as the drain holding it would have: every thread writes under it."""
    lease = await Lease(client, worker_id="r7", lease_ms=600_000).acquire(SESSION)
    assert lease is not None
    return lease


async def run_threads(
    redis_url: str, tmp_path: Path, lease: LeaseToken, tool: Tool, plans: list[list[dict[str, Any]]]
) -> list[ToolOutcome]:
    """Run each plan in a thread of its own (its own loop and connection), all starting together."""
    barrier = threading.Barrier(len(plans))
    results: list[list[ToolOutcome]] = [[] for _ in plans]

    def target(index: int) -> None:
        results[index] = hammer(redis_url, tmp_path, lease.token, lease.epoch, tool, plans[index], barrier)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(len(plans))]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join)
    return [o for per_thread in results for o in per_thread]


async def test_sixteen_threads_of_the_same_call_execute_it_once_and_share_its_result(
    redis_url: str, async_redis: aioredis.Redis, tmp_path: Path, record_property: Callable[[str, Any], None]
) -> None:
    """R7 asks 16 threads × 1,000 calls of one call and key: exactly 1 execution, every caller the stored result.

    Run as asked (16,000 calls). A caller that reaches the store while the one execution is in flight (its claim
    ``started``, a 5 ms window) waits for that execution of its own process and gets its recorded result.
    """
    runs: list[tuple[str, int]] = []
    lease = await lease_of(async_redis)
    plans = [[{"ref": "order-1", "amount": 100}] * CALLS for _ in range(THREADS)]
    started = time.monotonic()
    outcomes = await run_threads(redis_url, tmp_path, lease, charging_tool(runs), plans)
    wall = time.monotonic() - started
    kinds = Counter("ok" if o.ok else o.error_class for o in outcomes)
    values = {repr(o.value) for o in outcomes if o.ok}
    keys = {o.idempotency_key for o in outcomes}
    record = SessionKeys(SESSION).effect(next(iter(keys)) or "")
    ttl_ms = await async_redis.pttl(record)
    print(
        f"\n[R7 store] {THREADS} threads × {CALLS} calls of one key in {wall:.1f}s "
        f"({len(outcomes) / wall:,.0f} calls/s): executions {len(runs)}; outcomes {dict(kinds)}; "
        f"distinct results {len(values)}; record TTL {ttl_ms / 3.6e6:.1f} h"
    )
    record_property("r7_outcomes", dict(kinds))
    assert len(outcomes) == THREADS * CALLS
    assert runs == [("order-1", 100)]  # exactly one execution
    assert len(keys) == 1 and None not in keys
    assert values == {repr({"charged": 100, "ref": "order-1", "execution": 1})}  # every result is the stored one
    assert kinds == {"ok": THREADS * CALLS}, kinds  # every caller the result: no refusal, no second run, no conflict
    assert ttl_ms >= 24 * 3600 * 1000, ttl_ms
    assert ttl_ms <= EFFECT_TTL_S * 1000


async def test_the_same_key_with_other_arguments_is_refused_every_time(
    redis_url: str, async_redis: aioredis.Redis, tmp_path: Path
) -> None:
    """R7 asks 100 same-key/other-parameter calls rejected: 100 calls from 4 threads, after the first call ran."""
    runs: list[tuple[str, int]] = []
    lease = await lease_of(async_redis)
    tool = charging_tool(runs)
    first = await run_threads(redis_url, tmp_path, lease, tool, [[{"ref": "order-2", "amount": 100}]])
    assert [o.ok for o in first] == [True]
    plans = [[{"ref": "order-2", "amount": 101 + t * 25 + i} for i in range(MISMATCHES // 4)] for t in range(4)]
    outcomes = await run_threads(redis_url, tmp_path, lease, tool, plans)
    kinds = Counter("ok" if o.ok else o.error_class for o in outcomes)
    print(f"\n[R7 mismatches] {len(outcomes)} same-key calls with other arguments: {dict(kinds)}")
    assert len(outcomes) == MISMATCHES
    assert kinds == {"idempotency_conflict": MISMATCHES}
    assert {o.idempotency_key for o in outcomes} == {first[0].idempotency_key}
    assert runs == [("order-2", 100)]
    stored = await async_redis.get(SessionKeys(SESSION).effect(first[0].idempotency_key or ""))
    assert stored is not None and b'"charged":100' in stored  # the record is the first call's, untouched


async def test_a_caller_racing_the_execution_gets_its_result(
    redis_url: str, async_redis: aioredis.Redis, tmp_path: Path
) -> None:
    """R7's strict reading: *all* callers get the same stored result, including those racing the execution.

    16 threads × 20 calls with a 50 ms effect, so that callers surely arrive while it runs: they wait for the one
    execution of this process (``effects.running``) and get its recorded result; none is refused, none runs it again,
    and nothing is filed for reconciliation (the effect is not in doubt).
    """
    runs: list[tuple[str, int]] = []
    lease = await lease_of(async_redis)
    tool = charging_tool(runs)
    slow = dataclasses.replace(tool, fn=_slow(tool))
    plans = [[{"ref": "order-3", "amount": 100}] * 20 for _ in range(THREADS)]
    outcomes = await run_threads(redis_url, tmp_path, lease, slow, plans)
    doubts = await doubts_of(async_redis, "default")
    refused = Counter(o.error_class for o in outcomes if not o.ok)
    assert len(runs) == 1
    assert not refused and doubts == 0, f"refused {dict(refused)}; effects filed as in doubt: {doubts}"


def _slow(tool: Tool) -> Callable[[Any, ToolContext], Any]:
    async def slow(args: Any, ctx: ToolContext) -> Any:
        await asyncio.sleep(0.05)
        return await tool.fn(args, ctx)

    return slow


CRASHES = 50
CRASH_WORKERS = 4


async def test_fifty_crashes_between_effect_and_record_never_re_execute(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
    fake: Any,
    tool_pools: Callable[[dict[str, str], int], ToolWorkerPool],
    gateways: Callable[[dict[str, str]], Gateway],
    tmp_path: Path,
) -> None:
    """R7 asks 50 crashes between "effect done" and "result recorded": 0 re-executions, 50/50 to reconciliation.

    Run as asked: 50 sessions each ask for ``charge`` once (``/tool charge {"ref": "die-N"}``); the tool does its
    effect (counted in Redis) and SIGKILLs its own worker process before the gateway records the result. Four
    workers, one run at a time each (so a kill interrupts exactly one effect), restarted by the supervisor; another
    worker takes the session over and re-runs the turn, whose same call finds the claim ``started``.
    """
    env = tool_env(
        chaos_env(base_env, fake.base_url),
        agent_yaml(["charge"]),
        tmp_path,
        QUEUE__CONCURRENCY="1",
        QUEUE__MAX_ATTEMPTS="5",
    )
    gateway = gateways(env)
    await gateway.start()
    pool = tool_pools(env, CRASH_WORKERS)
    await pool.ready(timeout=30)
    started = time.monotonic()
    for session in range(CRASHES):
        posted = await gateway.send(session, 0, text=f'/tool charge {{"ref": "die-{session}"}}')
        assert posted.status == 200
    await wait_until(lambda: settled(async_redis), timeout=180, interval=0.25, what="every crashed turn answered")
    wall = time.monotonic() - started
    settings = load_settings(env)
    control = ControlService(async_redis, settings, Ingestor(async_redis, settings.queue))
    doubts = await control.effects_in_doubt(OperatorScope.everything("console:k"))
    counts = [executions(sync_redis, "charge", f"die-{s}") for s in range(CRASHES)]
    answers = {r.chat_id: r.text for r in replies(fake)}
    dead = [s for s in range(CRASHES) if await async_redis.llen(SessionKeys(key_of(s)).dead)]
    doubted = {d.session for d in doubts if d.tool == "charge"}
    print(
        f"\n[R7 crashes] {CRASHES} effects each followed by a SIGKILL of its worker, in {wall:.1f}s "
        f"({pool.restarts} restarts): executions per key {Counter(counts)}; in doubt {len(doubted)}/{CRASHES}; "
        f"dead letters {len(dead)}; e.g. answer: {next(iter(answers.values()), '')[:160]!r}"
    )
    assert pool.restarts >= CRASHES, pool.logs()  # every effect killed its worker
    assert counts == [1] * CRASHES  # 0 re-executions
    assert doubted == {key_of(s) for s in range(CRASHES)}  # 50/50 routed to reconciliation
    assert all(d.info.get("reason") == "found_started" and d.resolution is None for d in doubts), doubts[:2]
    assert not dead
    for session in range(CRASHES):  # the model was told it may have happened, and said so
        events = [e["kind"] for e in await event_log(async_redis, session)]
        assert events.count("run_completed") == 1, events
        assert "may already have happened" in answers.get(chat_of(session), ""), answers.get(chat_of(session))
