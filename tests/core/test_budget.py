"""Turn budgets and credit metering."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from switchboard.core.agent.budget import Budget, PriceTable
from switchboard.core.agent.replay import RecordedStep, ReplayModel
from switchboard.core.model import Finished, ModelEvent, ToolCall, ToolCallEvent, Usage
from switchboard.core.tools.definition import ToolContext
from tests.core.turns import (
    Empty,
    MemorySink,
    MemoryStore,
    agent,
    answer_step,
    calls_step,
    make_tool,
    registry_with,
    request,
    runtime,
)

PRICES = {"offline": {"input": 2.0, "output": 10.0}, "openai:gpt-4.1": {"input": 1.0, "output": 4.0}}


def test_price_table_exact_prefix_and_unknown() -> None:
    table = PriceTable(PRICES)
    assert table.model_credits("offline", 1000, 100) == 2.0 + 1.0
    assert table.rates("openai:gpt-4.1-2025-04-14") == (1.0, 4.0)  # dated snapshot shares its family's price
    assert table.rates("openai:gpt-5") == (0.0, 0.0)
    assert PriceTable().model_credits("anything", 10**6, 10**6) == 0.0


def test_budget_narrows_agent_limits_with_the_envelope() -> None:
    now = time.time()
    req = request("x", agent_=agent(max_steps=8, max_credits=50, max_turn_tokens=5000, deadline_s=100),
                  step_budget=3, credit_budget=80, token_budget=4000, deadline_s=500)  # fmt: skip
    budget = Budget.for_turn(req, PriceTable(), now=now)
    assert (budget.max_steps, budget.max_credits, budget.max_tokens) == (3, 50, 4000)
    assert abs(budget.deadline - (now + 100)) < 1  # the agent's 100 s beat the envelope's 500 s
    loose = Budget.for_turn(request("x", deadline_s=5), PriceTable(), now=now)
    assert loose.max_tokens is None and loose.max_credits is None and loose.deadline < now + 10


def test_exhausted_names_the_budget_that_ran_out() -> None:
    now = time.time()
    budget = Budget(
        max_steps=2, max_tool_calls=1, max_tokens=100, max_credits=5, max_output_chars=10, deadline=now + 60
    )
    assert budget.exhausted(now=now) is None
    budget.charge_model("offline", 40, 10)
    assert budget.exhausted(now=now) is None and budget.can_afford_tool(1)
    budget.charge_tool(5)
    assert budget.exhausted(now=now) == "credits" and not budget.can_afford_tool(0)
    assert budget.exhausted(now=now + 61) == "deadline"
    budget.charge_model("offline", 0, 0)
    assert budget.exhausted(now=now) == "steps"
    assert budget.summary()["tool_calls"] == 1


async def test_credits_per_run_are_metered_and_reported(tmp_path: Path) -> None:
    async def write(args: Empty, ctx: ToolContext) -> Any:
        return "ok"

    registry = registry_with(make_tool("save", write, side_effect="write", cost=5))
    model = ReplayModel([calls_step(("save", {}), ("current_time", {}), step=1), answer_step("saved", step=2)])
    sink = MemorySink()
    result = await runtime(tmp_path, model=model, registry=registry, prices=PRICES).run_turn(
        request("save it", agent_=agent(tools=["save", "current_time"])), sink, MemoryStore()
    )
    # two steps: (10 in, 5 out) and (10 in, 1 out) tokens at 2 / 10 credits per 1k, plus tools 5 + 1
    expected = (20 * 2.0 + 6 * 10.0) / 1000 + 6
    assert abs(result.credits - expected) < 1e-9
    usage = sink.of("usage_metered")[0]
    assert (usage.credits, usage.steps, usage.tool_calls, usage.model) == (result.credits, 2, 2, "offline")
    assert (usage.input_tokens, usage.output_tokens) == (result.input_tokens, result.output_tokens) == (20, 6)
    assert abs(sum(s.detail["credits"] for s in sink.of("step")) - (expected - 6)) < 1e-9


async def test_failed_validation_costs_no_tool_credits(tmp_path: Path) -> None:
    model = ReplayModel([calls_step(("current_time", {"timezone": "Nowhere/Land"}), step=1), answer_step("no")])
    result = await runtime(tmp_path, model=model).run_turn(request("x"), MemorySink(), MemoryStore())
    assert result.credits == 0.0


async def test_credit_budget_stops_the_turn(tmp_path: Path) -> None:
    runs: list[int] = []

    async def pricey(args: Empty, ctx: ToolContext) -> Any:
        runs.append(1)
        return "done"

    registry = registry_with(make_tool("pricey", pricey, cost=6))
    model = ReplayModel([calls_step(*[("pricey", {})] * 5, step=1), answer_step("out of credits")])
    sink = MemorySink()
    result = await runtime(tmp_path, model=model, registry=registry).run_turn(
        request("go", agent_=agent(tools=["pricey"], max_credits=20)), sink, MemoryStore()
    )
    assert len(runs) == 3 and result.credits == 18 and result.stopped_by == "credits"
    assert result.text == "out of credits" and sink.of("usage_metered")[0].stopped_by == "credits"


CAPPED = {"offline": {"input": 1.0, "output": 10.0}}
"""1 credit per 1,000 input tokens, 10 per 1,000 output tokens: a 200-token step may cost 2 credits."""


def _step_usage(step: int, *, input_tokens: int, output_tokens: int) -> RecordedStep:
    """A tool-calling step that read ``input_tokens`` and wrote ``output_tokens`` (what a provider reports)."""
    events: list[ModelEvent] = [
        ToolCallEvent(call=ToolCall(id=f"c{step}", name="current_time", arguments={})),
        Usage(input_tokens=input_tokens, output_tokens=output_tokens),
        Finished(stop_reason="tool_calls"),
    ]
    return RecordedStep(step=step, events=events)


async def test_a_credit_cap_is_never_passed(tmp_path: Path) -> None:
    """Each step is checked with its worst case before it runs; the last answer is capped to what is left."""
    model = ReplayModel(
        [
            # 0.2 + 1.0 credits, and 1 for current_time: another tool step's worst case (2+ credits) would pass 3.0
            _step_usage(1, input_tokens=200, output_tokens=100),
            answer_step("Here is what I found so far.", step=2),
        ]
    )
    sink = MemorySink()
    limits = agent(max_credits=3.0, max_output_tokens=200, max_steps=5)
    result = await runtime(tmp_path, model=model, prices=CAPPED).run_turn(
        request("go", agent_=limits), sink, MemoryStore()
    )
    assert result.credits <= 3.0 and result.stopped_by == "credits"
    assert result.text == "Here is what I found so far."
    first, final = model.requests  # no second tool step: the final answer came next
    assert first.max_output_tokens == 200
    spent = sink.of("step")[0].detail["credits"] + 1  # the first step and its tool call
    assert spent + final.max_output_tokens * 10.0 / 1000 <= 3.0  # even a final answer of full length fits
    assert final.max_output_tokens >= 16 and not final.tools


async def test_no_credits_for_an_answer_is_a_fixed_reply_without_a_model_call(tmp_path: Path) -> None:
    model = ReplayModel([answer_step("never asked")])
    limits = agent(max_credits=0.1, max_output_tokens=200)
    result = await runtime(tmp_path, model=model, prices=CAPPED).run_turn(
        request("go", agent_=limits), MemorySink(), MemoryStore()
    )
    assert model.requests == [] and result.credits == 0.0 and result.stopped_by == "credits"
    assert "credit budget of this turn ran out" in result.text


async def test_a_reply_cut_at_the_output_limit_says_so(tmp_path: Path) -> None:
    words = " ".join(f"word{n}" for n in range(40))  # ~280 characters
    sink = MemorySink()
    result = await runtime(tmp_path, model=ReplayModel([answer_step(words)])).run_turn(
        request("go", agent_=agent(max_output_chars=100)), sink, MemoryStore()
    )
    assert result.text == words[:100] + "\n\n[reply cut at 100 characters: the agent's output limit]"
    assert "".join(sink.deltas) == result.text  # the streamed reply says so too
    assert result.stopped_by == "output" and sink.of("usage_metered")[0].stopped_by == "output"


async def test_a_reply_within_the_limit_is_not_marked(tmp_path: Path) -> None:
    result = await runtime(tmp_path, model=ReplayModel([answer_step("short answer")])).run_turn(
        request("go", agent_=agent(max_output_chars=100)), MemorySink(), MemoryStore()
    )
    assert result.text == "short answer" and result.stopped_by is None
