"""A CodeAct step of a turn: run the model's program, its tool calls going through the tool gateway.

Every function the program calls is a tool call through the turn's ``call_tool`` (gateway, budget, events). A call
the gateway answers ``needs_approval`` pauses the program there (:class:`ProgramStep`); once approved,
:func:`resume_program_call` continues it in any worker with the call's outcome.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from switchboard.core.agent.budget import Budget
from switchboard.core.agent.programs import PausedProgram, ProgramResult
from switchboard.core.agent.prompt import BUDGET_WORDS, RUN_PROGRAM
from switchboard.core.approvals.records import ApprovalRequest
from switchboard.core.events import Event, ToolCalled
from switchboard.core.model import ToolCall
from switchboard.core.tools.definition import Tool
from switchboard.core.tools.gateway import CallScope, ToolOutcome, canonical_json, data_card
from switchboard.errors import BudgetExceededError, ToolError

__all__ = ["PARALLEL", "ProgramStep", "refusal", "resume_program_call", "run_program_call"]

CallTool = Callable[[str, dict[str, Any], str | None], Awaitable[ToolOutcome]]

PARALLEL = "parallel"
"""The program's helper running read calls at the same time: ``parallel([["tool", {args}], ...])``."""


@dataclass(frozen=True)
class ProgramStep:
    """How a program step ended: the tool message content, or a pause at a call waiting for approval."""

    content: str
    ok: bool
    paused: PausedProgram | None = None
    """The program, stopped at the gated call (not made)."""
    approval: ApprovalRequest | None = None
    """What the gateway asks a person to approve (with :attr:`paused`)."""


def refusal(tool: str, message: str, *, error_class: str = "budget") -> str:
    """A tool message saying a call was not run (or failed), as the gateway words failures."""
    return ToolOutcome(tool=tool, ok=False, error=message, error_class=error_class).for_model()


class _ProgramCalls:
    """The program's tool calls: metered, through the gateway; a gated call pauses the program."""

    def __init__(
        self,
        budget: Budget,
        tool_of: Callable[[str], Tool | None],
        scope: CallScope,
        call_tool: CallTool,
        parallel_reads: int = 1,
    ):
        self.budget, self.tool_of, self.scope, self.call_tool = budget, tool_of, scope, call_tool
        self.parallel_reads = max(1, parallel_reads)
        self.gated: ApprovalRequest | None = None

    async def __call__(self, name: str, args: dict[str, Any]) -> Any:
        from switchboard.core.agent import codeact

        if name == PARALLEL and self.tool_of(PARALLEL) is None:
            return await self.parallel(args.get("calls"))
        tool = self.tool_of(name)
        if not self.budget.can_afford_tool(tool.cost if tool is not None else 0):
            ran_out = "tool_calls" if self.budget.tool_calls_left <= 0 else "credits"
            raise BudgetExceededError(f"the {BUDGET_WORDS[ran_out]} budget of this turn ran out", budget=ran_out)
        outcome = await self.call_tool(name, args, None)
        if outcome.error_class == "needs_approval" and outcome.approval is not None:
            self.gated = outcome.approval
            raise codeact.PauseProgram(name)
        return self.value(outcome)

    async def parallel(self, given: Any) -> list[Any]:
        """Run read calls at the same time (at most ``parallel_reads`` at once); their results in the order given.

        A failed call, or one that needs a person's approval (not made), gives ``{"error", "error_class"}`` in its
        place; the budget is checked for every call before any starts.
        """
        calls = _parallel_calls(given)
        pending = credits = 0
        for name, _ in calls:
            tool = self.tool_of(name)
            if tool is None or tool.side_effect != "read":
                raise ToolError(f"{PARALLEL}() runs reads only: call {name}(...) on its own", error_class="validation")
            if not self.budget.can_afford_tool(tool.cost, pending_calls=pending, pending_credits=credits):
                ran_out = "tool_calls" if self.budget.tool_calls_left - pending <= 0 else "credits"
                raise BudgetExceededError(f"the {BUDGET_WORDS[ran_out]} budget of this turn ran out", budget=ran_out)
            pending, credits = pending + 1, credits + tool.cost
        bound = asyncio.Semaphore(self.parallel_reads)

        async def one(name: str, args: dict[str, Any]) -> ToolOutcome:
            async with bound:
                return await self.call_tool(name, args, None)

        async with asyncio.TaskGroup() as group:
            running = [group.create_task(one(name, args)) for name, args in calls]
        results: list[Any] = []
        for task in running:
            outcome = task.result()
            if outcome.approval is not None:
                message = f"not made: {outcome.tool} needs a person's approval; call it on its own"
                results.append({"error": message, "error_class": "needs_approval"})
            elif not outcome.ok:
                results.append({"error": outcome.error, "error_class": outcome.error_class})
            else:
                results.append(self.value(outcome))
        return results

    def value(self, outcome: ToolOutcome) -> Any:
        """The value a call returns in the program (raises its failure as a :class:`ToolError`)."""
        if not outcome.ok:
            raise ToolError(outcome.error or f"{outcome.tool} failed", error_class=outcome.error_class or "permanent")
        return self.scope.variables[outcome.variable] if outcome.variable else outcome.value


def _parallel_calls(given: Any) -> list[tuple[str, dict[str, Any]]]:
    """The ``[["tool", {args}], ...]`` list of a ``parallel()`` call (a clear error for anything else)."""
    shape = f'{PARALLEL}() takes a list of [tool name, {{arguments}}] pairs, e.g. [["search", {{"query": "x"}}]]'
    if not isinstance(given, list | tuple) or not given:
        raise ToolError(shape, error_class="validation")
    calls: list[tuple[str, dict[str, Any]]] = []
    for item in given:
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise ToolError(shape, error_class="validation")
        name, args = item
        if not isinstance(name, str) or not isinstance(args, dict):
            raise ToolError(shape, error_class="validation")
        calls.append((name, {str(key): value for key, value in args.items()}))
    return calls


async def run_program_call(
    call: ToolCall,
    *,
    budget: Budget,
    tools: Sequence[Tool],
    tool_of: Callable[[str], Tool | None],
    scope: CallScope,
    slots: Mapping[str, Any],
    inline_bytes: int,
    call_tool: CallTool,
    event: Callable[[Event], Awaitable[None]],
    message_id: str | None,
    parallel_reads: int = 1,
) -> ProgramStep:
    """Run the program of a ``run_program`` call: its tool message content, or its pause at a gated call.

    ``parallel_reads`` > 1 offers the program :data:`PARALLEL` (unless a tool has that name).
    """
    code = call.arguments.get("code")
    if not isinstance(code, str) or not code.strip():
        content = refusal(RUN_PROGRAM, "run_program needs a non-empty `code` string", error_class="validation")
        return ProgramStep(content, False)
    try:
        from switchboard.core.agent import codeact
    except ImportError:  # pragma: no cover - depends on the tree
        return ProgramStep(
            refusal(RUN_PROGRAM, "programs are not available in this build", error_class="permanent"), False
        )

    started = time.perf_counter()
    budget.charge_tool(0)
    limits = codeact.ProgramLimits(
        max_duration_s=max(0.1, min(5.0, budget.remaining_s())),
        max_calls=max(1, budget.tool_calls_left),
    )
    calls = _ProgramCalls(budget, tool_of, scope, call_tool, parallel_reads)
    names, params = [t.name for t in tools], codeact.tool_params(tools)
    if parallel_reads > 1 and PARALLEL not in names:
        names, params = [*names, PARALLEL], {**params, PARALLEL: ["calls"]}
    result = await codeact.run_program(
        code,
        call_tool=calls,
        tool_names=names,
        inputs={**slots, **scope.variables},
        limits=limits,
        tool_params=params,
    )
    return await _ended(result, calls, scope, inline_bytes, event, message_id, call.id, started)


async def resume_program_call(
    paused: PausedProgram,
    outcome: ToolOutcome,
    *,
    call_id: str,
    budget: Budget,
    tool_of: Callable[[str], Tool | None],
    scope: CallScope,
    inline_bytes: int,
    call_tool: CallTool,
    event: Callable[[Event], Awaitable[None]],
    message_id: str | None,
) -> ProgramStep:
    """Continue a program paused at a call, now that the call's ``outcome`` is known; it may pause again."""
    from switchboard.core.agent import codeact

    started = time.perf_counter()
    calls = _ProgramCalls(budget, tool_of, scope, call_tool)
    try:
        value, error = calls.value(outcome), None
    except ToolError as err:  # the program sees the approved call's failure as it would have (it may catch it)
        value, error = None, err
    result = await codeact.resume_program(paused, value, error=error, call_tool=calls)
    return await _ended(result, calls, scope, inline_bytes, event, message_id, call_id, started)


async def _ended(
    result: ProgramResult,
    calls: _ProgramCalls,
    scope: CallScope,
    inline_bytes: int,
    event: Callable[[Event], Awaitable[None]],
    message_id: str | None,
    call_id: str,
    started: float,
) -> ProgramStep:
    paused = result.paused is not None and calls.gated is not None
    body: dict[str, Any] = {"output": result.output, "calls": result.calls}
    if paused:
        pass
    elif result.error is not None:
        body["error"] = result.error
    else:
        encoded = canonical_json(result.value)
        if len(encoded.encode()) > inline_bytes:
            variable = scope.bind(result.value)
            body["value"] = {"card": data_card(result.value, size_bytes=len(encoded)), "variable": variable}
        else:
            body["value"] = result.value
    await event(
        ToolCalled(
            message_id=message_id,
            tool=RUN_PROGRAM,
            ok=paused or result.error is None,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
            call_id=call_id,
            error_class="needs_approval" if paused else None if result.error is None else "program",
        )
    )
    if paused:
        return ProgramStep(canonical_json(body), True, result.paused, calls.gated)
    return ProgramStep(canonical_json(body), result.error is None)
