"""``switchboard approvals|reconcile|dead-letters|takeover|say|handback``: the operators' commands.

They run over the same control service the console uses (:mod:`switchboard.control`), from any terminal that
reaches the Redis.

The CLI sees every tenant; what it does is signed by the operator's principal ``console:<name>`` (``--operator``,
by default the login name), so a decision from the CLI counts where the policy lets operators decide.
"""

from __future__ import annotations

import getpass
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from switchboard.settings import Settings

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from switchboard.control import ControlService, OperatorScope

__all__ = ["control_command", "operator_principal"]


def operator_principal(name: str | None) -> str:
    """``console:<name>`` for ``--operator NAME`` (a principal given whole is kept), else the login name's."""
    chosen = (name or "").strip() or _login()
    return chosen if chosen.startswith("console:") else f"console:{chosen}"


def _login() -> str:
    try:
        return getpass.getuser() or "cli"
    except (OSError, KeyError):
        return "cli"


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"


def control_command(
    settings: Settings, command: str, action: str, targets: list[str], *, operator: str | None, show_all: bool
) -> int:
    """Run one operator command (``approvals list``, ``takeover SESSION``, ...); returns the exit code."""
    from switchboard.cli.sessions import redis_url_for, with_redis
    from switchboard.control import ControlError, ControlService, OperatorScope
    from switchboard.queue.ingest import Ingestor

    url = redis_url_for(settings)
    scope = OperatorScope.everything(operator_principal(operator))

    async def go(redis: aioredis.Redis) -> int:
        try:
            service = ControlService(redis, settings, Ingestor(redis, settings.queue))
            run = _commands(service, scope, targets, show_all).get((command, action))
            if run is None:
                print(f"switchboard: unknown command {command} {action}", file=sys.stderr)
                return 2
            await run()
            return 0
        except ControlError as err:
            print(f"switchboard: {err}", file=sys.stderr)
            return 1

    return with_redis(url, go)


def _commands(
    service: ControlService, scope: OperatorScope, targets: list[str], show_all: bool
) -> dict[tuple[str, str], Callable[[], Awaitable[None]]]:
    async def approvals_list() -> None:
        records = await service.approvals(scope, limit=1000)
        if not records:
            print("no pending approvals")
        for r in records:
            what = r.request.tool if r.request is not None else "reply"
            print(
                f"{r.id}  {r.session}  {what}  requested_by={r.requested_by}  expires={_when(r.expires_at)}  "
                f"reason={r.request.reason if r.request is not None else 'review'}"
            )

    async def decide(verdict: str) -> None:
        record = await service.find_approval(scope, targets[0])
        accepted = await service.decide(scope, record.session, record.id, verdict)
        done = "already sent" if accepted.duplicate else "sent"
        print(f"{verdict} of {record.id} {done} to {record.session}; the worker applies it in order")

    async def reconcile_list() -> None:
        doubts = await service.effects_in_doubt(scope, include_resolved=show_all)
        if not doubts:
            print("no effects awaiting reconciliation")
        for d in doubts:
            state = f"resolved={d.resolution} by {d.resolved_by}" if d.resolution else "in doubt"
            print(f"{d.session}  {d.key}  tool={d.tool}  run={d.run_id}  since={_when(d.at)}  {state}")

    async def reconcile_resolve() -> None:
        session, key, outcome = targets
        view = await service.resolve_effect(scope, session, key, outcome)
        print(f"effect {view.key} of {view.session} marked {view.resolution} by {view.resolved_by}")

    async def dead_list() -> None:
        letters = await service.dead_letters(scope, limit=1000)
        if not letters:
            print("no dead letters")
        for d in letters:
            again = "  (requeued)" if d.requeued else ""
            print(f"{d.id}  {d.session}  {_when(d.at)}  attempts={d.attempts}  reason={d.reason}{again}")

    async def dead_requeue() -> None:
        accepted = await service.requeue(scope, targets[0], targets[1])
        fresh = sum(not a.duplicate for a in accepted)
        print(f"requeued {fresh} message(s) into {targets[0]}" if fresh else "already requeued")

    async def take_over() -> None:
        await service.take_over(scope, targets[0])
        print(f"take-over of {targets[0]} sent; the agent pauses once the worker applies it")

    async def say() -> None:
        await service.say(scope, targets[0], targets[1])
        print(f"message sent to {targets[0]}")

    async def hand_back() -> None:
        await service.hand_back(scope, targets[0])
        print(f"{targets[0]} handed back to the agent")

    return {
        ("approvals", "list"): approvals_list,
        ("approvals", "approve"): lambda: decide("approve"),
        ("approvals", "deny"): lambda: decide("deny"),
        ("reconcile", "list"): reconcile_list,
        ("reconcile", "resolve"): reconcile_resolve,
        ("dead-letters", "list"): dead_list,
        ("dead-letters", "requeue"): dead_requeue,
        ("takeover", "-"): take_over,
        ("say", "-"): say,
        ("handback", "-"): hand_back,
    }
