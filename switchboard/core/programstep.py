"""A CodeAct step of a turn: run the model's program, its tool calls going through the tool gateway.

The program runs in Monty (:mod:`switchboard.core.codeact`) with the session-state slots and the turn's
large earlier results as inputs; every function it calls is a tool call made through the turn's
``call_tool`` (gateway, budget, events), and its value comes back tiered like any tool result.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from switchboard.core.budget import Budget
from switchboard.core.events import Event, ToolCalled
from switchboard.core.gateway import CallScope, ToolOutcome, canonical_json, data_card
from switchboard.core.model import ToolCall
from switchboard.core.prompt import BUDGET_WORDS, RUN_PROGRAM
from switchboard.core.tools import Tool
from switchboard.errors import BudgetExceededError, ToolError

__all__ = ["refusal", "run_program_call"]


def refusal(tool: str, message: str, *, error_class: str = "budget") -> str:
    """A tool message saying a call was not run (or failed), as the gateway words failures."""
    return ToolOutcome(tool=tool, ok=False, error=message, error_class=error_class).for_model()


async def run_program_call(
    call: ToolCall,
    *,
    budget: Budget,
    tools: Sequence[Tool],
    tool_of: Callable[[str], Tool | None],
    scope: CallScope,
    slots: Mapping[str, Any],
    inline_bytes: int,
    call_tool: Callable[[str, dict[str, Any], str | None], Awaitable[ToolOutcome]],
    event: Callable[[Event], Awaitable[None]],
    message_id: str | None,
) -> tuple[str, bool]:
    """Run the program of a ``run_program`` call; returns the tool message content and whether it succeeded."""
    code = call.arguments.get("code")
    if not isinstance(code, str) or not code.strip():
        return refusal(RUN_PROGRAM, "run_program needs a non-empty `code` string", error_class="validation"), False
    try:
        from switchboard.core import codeact
    except ImportError:  # pragma: no cover - depends on the tree
        return refusal(RUN_PROGRAM, "programs are not available in this build", error_class="permanent"), False

    async def program_tool(name: str, args: dict[str, Any]) -> Any:
        tool = tool_of(name)
        if not budget.can_afford_tool(tool.cost if tool is not None else 0):
            ran_out = "tool_calls" if budget.tool_calls_left <= 0 else "credits"
            raise BudgetExceededError(f"the {BUDGET_WORDS[ran_out]} budget of this turn ran out", budget=ran_out)
        outcome = await call_tool(name, args, None)
        if not outcome.ok:
            raise ToolError(outcome.error or f"{name} failed", error_class=outcome.error_class or "permanent")
        return scope.variables[outcome.variable] if outcome.variable else outcome.value

    started = time.perf_counter()
    budget.charge_tool(0)
    limits = codeact.ProgramLimits(
        max_duration_s=max(0.1, min(5.0, budget.remaining_s())),
        max_calls=max(1, budget.tool_calls_left),
    )
    result = await codeact.run_program(
        code,
        call_tool=program_tool,
        tool_names=[t.name for t in tools],
        inputs={**slots, **scope.variables},
        limits=limits,
        tool_params=codeact.tool_params(tools),
    )
    body: dict[str, Any] = {"output": result.output, "calls": result.calls}
    if result.error is not None:
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
            ok=result.error is None,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
            call_id=call.id,
            error_class=None if result.error is None else "program",
        )
    )
    return canonical_json(body), result.error is None
