"""Turn budgets and credit metering."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from switchboard.core.budget import Budget, PriceTable
from switchboard.core.replay import ReplayModel
from switchboard.core.tools import ToolContext
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
