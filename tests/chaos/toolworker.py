"""A real ``switchboard worker`` with three test tools registered: ``python -m tests.chaos.toolworker``.

The worker is the product's own (``switchboard.cli.main.main(["worker"])``); the only difference is the tool registry,
extended the way a custom integration extends it (:meth:`ToolRegistry.register`), in every place that builds one
(start-up checks, the runtime). Each tool counts what it really did in the test's Redis under ``chaos:exec:...``
(keys of the test, not of the product), so a test reads the number of executions from outside the process:

- ``charge(ref)``: a low-risk write (allowed without asking). Its effect is an ``INCR`` of
  ``chaos:exec:charge:<ref>``; when ``ref`` starts with ``die`` it then SIGKILLs its own worker process — after the
  effect, before the gateway records the result (reliability R7, "crash between effect done and result recorded").
- ``refund(amount, ref)``: a high-risk, irreversible write (the default policy asks a person). Its effect is an
  ``INCR`` of ``chaos:exec:refund:<ref>``. Two test switches, read from Redis at the moment they matter:
  ``chaos:pause:validate`` (seconds): validating the arguments blocks the worker that long — it validates an
  approved call again before claiming it, so a kill then lands after the decision, before the tool ran;
  ``chaos:pause:effect`` (seconds): after its effect the tool waits that long before returning (a kill then lands
  while it runs, effect done, result not recorded); ``chaos:pause:claimed`` (seconds): the tool waits before its
  effect (claimed by the gateway, not done).
- ``tick(ref)``: a read (never claimed, so a re-run would repeat it): ``INCR chaos:exec:tick:<ref>``, returns the
  count. A CodeAct program resumed from its snapshot does not call it again; one re-run from the start would.

Two more switches time the rest of an approved call's crash window: ``chaos:pause:settle`` (seconds) holds the
worker just before it consumes an approval (the effect ran and is recorded; the approval is still ``approved``), and
``chaos:pause:settled`` just after (``executed``; the model has not answered); ``chaos:pause:model`` (seconds) makes
every model call that starts while it is set that slow (the offline model, from its first byte).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import redis
from pydantic import BaseModel, Field, model_validator

import switchboard.core.tools.builtin as toolbox
from switchboard.core.model import ModelEvent, ModelRequest
from switchboard.core.providers.offline import OfflineModel
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.queue.approvals import RedisApprovals

__all__ = [
    "EXEC_PREFIX",
    "PAUSE_CLAIMED",
    "PAUSE_EFFECT",
    "PAUSE_MODEL",
    "PAUSE_SETTLE",
    "PAUSE_SETTLED",
    "PAUSE_VALIDATE",
    "chaos_tools",
    "executions",
]

EXEC_PREFIX = "chaos:exec:"
PAUSE_VALIDATE = "chaos:pause:validate"
PAUSE_CLAIMED = "chaos:pause:claimed"
PAUSE_EFFECT = "chaos:pause:effect"
PAUSE_SETTLE = "chaos:pause:settle"
PAUSE_SETTLED = "chaos:pause:settled"
PAUSE_MODEL = "chaos:pause:model"

_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["SWITCHBOARD_REDIS_URL"])
    return _client


def _pause(switch: str) -> float:
    value = _redis().get(switch)
    return float(value) if value else 0.0


def executions(client: redis.Redis, tool: str, ref: str) -> int:
    """How many times ``tool`` really ran for ``ref`` (read by the test, from any process)."""
    return int(client.get(f"{EXEC_PREFIX}{tool}:{ref}") or 0)


class ChargeInput(BaseModel):
    ref: str = Field(min_length=1, max_length=64)


class RefundInput(BaseModel):
    amount: int = Field(gt=0)
    ref: str = Field(min_length=1, max_length=64)

    @model_validator(mode="after")
    def _slow(self) -> RefundInput:
        pause = _pause(PAUSE_VALIDATE)
        if pause:
            time.sleep(pause)  # blocks the worker: a kill meanwhile lands before the claim
        return self


class TickInput(BaseModel):
    ref: str = Field(min_length=1, max_length=64)


async def _charge(args: ChargeInput, ctx: ToolContext) -> dict[str, Any]:
    done = _redis().incr(f"{EXEC_PREFIX}charge:{args.ref}")
    if args.ref.startswith("die"):
        os.kill(os.getpid(), signal.SIGKILL)  # effect done, result not recorded
    return {"charged": args.ref, "execution": done}


async def _refund(args: RefundInput, ctx: ToolContext) -> dict[str, Any]:
    pause = _pause(PAUSE_CLAIMED)
    if pause:
        await asyncio.sleep(pause)
    done = _redis().incr(f"{EXEC_PREFIX}refund:{args.ref}")
    pause = _pause(PAUSE_EFFECT)
    if pause:
        await asyncio.sleep(pause)
    return {"refunded": args.amount, "ref": args.ref, "execution": done}


async def _tick(args: TickInput, ctx: ToolContext) -> dict[str, Any]:
    return {"tick": _redis().incr(f"{EXEC_PREFIX}tick:{args.ref}")}


def chaos_tools() -> list[Tool]:
    """The three tools (also used in process by the R7 store test)."""
    return [
        Tool(
            name="charge",
            description="Charge the customer once for a reference.",
            input=ChargeInput,
            fn=_charge,
            side_effect="write",
            risk="low",
        ),
        Tool(
            name="refund",
            description="Refund an amount to the customer.",
            input=RefundInput,
            fn=_refund,
            side_effect="write",
            risk="high",
            reversible=False,
            resources=lambda a: (f"refund:{a.ref}",),
        ),
        Tool(name="tick", description="Count a look at a reference.", input=TickInput, fn=_tick),
    ]


def _install() -> None:
    original = toolbox.default_registry

    def extended(**options: Any) -> ToolRegistry:
        registry = original(**options)
        for tool in chaos_tools():
            registry.register(tool, replace=True)
        return registry

    toolbox.default_registry = extended  # before switchboard.cli.worker binds the name

    settle = RedisApprovals.approval_settle

    async def paused_settle(self: RedisApprovals, approval_id: str, status: Any, outcome: Any) -> bool:
        if pause := _pause(PAUSE_SETTLE):
            await asyncio.sleep(pause)
        consumed = await settle(self, approval_id, status, outcome)
        if pause := _pause(PAUSE_SETTLED):
            await asyncio.sleep(pause)
        return consumed

    RedisApprovals.approval_settle = paused_settle  # type: ignore[method-assign]

    stream = OfflineModel.stream

    async def slow_stream(self: OfflineModel, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if pause := _pause(PAUSE_MODEL):
            await asyncio.sleep(pause)
        async for event in stream(self, request):
            yield event

    OfflineModel.stream = slow_stream  # type: ignore[method-assign]


if __name__ == "__main__":
    _install()
    from switchboard.cli.main import main

    raise SystemExit(main(["worker"]))
