"""Approval scenarios through real worker processes and signed Telegram webhooks: executed once, decided once.

Every test runs ``python -m tests.chaos.toolworker`` workers (the real worker, with a gated ``refund`` and a counting
``tick``; :mod:`tests.chaos.toolworker`), the real web tier, the fake Bot API and the offline model (``/tool`` and
``/run``). The agent's policy has a rule ``refunds: refund → approve`` (approvers: the requester and operators).
Executions are counted by the tools themselves in Redis, from outside the worker processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from switchboard.channels.telegram.fake.platform import FakeTelegram, make_update
from switchboard.control import ControlError, ControlService, OperatorScope, OutOfScopeError
from switchboard.core.tools.gateway import action_sha256
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.settings import load_settings
from tests.shardindexes import doubts_of
from tests.waiting import wait_until

from .approvalflow import (
    POLICY,
    approval_of,
    ask_refund,
    buttons,
    click,
    command,
    next_update_id,
    post_update,
    press,
    record,
    texts,
)
from .harness import Gateway, chaos_env, chat_of, event_log, key_of, lease_holders, settled
from .toolpool import ToolWorkerPool, agent_yaml, tool_env, tool_pools
from .toolworker import PAUSE_EFFECT, PAUSE_VALIDATE, executions

__all__ = ["tool_pools"]

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

EVERYONE = OperatorScope.everything("console:k")
PROGRAM = """/run t = tick(ref="REF")
r = refund(amount=150, ref="REF")
t2 = tick(ref="REF")
print("refunded", r["refunded"], "ticks", t["tick"], t2["tick"])"""

Pools = Callable[[dict[str, str], int], ToolWorkerPool]
Gateways = Callable[[dict[str, str]], Gateway]


async def start(
    base_env: dict[str, str],
    fake: FakeTelegram,
    tool_pools: Pools,
    gateways: Gateways,
    tmp_path: Path,
    *,
    workers: int = 2,
    expiry_s: int = 3600,
    codeact: bool = False,
) -> tuple[dict[str, str], Gateway, ToolWorkerPool]:
    """The web tier and ``workers`` tool workers over one config (refund gated by a rule)."""
    config = agent_yaml(["refund", "tick"], codeact=codeact, policy=POLICY.replace("EXPIRY", str(expiry_s)))
    env = tool_env(chaos_env(base_env, fake.base_url), config, tmp_path, QUEUE__MAX_ATTEMPTS="5")
    gateway = gateways(env)
    await gateway.start()
    pool = tool_pools(env, workers)
    await pool.ready(timeout=30)
    return env, gateway, pool


def control_of(env: dict[str, str], client: aioredis.Redis) -> ControlService:
    settings = load_settings(env)
    return ControlService(client, settings, Ingestor(client, settings.queue))


async def status_of(client: aioredis.Redis, session: int, approval_id: str) -> str:
    return (await record(client, session, approval_id)).status


async def decided(client: aioredis.Redis, session: int, approval_id: str) -> list[dict[str, Any]]:
    """The session's ``approval_decided`` facts about ``approval_id``."""
    return [
        e
        for e in await event_log(client, session)
        if e["kind"] == "approval_decided" and e.get("approval_id") == approval_id
    ]


async def holder(client: aioredis.Redis, pool: ToolWorkerPool, session: int) -> int:
    """The pool slot whose worker holds ``session``'s lease right now."""
    held = await lease_holders(client, [session])
    assert held, f"nobody holds session {session}'s lease"
    slot = pool.slot_of(next(iter(held)))
    assert slot is not None, held
    return slot


async def said(fake: FakeTelegram, session: int, words: str, *, timeout: float = 30) -> str:
    """Wait until the bot said something containing ``words`` in ``session``'s chat; returns that message."""
    found: list[str] = []

    def seen() -> bool:
        found[:] = [t for t in texts(fake, session) if words in t][-1:]
        return bool(found)

    await wait_until(seen, timeout=timeout, interval=0.05, what=f"{words!r} said in session {session}")
    return found[0]


CRASH_ROUNDS = 3
"""SIGKILLs of the worker applying an approval, per kill point."""
PAUSE_S = "1.0"


async def crash_rounds(
    before: bool,
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
    fake: FakeTelegram,
    tool_pools: Pools,
    gateways: Gateways,
    tmp_path: Path,
    rounds_wanted: int = CRASH_ROUNDS,
) -> list[tuple[int, int, str, str]]:
    """Approve a refund with the Telegram button and SIGKILL the worker applying it, :data:`CRASH_ROUNDS` times.

    ``before``: the decision is recorded (``approved``) and the worker is inside the gateway's re-validation of the
    approved call (the test tool's validator blocks 1 s on a switch), nothing claimed yet. Else: the tool's effect is
    done (counted), its result not recorded (the tool waits 1 s on a switch). Each round is a new session; another
    worker takes the turn over. Returns per round ``(executions, effects in doubt, approval status, answer)``.
    """
    env, gateway, pool = await start(base_env, fake, tool_pools, gateways, tmp_path)
    control = control_of(env, async_redis)
    rounds: list[tuple[int, int, str, str]] = []
    for session in range(rounds_wanted):
        ref = f"crash-{session}"
        await pool.ready(timeout=30)
        await ask_refund(gateway, session, ref)
        approval_id = await approval_of(async_redis, session)
        found = await buttons(fake, session)
        key = (await record(async_redis, session, approval_id)).request.idempotency_key  # type: ignore[union-attr]
        switch = PAUSE_VALIDATE if before else PAUSE_EFFECT
        await async_redis.set(switch, PAUSE_S)
        try:
            assert await press(gateway, fake, found) == 200
            if before:
                await wait_until(
                    reaches(async_redis, session, approval_id, "approved"),
                    "the approval approved",
                    timeout=20,
                    interval=0.01,
                )
            else:
                await wait_until(ran(sync_redis, ref, 1), "the refund run once", timeout=20, interval=0.01)
            slot = await holder(async_redis, pool, session)
            victim = pool.worker_id(slot)
            pool.kill(slot)
        finally:
            await async_redis.delete(switch)
        claimed = await async_redis.get(SessionKeys(key_of(session)).effect(key))
        at_kill = executions(sync_redis, "refund", ref)
        if before:
            assert claimed is None and at_kill == 0, (claimed, at_kill)  # the kill landed before the tool
        else:
            assert claimed is not None and b'"started"' in claimed and at_kill == 1, (claimed, at_kill)
        await wait_until(reaches(async_redis, session, approval_id, "executed", "refused"), timeout=40, what="settled")
        await wait_until(lambda: settled(async_redis), timeout=30, what="the re-run completed")
        answer = await said(fake, session, "refund")
        runs = [e for e in await event_log(async_redis, session) if e["kind"] == "run_started"]
        assert runs[-1]["worker"] != victim  # another worker took the turn over
        doubts = {d.key for d in await control.effects_in_doubt(EVERYONE) if d.session == key_of(session)}
        assert doubts <= {key}
        status = await status_of(async_redis, session, approval_id)
        rounds.append((executions(sync_redis, "refund", ref), len(doubts), status, answer))
    where = "before the tool ran" if before else "while the tool ran (effect done)"
    print(f"\n[R8 crash between approval and execution, {where}]\n  " + "\n  ".join(map(repr, rounds)))
    return rounds


async def test_a_crash_after_the_decision_before_the_tool_runs_executes_it_once(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
    fake: FakeTelegram,
    tool_pools: Pools,
    gateways: Gateways,
    tmp_path: Path,
) -> None:
    """Issue #11: crash between approval and execution → it executes exactly once after another worker takes over.

    Three SIGKILLs of the worker that has just recorded the approval, before the tool ran (:func:`crash_rounds`):
    the other worker re-runs the turn, finds the approval ``approved``, executes it once and the model reports it.
    """
    rounds = await crash_rounds(True, base_env, async_redis, sync_redis, fake, tool_pools, gateways, tmp_path)
    for runs, doubts, status, answer in rounds:
        assert runs == 1 and doubts == 0 and status == "executed", (runs, doubts, status)
        assert "refund returned" in answer, answer


async def test_a_crash_while_the_approved_tool_runs_never_repeats_it(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
    fake: FakeTelegram,
    tool_pools: Pools,
    gateways: Gateways,
    tmp_path: Path,
) -> None:
    """Issue #11 for approved calls: a kill while the approved tool runs (effect done, result not recorded) →
    not executed again after the takeover, routed to reconciliation. Three SIGKILLs (:func:`crash_rounds`)."""
    rounds = await crash_rounds(False, base_env, async_redis, sync_redis, fake, tool_pools, gateways, tmp_path)
    for runs, doubts, _, _ in rounds:
        assert runs == 1 and doubts == 1, (runs, doubts)  # 0 re-executions, in reconciliation


async def test_after_a_crash_while_the_approved_tool_ran_the_user_is_not_told_it_did_not_happen(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
    fake: FakeTelegram,
    tool_pools: Pools,
    gateways: Gateways,
    tmp_path: Path,
) -> None:
    """The same crash as above: the refund happened once; what the model is told (and says) must not deny it, and
    the approval must not be recorded as refused. One round (the three above show the same)."""
    rounds = await crash_rounds(False, base_env, async_redis, sync_redis, fake, tool_pools, gateways, tmp_path, 1)
    for runs, _, status, answer in rounds:
        assert runs == 1
        assert "did not run" not in answer and "may already have happened" in answer, answer
        assert status != "refused", status


async def _is(client: aioredis.Redis, session: int, approval_id: str, *statuses: str) -> bool:
    return await status_of(client, session, approval_id) in statuses


def reaches(client: aioredis.Redis, session: int, approval_id: str, *statuses: str) -> Callable[[], Awaitable[bool]]:
    """A :func:`wait_until` predicate: the approval's status is one of ``statuses``."""
    return lambda: _is(client, session, approval_id, *statuses)


def ran(client: redis.Redis, ref: str, times: int) -> Callable[[], bool]:
    """A :func:`wait_until` predicate: ``refund`` ran ``times`` times for ``ref``."""
    return lambda: executions(client, "refund", ref) == times


CLICK_SESSIONS = 10
APPROVE_CLICKS = 8
DENY_CLICKS = 4
APPROVE_COMMANDS = 4


async def test_concurrent_clicks_make_one_decision_and_at_most_one_execution(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
    fake: FakeTelegram,
    tool_pools: Pools,
    gateways: Gateways,
    tmp_path: Path,
) -> None:
    """1,000 races of approve/deny/expire on one approval id: exactly one decision applied, none after a deny.

    Through the real stack: 10 sessions, each with a pending refund, get 18 decisions posted at once — 8 approve taps,
    4 deny taps (signed ``callback_query`` webhooks, each its own update), 4 ``/approve ID`` commands, an operator's
    approve and deny through :class:`ControlService` — 180 decisions, all sessions at the same time. (The store's
    compare-and-set under 1,000 direct races is tests/queue/test_approvals.py.)
    """
    env, gateway, _ = await start(base_env, fake, tool_pools, gateways, tmp_path, workers=3)
    control = control_of(env, async_redis)
    approvals: dict[int, str] = {}
    for session in range(CLICK_SESSIONS):
        await ask_refund(gateway, session, f"race-{session}")
    for session in range(CLICK_SESSIONS):
        approvals[session] = await approval_of(async_redis, session)
    offers = {s: await buttons(fake, s) for s in range(CLICK_SESSIONS)}

    async def console(session: int, verdict: str) -> str:
        try:
            await control.decide(EVERYONE, key_of(session), approvals[session], verdict)
        except ControlError as err:
            return type(err).__name__
        return "accepted"

    posts: list[Any] = []
    for session, found in offers.items():
        updates = [click(fake, found, found.approve) for _ in range(APPROVE_CLICKS)]
        updates += [click(fake, found, found.deny) for _ in range(DENY_CLICKS)]
        updates += [command(f"/approve {approvals[session]}", session) for _ in range(APPROVE_COMMANDS)]
        posts += [post_update(gateway, u) for u in updates]
        posts += [console(session, "approve"), console(session, "deny")]
    started = time.monotonic()
    answers = await asyncio.gather(*posts)
    await wait_until(lambda: settled(async_redis), timeout=60, what="every decision handled")
    wall = time.monotonic() - started
    results: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for session, approval_id in approvals.items():
        facts = await decided(async_redis, session, approval_id)
        applied = [f for f in facts if f["result"] == "applied"]
        results.update(f["result"] for f in facts)
        final = await status_of(async_redis, session, approval_id)
        outcomes[final] += 1
        ran = executions(sync_redis, "refund", f"race-{session}")
        assert len(applied) == 1, facts  # exactly one decision applied per id
        assert {f["result"] for f in facts} <= {"applied", "already_decided"}, facts
        assert final == ("executed" if applied[0]["verdict"] == "approve" else "denied"), final
        assert ran == (1 if final == "executed" else 0), (final, ran)  # 0 executions after a deny
    print(
        f"\n[R8 concurrent decisions] {len(posts)} decisions on {CLICK_SESSIONS} approvals in {wall:.1f}s: "
        f"webhook/console answers {dict(Counter(str(a) for a in answers))}; decisions recorded {dict(results)}; "
        f"final {dict(outcomes)}"
    )
    assert all(a in (200, "accepted", "InvalidRequestError") for a in answers), answers
    assert results["applied"] == CLICK_SESSIONS
    assert sum(results.values()) == answers.count(200) + answers.count("accepted")  # every decision was judged


EXPIRY_S = 10
"""The policy's minimum expiry."""
EXPIRY_SESSIONS = 4


async def test_approve_after_expiry_is_refused_and_the_model_tells_the_user(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
    fake: FakeTelegram,
    tool_pools: Pools,
    gateways: Gateways,
    tmp_path: Path,
) -> None:
    """Issue #11: approve after expiry → refused, and the model tells the user; 0 executions (none after expiry).

    Four sessions ask for a refund under a 10 s expiry (the policy's minimum) and nobody decides; the reaper's
    expiry sweep decides ``expire``; the model answers that it did not happen. Then each user taps approve (and one
    also sends ``/approve ID``): refused with the fixed notice, nothing runs.
    """
    _, gateway, _ = await start(base_env, fake, tool_pools, gateways, tmp_path, expiry_s=EXPIRY_S)
    for session in range(EXPIRY_SESSIONS):
        await ask_refund(gateway, session, f"late-{session}")
    approvals = {s: await approval_of(async_redis, s) for s in range(EXPIRY_SESSIONS)}
    offers = {s: await buttons(fake, s) for s in range(EXPIRY_SESSIONS)}
    told = {s: await said(fake, s, "expired", timeout=EXPIRY_S + 20) for s in range(EXPIRY_SESSIONS)}
    for found in offers.values():
        assert await press(gateway, fake, found) == 200
    assert await post_update(gateway, command(f"/approve {approvals[0]}", 0)) == 200
    notices = {s: await said(fake, s, "expired before it was decided") for s in range(EXPIRY_SESSIONS)}
    await wait_until(lambda: settled(async_redis), timeout=30, what="every click handled")
    await wait_until(
        lambda: len([t for t in texts(fake, 0) if "expired before" in t]) == 2,
        "two 'expired before' notices",
        timeout=20,
    )
    for session, approval_id in approvals.items():
        facts = await decided(async_redis, session, approval_id)
        applied = [f for f in facts if f["result"] == "applied"]
        assert len(applied) == 1 and applied[0]["verdict"] == "expire", facts
        assert await status_of(async_redis, session, approval_id) == "expired"
        assert executions(sync_redis, "refund", f"late-{session}") == 0
        assert "did not run" in told[session] or "did not happen" in told[session], told[session]
    print(f"\n[R8 expiry] model told: {told[0][:120]!r}; later approve: {notices[0]!r}")


async def _tamper(client: aioredis.Redis, session: int, approval_id: str, *, rehash: bool) -> None:
    """Rewrite the stored record's refund amount, as someone with write access to Redis could (and the action hash
    with it when ``rehash``)."""
    where = SessionKeys(key_of(session)).approval(approval_id)
    raw = await client.hget(where, "record")
    assert raw is not None
    body = json.loads(raw)
    body["request"]["arguments"]["amount"] = 15_000
    if rehash:
        body["request"]["action_sha256"] = action_sha256("refund", body["request"]["arguments"])
    await client.hset(where, "record", json.dumps(body))


async def test_a_payload_changed_after_approval_is_refused(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
    fake: FakeTelegram,
    tool_pools: Pools,
    gateways: Gateways,
    tmp_path: Path,
) -> None:
    """Issue #11: payload changed after approval → refused, nothing executed.

    Session 0: the amount in the stored record is changed while the approval is pending, then the user approves.
    Sessions 1-2: the user approves, the worker applying it is SIGKILLed before the tool runs (as in the crash test),
    the amount is changed in the stored record meanwhile, and another worker takes over. Each is refused
    (``approval_mismatch``), the model says it did not happen, and nothing ran.
    """
    _, gateway, pool = await start(base_env, fake, tool_pools, gateways, tmp_path)
    for session in range(3):
        ref = f"tamper-{session}"
        await pool.ready(timeout=30)
        await ask_refund(gateway, session, ref)
        approval_id = await approval_of(async_redis, session)
        found = await buttons(fake, session)
        if session == 0:
            await _tamper(async_redis, session, approval_id, rehash=False)
            assert await press(gateway, fake, found) == 200
        else:
            await async_redis.set(PAUSE_VALIDATE, PAUSE_S)
            try:
                assert await press(gateway, fake, found) == 200
                await wait_until(
                    reaches(async_redis, session, approval_id, "approved"), "the approval approved", timeout=20
                )
                pool.kill(await holder(async_redis, pool, session))
            finally:
                await async_redis.delete(PAUSE_VALIDATE)
            await _tamper(async_redis, session, approval_id, rehash=False)
        await wait_until(
            reaches(async_redis, session, approval_id, "refused", "executed"),
            "the approval refused or executed",
            timeout=40,
        )
        answer = await said(fake, session, "did not run")
        settled_facts = [e for e in await event_log(async_redis, session) if e["kind"] == "approval_settled"]
        assert await status_of(async_redis, session, approval_id) == "refused"
        assert settled_facts[-1]["reason"] == "approval_mismatch", settled_facts
        assert executions(sync_redis, "refund", ref) == 0
        print(f"\n[R8 tamper {session}] {answer[:140]!r}")


async def test_a_record_rewritten_with_a_matching_hash_is_refused(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
    fake: FakeTelegram,
    tool_pools: Pools,
    gateways: Gateways,
    tmp_path: Path,
) -> None:
    """The stored request's amount *and* its action hash are rewritten (consistently) while pending; the user taps
    the approve button they were shown (150). The refund of 15,000 must not run: the approver never saw it."""
    _, gateway, _ = await start(base_env, fake, tool_pools, gateways, tmp_path, workers=1)
    await ask_refund(gateway, 0, "rewritten")
    approval_id = await approval_of(async_redis, 0)
    found = await buttons(fake, 0)
    await _tamper(async_redis, 0, approval_id, rehash=True)
    assert await press(gateway, fake, found) == 200
    await wait_until(
        lambda: _is(async_redis, 0, approval_id, "refused", "executed"), "the approval refused or executed", timeout=30
    )
    assert executions(sync_redis, "refund", "rewritten") == 0
    assert await status_of(async_redis, 0, approval_id) == "refused"


PROGRAM_SESSIONS = 3


async def test_a_program_paused_at_a_gated_call_resumes_on_another_worker_after_a_kill(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
    fake: FakeTelegram,
    tool_pools: Pools,
    gateways: Gateways,
    tmp_path: Path,
) -> None:
    """Issue #11: a worker killed while a CodeAct program is paused at a gated call → after approval the program
    resumes on another worker from the snapshot and finishes.

    Three sessions run ``tick; refund; tick`` (``tick`` is a read: never claimed, so a program run again from its
    start would tick again). Each pauses at ``refund``; the worker that ran it is SIGKILLed; the user approves; another
    worker resumes the program: refund runs once, the first tick is not repeated (ticks 1 then 2), and the model
    reports what the program printed.
    """
    _, gateway, pool = await start(base_env, fake, tool_pools, gateways, tmp_path, codeact=True)
    for session in range(PROGRAM_SESSIONS):
        ref = f"prog-{session}"
        await pool.ready(timeout=30)
        text = PROGRAM.replace("REF", ref)
        update = make_update(text, chat_id=chat_of(session), update_id=next_update_id())
        assert await post_update(gateway, update) == 200
        approval_id = await approval_of(async_redis, session)
        found = await buttons(fake, session)
        await wait_until(lambda: settled(async_redis), timeout=30, what="the paused turn ended (its slot freed)")
        paused = await record(async_redis, session, approval_id)
        assert paused.program is not None and executions(sync_redis, "tick", ref) == 1
        assert executions(sync_redis, "refund", ref) == 0
        ran_by = [e["worker"] for e in await event_log(async_redis, session) if e["kind"] == "run_started"][-1]
        slot = pool.slot_of(ran_by)
        assert slot is not None
        pool.kill(slot)
        assert await press(gateway, fake, found) == 200
        answer = await said(fake, session, "The program printed")
        resumed_by = [e["worker"] for e in await event_log(async_redis, session) if e["kind"] == "run_started"][-1]
        assert resumed_by != ran_by
        assert "refunded 150 ticks 1 2" in answer, answer
        assert executions(sync_redis, "refund", ref) == 1
        assert executions(sync_redis, "tick", ref) == 2
        assert await status_of(async_redis, session, approval_id) == "executed"
        print(f"\n[R8 program {session}] paused on {ran_by} (killed), resumed on {resumed_by}: {answer[:100]!r}")


OTHER_SESSIONS = 4


async def test_decisions_by_another_session_user_or_tenant_are_all_rejected(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
    fake: FakeTelegram,
    tool_pools: Pools,
    gateways: Gateways,
    tmp_path: Path,
) -> None:
    """Decisions by a user of another session or tenant are rejected 100%.

    Four sessions with a pending refund. Against each approval: the other three sessions' users send ``/approve ID``
    and tap a forged button carrying its option (``callback_query`` in their own chat); another user taps the real
    button in its chat (a group member who is not the requester); an operator of another tenant approves through
    :class:`ControlService`. All are rejected and nothing runs; then each requester approves, and each refund runs
    once (the rejections were not for want of a working path).
    """
    env, gateway, _ = await start(base_env, fake, tool_pools, gateways, tmp_path)
    control = control_of(env, async_redis)
    outsider = OperatorScope(operator="console:mallory", tenants=frozenset({"globex"}))
    for session in range(OTHER_SESSIONS):
        await ask_refund(gateway, session, f"other-{session}")
    approvals = {s: await approval_of(async_redis, s) for s in range(OTHER_SESSIONS)}
    offers = {s: await buttons(fake, s) for s in range(OTHER_SESSIONS)}
    attempts: Counter[str] = Counter()
    rejected: Counter[str] = Counter()
    for target, approval_id in approvals.items():
        for other in (s for s in range(OTHER_SESSIONS) if s != target):
            assert await post_update(gateway, command(f"/approve {approval_id}", other)) == 200
            attempts["another session: /approve ID"] += 1
            forged = click(fake, offers[other], offers[other].approve)
            forged["callback_query"]["data"] = offers[target].approve
            with contextlib.suppress(KeyError):
                assert await post_update(gateway, forged) == 200
                attempts["another session: forged button"] += 1
        stranger = click(fake, offers[target], offers[target].approve, user_id=777_000 + target)
        assert await post_update(gateway, stranger) == 200
        attempts["another user: real button"] += 1
        attempts["another tenant: console"] += 1
        try:
            await control.decide(outsider, key_of(target), approval_id, "approve")
        except OutOfScopeError:
            rejected["another tenant: console"] += 1
    await wait_until(lambda: settled(async_redis), timeout=60, what="every attempt handled")
    for target, approval_id in approvals.items():
        facts = await decided(async_redis, target, approval_id)
        assert [f["result"] for f in facts] == ["not_allowed"], facts  # only the stranger reached the record
        rejected["another user: real button"] += 1
        assert await status_of(async_redis, target, approval_id) == "pending"
        assert executions(sync_redis, "refund", f"other-{target}") == 0
    for other in range(OTHER_SESSIONS):  # each foreign id is unknown in the session it was sent to
        rejected["another session"] += len([t for t in texts(fake, other) if "don't know that approval" in t])
    attempts["another session"] = attempts.pop("another session: /approve ID") + attempts.pop(
        "another session: forged button", 0
    )
    print(f"\n[R8 other session/user/tenant] attempts {dict(attempts)}; rejected {dict(rejected)}")
    assert rejected == attempts
    for found in offers.values():
        assert await press(gateway, fake, found) == 200
    for session in offers:
        await wait_until(ran(sync_redis, f"other-{session}", 1), "the other session's refund run once", timeout=30)
    await wait_until(lambda: settled(async_redis), "every session settled", timeout=30)
    assert all(executions(sync_redis, "refund", f"other-{s}") == 1 for s in offers)
    assert await doubts_of(async_redis, "default") == 0
