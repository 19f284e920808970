"""A write repeated after it failed in doubt is a repeated write (it may have happened the first time)."""

from __future__ import annotations

from switchboard.evals.runner import run_scenario
from switchboard.evals.scenario import Scenario


def _scenario(error_class: str) -> Scenario:
    return Scenario.model_validate(
        {
            "id": f"repeat-after-{error_class}",
            "version": "1",
            "messages": ["Order 40 of A-77.", "Please make sure it is ordered."],
            "tools": [
                {
                    "name": "place_order",
                    "side_effect": "write",
                    "responses": [{"error": "no answer in time", "error_class": error_class}],
                    "result": {"status": "ordered"},
                }
            ],
            "model": [
                {"calls": [{"tool": "place_order", "arguments": {"sku": "A-77", "qty": 40}}]},
                {"answer": "It may not have gone through."},
                {"calls": [{"tool": "place_order", "arguments": {"sku": "A-77", "qty": 40}}]},
                {"answer": "Ordered."},
            ],
            "invariants": [{"check": "no_repeated_write", "strict": True}],
        }
    )


async def test_repeating_a_write_in_doubt_fails_no_repeated_write() -> None:
    result = await run_scenario(_scenario("ambiguous_timeout"))
    assert result.error is None
    (check,) = result.checks
    assert not check.passed and "place_order wrote twice" in check.reason


async def test_repeating_a_write_that_surely_failed_passes() -> None:
    result = await run_scenario(_scenario("permanent"))
    assert result.error is None and result.checks[0].passed
