"""The last step of a turn whose budget ran out: one call without tools, so the user always gets an answer.

When even that cannot run (no credits left for a short answer, the deadline passed, the provider failed), the
answer is a fixed text saying which budget ran out, what was done and what was not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from switchboard.core.agent.budget import MIN_ANSWER_TOKENS
from switchboard.core.agent.prompt import BUDGET_WORDS, final_request, request_tokens
from switchboard.core.agent.steering import steered_first
from switchboard.core.agent.worklog import stopped_reply
from switchboard.core.model import ModelRequest
from switchboard.errors import ModelError

if TYPE_CHECKING:
    from switchboard.core.agent.runtime import _Turn

__all__ = ["final_answer", "input_tokens"]

logger = logging.getLogger("switchboard.core.agent.runtime")


def input_tokens(request: ModelRequest) -> int:
    """The tokens of a request's input (system, messages, tool specs), as the budget counts them."""
    return request_tokens(request.system, request.messages, request.tools)


async def final_answer(turn: _Turn, hard: float) -> None:
    """One last call without tools, so the user always gets an answer; a fixed text if even that fails."""
    assert turn.prompt is not None
    reason = turn.stopped_by or "steps"
    request = final_request(
        turn.prompt,
        turn.model,
        *steered_first(turn.messages, turn.opening),
        reason=reason,
        summary=turn.budget.summary(),
        max_output_tokens=turn.agent.limits.max_output_tokens,
        budget_tokens=turn.agent.limits.max_input_tokens,
    )
    step = turn.budget.steps + 1
    affordable = turn.budget.affordable_output_tokens(turn.spec, input_tokens(request), request.max_output_tokens)
    if affordable < MIN_ANSWER_TOKENS:  # not even a short answer fits the credits left: the fixed reply
        logger.info("no credits left for the final answer of a turn; sending a fixed reply")
        if not turn.output.text.strip():
            await turn.output.write(_fallback(turn, reason), step)
        return
    request = request.model_copy(update={"max_output_tokens": affordable})
    started = time.perf_counter()
    timeout = asyncio.timeout_at(hard)
    try:
        async with timeout:
            decision, usage = await turn._step(request, step)
    except TimeoutError:
        if not timeout.expired():
            raise
        logger.info("the final answer of a turn ran past the deadline; sending a fixed reply")
    except ModelError as err:
        logger.warning("the final answer of a turn failed (%s); sending a fixed reply", err.code or "error")
    else:
        cost = turn.budget.charge_model(turn.spec, *usage)
        await turn._step_event(decision, usage, cost, started, final=reason)
    if not turn.output.text.strip():
        await turn.output.write(_fallback(turn, reason), step)


def _fallback(turn: _Turn, reason: str) -> str:
    return stopped_reply(BUDGET_WORDS.get(reason, reason), turn.messages[turn.opening :], turn.budget.tool_calls)
