"""Issue #18 (12): a worker SIGKILLed anywhere in an approved call's crash window → the effect once, and the answer.

Real worker processes (:mod:`tests.chaos.toolworker`: the product's worker with a gated ``refund`` counted in Redis
from outside), the real web tier, the fake Bot API, signed Telegram webhooks, the offline model. Each round asks for a
refund in a new session — a ``/tool`` call, or a ``/run`` CodeAct program that ticks, refunds, ticks again and prints
— taps approve, and SIGKILLs the worker applying the approval at one point of the window, held there by a test switch
of the tool worker:

- ``decided``: the approval is recorded ``approved``, the approved call is being re-validated (nothing claimed);
- ``claimed``: the gateway claimed the call's idempotency key, the tool has not done its effect;
- ``effect``: the effect is done (counted), its result not recorded;
- ``recorded``: the result is recorded under the key, the approval not yet consumed;
- ``settled``: the approval is consumed (``executed``), the model not asked yet;
- ``model``: the final model call is under way (a slow model).

Another worker re-runs the turn. Whatever the point, the refund happened at most once (once, except at ``claimed``,
where the worker died before the effect and the call is in doubt: it is never performed again automatically), the
user gets the agent's answer exactly once — the refund's result, or for a call in doubt that it may already have
happened — and never an "already approved" notice instead.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from switchboard.channels.telegram.fake.platform import FakeTelegram, make_update
from switchboard.queue.keys import SessionKeys
from tests.waiting import wait_until

from .approvalflow import approval_of, ask_refund, buttons, next_update_id, post_update, press, record
from .harness import Gateway, chat_of, event_log, key_of, lease_holders, settled
from .test_approvals import PROGRAM, start
from .toolpool import ToolWorkerPool, tool_pools
from .toolworker import (
    PAUSE_CLAIMED,
    PAUSE_EFFECT,
    PAUSE_MODEL,
    PAUSE_SETTLE,
    PAUSE_SETTLED,
    PAUSE_VALIDATE,
    executions,
)

__all__ = ["tool_pools"]

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(150)]

HOLD_S = "1.5"
"""How long a switch holds the worker at its point: the test kills it meanwhile."""


@dataclass(frozen=True)
class Point:
    """One kill point of the window: the switch that holds the worker there, and what shows it got there."""

    name: str
    switch: str
    in_doubt: bool = False
    """The worker died between the claim and the recorded result: never run again, the user told it may have."""


POINTS = [
    Point("decided", PAUSE_VALIDATE),
    Point("claimed", PAUSE_CLAIMED, in_doubt=True),
    Point("effect", PAUSE_EFFECT, in_doubt=True),
    Point("recorded", PAUSE_SETTLE),
    Point("settled", PAUSE_SETTLED),
    Point("model", PAUSE_MODEL),
]


async def _effect_status(client: aioredis.Redis, session: int, key: str) -> str | None:
    raw = await client.get(SessionKeys(key_of(session)).effect(key))
    return str(json.loads(raw)["status"]) if raw else None


async def _approval_status(client: aioredis.Redis, session: int, approval_id: str) -> str:
    return (await record(client, session, approval_id)).status


def reached(
    point: Point, client: aioredis.Redis, sync: redis.Redis, session: int, approval_id: str, key: str, ref: str
) -> Callable[[], Awaitable[bool]]:
    """A :func:`wait_until` predicate: the worker applying the approval is held at ``point``."""

    async def there() -> bool:
        effect = await _effect_status(client, session, key)
        match point.name:
            case "decided":
                return await _approval_status(client, session, approval_id) == "approved"
            case "claimed":
                return effect == "started" and executions(sync, "refund", ref) == 0
            case "effect":
                return effect == "started" and executions(sync, "refund", ref) == 1
            case "recorded":
                return effect == "done" and await _approval_status(client, session, approval_id) == "approved"
            case _:  # settled, model: consumed; under "model" the final call (held HOLD_S) started right after
                return await _approval_status(client, session, approval_id) == "executed"

    return there


def chat_texts(fake: FakeTelegram, session: int) -> list[str]:
    """Every message in ``session``'s chat as it reads now (after the edits of a streamed reply)."""
    chat = str(chat_of(session))
    return [
        text
        for (chat_id, _), text in sorted(fake.state.messages.items(), key=lambda kv: kv[0][1])
        if str(chat_id) == chat
    ]


async def crash_round(
    point: Point,
    program: bool,
    session: int,
    gateway: Gateway,
    pool: ToolWorkerPool,
    fake: FakeTelegram,
    client: aioredis.Redis,
    sync: redis.Redis,
) -> tuple[int, str, list[str]]:
    """Ask, approve, kill the applying worker at ``point``; ``(refunds, approval status, the answers)`` once the
    re-run on another worker is done."""
    ref = f"window-{session}"
    await pool.ready(timeout=30)
    if program:
        text = PROGRAM.replace("REF", ref)
        assert (
            await post_update(gateway, make_update(text, chat_id=chat_of(session), update_id=next_update_id())) == 200
        )
    else:
        await ask_refund(gateway, session, ref)
    approval_id = await approval_of(client, session)
    found = await buttons(fake, session)
    await wait_until(lambda: settled(client), timeout=30, what="the asking turn ended")
    key = (await record(client, session, approval_id)).request.idempotency_key  # type: ignore[union-attr]
    before = len(chat_texts(fake, session))
    await client.set(point.switch, HOLD_S)
    try:
        assert await press(gateway, fake, found) == 200
        await wait_until(
            reached(point, client, sync, session, approval_id, key, ref),
            "the crash point reached",
            timeout=20,
            interval=0.01,
        )
        if point.name == "model":
            await asyncio.sleep(0.2)  # into the final model call (it takes HOLD_S), past the settlement's fact
        held = await lease_holders(client, [session])
        assert held, f"nobody holds session {session}'s lease at {point.name}"
        victim = next(iter(held))
        slot = pool.slot_of(victim)
        assert slot is not None, held
        pool.kill(slot)
    finally:
        await client.delete(point.switch)
    await wait_until(lambda: settled(client), timeout=40, what=f"the re-run after a kill at {point.name} completed")
    runs = [e for e in await event_log(client, session) if e["kind"] == "run_started"]
    assert runs[-1]["worker"] != victim, "the killed worker finished the turn: the kill missed it"
    status = await _approval_status(client, session, approval_id)
    return executions(sync, "refund", ref), status, chat_texts(fake, session)[before:]


async def test_a_kill_anywhere_in_the_crash_window_still_answers_once(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    sync_redis: redis.Redis,
    fake: FakeTelegram,
    tool_pools: Callable[[dict[str, str], int], ToolWorkerPool],
    gateways: Callable[[dict[str, str]], Gateway],
    tmp_path: Path,
) -> None:
    """Twelve rounds: the six kill points, for a direct call and for a resumed program (see the module docstring)."""
    started = time.monotonic()
    _, gateway, pool = await start(base_env, fake, tool_pools, gateways, tmp_path, codeact=True)
    report: list[str] = []
    failures: list[str] = []
    session = 0
    for program in (False, True):
        for point in POINTS:
            refunds, status, answers = await crash_round(
                point, program, session, gateway, pool, fake, async_redis, sync_redis
            )
            where = f"{'program' if program else 'call'} killed at {point.name}"
            report.append(f"{where}: refunds {refunds}, {status}, {answers!r}"[:300])
            if program:
                answered = [a for a in answers if a.startswith("The program printed") or "run_program failed" in a]
                result = "refunded 150 ticks 1 " if not point.in_doubt else "may already have happened"
            else:
                answered = [a for a in answers if a.startswith("refund returned") or a.startswith("refund failed")]
                result = "refunded: 150" if not point.in_doubt else "may already have happened"
            wanted_refunds = 0 if point.name == "claimed" else 1
            if (
                refunds != wanted_refunds
                or len(answered) != 1
                or result not in answered[0]
                or any("already approved" in a or "did not run" in a for a in answers)
            ):
                failures.append(f"{where}: refunds {refunds} (want {wanted_refunds}), answers {answers!r}")
            session += 1
    print(f"\n[approved call crash window, {time.monotonic() - started:.1f}s]\n  " + "\n  ".join(report))
    assert not failures, "\n".join(failures)
