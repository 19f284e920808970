"""Period budgets in real Redis: which counters a run spends against, the hard stop, alerts once, rollover, races."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError

from switchboard.core.budgets import BudgetRule, period_of
from switchboard.queue.budgets import Budgets
from switchboard.queue.keys import GlobalKeys
from switchboard.settings import FileConfig


class Clock:
    """A clock the test moves (period boundaries are tested by moving it, never by waiting)."""

    def __init__(self, when: str) -> None:
        self.now = datetime.fromisoformat(when).timestamp()

    def __call__(self) -> float:
        return self.now

    def set(self, when: str) -> None:
        self.now = datetime.fromisoformat(when).timestamp()


def rules(*raw: dict[str, Any]) -> tuple[BudgetRule, ...]:
    return FileConfig.model_validate({"budgets": list(raw)}).budgets


# (rule, run of (tenant, agent, user, principal), counts against it)
SCOPES = [
    ({"scope": "tenant", "credits": 10}, ("acme", "assistant", "telegram:1", "telegram:1"), True),
    ({"scope": "tenant", "tenant": "acme", "credits": 10}, ("other", "assistant", "telegram:1", "telegram:1"), False),
    ({"scope": "agent", "agent": "sales", "credits": 10}, ("acme", "sales", "telegram:1", "telegram:1"), True),
    ({"scope": "agent", "agent": "sales", "credits": 10}, ("acme", "support", "telegram:1", "telegram:1"), False),
    ({"scope": "agent", "credits": 10}, ("acme", "support", "telegram:1", "telegram:1"), True),
    ({"scope": "user", "credits": 10}, ("acme", "assistant", "telegram:1", "telegram:1"), True),
    ({"scope": "user", "user": "telegram:2", "credits": 10}, ("acme", "assistant", "telegram:1", "telegram:1"), False),
    ({"scope": "user", "user": "alice", "credits": 10}, ("acme", "assistant", "alice", "slack:U1"), True),
    ({"scope": "user", "user": "slack:U1", "credits": 10}, ("acme", "assistant", "alice", "slack:U1"), True),
]


@pytest.mark.parametrize(("rule", "run", "counts"), SCOPES)
@pytest.mark.parametrize("period", ["day", "month"])
async def test_a_run_is_refused_once_the_budget_it_counts_against_is_used_up(
    async_redis: aioredis.Redis, rule: dict[str, Any], run: tuple[str, str, str, str], counts: bool, period: str
) -> None:
    budgets = Budgets(async_redis, rules({**rule, "period": period}), clock=Clock("2026-12-07T15:00:00+00:00"))
    first = await budgets.admit(*run)
    assert first.refused is None
    assert first.credits_left == (10 if counts else None)
    await budgets.charge(first.counters, 9.5)
    assert (await budgets.admit(*run)).refused is None  # 0.5 left: still admitted, capped at what is left
    assert (await budgets.admit(*run)).credits_left == (pytest.approx(0.5) if counts else None)
    await budgets.charge(first.counters, 0.5)
    last = await budgets.admit(*run)
    if not counts:
        assert last.refused is None and last.counters == ()
        return
    assert last.refused is not None and last.refused.spent == pytest.approx(10)
    span = "today" if period == "day" else "this month"
    resets = "at 00:00 UTC" if period == "day" else "on 1 January at 00:00 UTC"
    who = "You have used your" if rule["scope"] == "user" else "This assistant has used its"
    assert last.text == f"{who} budget for {span}; it resets {resets}."


@pytest.mark.parametrize(
    ("period", "timezone", "before", "after", "text"),
    [
        ("day", "UTC", "2026-12-07T23:59:59+00:00", "2026-12-08T00:00:00+00:00", "it resets at 00:00 UTC."),
        (
            "day",
            "Europe/Berlin",
            "2026-12-07T22:59:59+00:00",  # 23:59:59 in Berlin
            "2026-12-07T23:00:00+00:00",  # midnight in Berlin
            "it resets at 00:00 Europe/Berlin.",
        ),
        ("month", "UTC", "2026-12-31T23:59:59+00:00", "2027-01-01T00:00:00+00:00", "on 1 January at 00:00 UTC."),
        ("month", "UTC", "2027-02-28T23:59:59+00:00", "2027-03-01T00:00:00+00:00", "on 1 March at 00:00 UTC."),
    ],
)
async def test_a_used_up_budget_opens_again_when_the_period_rolls_over(
    async_redis: aioredis.Redis, period: str, timezone: str, before: str, after: str, text: str
) -> None:
    clock = Clock(before)
    budgets = Budgets(
        async_redis, rules({"scope": "tenant", "period": period, "timezone": timezone, "credits": 1}), clock=clock
    )
    run = ("acme", "assistant", "telegram:1", "telegram:1")
    admitted = await budgets.admit(*run)
    await budgets.charge(admitted.counters, 1)
    refused = await budgets.admit(*run)
    assert refused.refused is not None and refused.text.endswith(text)
    clock.set(after)
    fresh = await budgets.admit(*run)
    assert fresh.refused is None and fresh.credits_left == 1
    assert fresh.counters[0].key != admitted.counters[0].key
    ttl = await async_redis.ttl(admitted.counters[0].key)
    assert ttl > 0  # the old period's counter expires on its own (a day after its end)
    assert await async_redis.expiretime(admitted.counters[0].key) == int(admitted.counters[0].period.end + 86400)


def test_a_day_across_a_dst_change_is_that_day() -> None:
    spring = period_of("day", "Europe/Berlin", datetime(2026, 3, 29, 12, tzinfo=UTC).timestamp())
    assert spring.stamp == "2026-03-29" and spring.end - spring.start == 23 * 3600
    autumn = period_of("day", "Europe/Berlin", datetime(2026, 10, 25, 12, tzinfo=UTC).timestamp())
    assert autumn.stamp == "2026-10-25" and autumn.end - autumn.start == 25 * 3600


async def test_each_alert_threshold_is_reported_once_per_period(async_redis: aioredis.Redis) -> None:
    clock = Clock("2026-12-07T10:00:00+00:00")
    budgets = Budgets(async_redis, rules({"scope": "agent", "credits": 10, "alert_at": [0.5, 0.8, 1.0]}), clock=clock)
    run = ("acme", "assistant", "telegram:1", "telegram:1")
    counters = (await budgets.admit(*run)).counters
    seen = []
    for spend in (4, 1, 0.5, 3, 1, 5):  # 4, 5 (50%), 5.5, 8.5 (80%), 9.5, 14.5 (100%)
        seen.append([(a.threshold, a.spent) for a in await budgets.charge(counters, spend)])
    assert seen == [[], [(0.5, 5)], [], [(0.8, 8.5)], [], [(1.0, 14.5)]]
    stream = await async_redis.xrange(GlobalKeys().budget_alerts("acme"))
    assert [fields[b"threshold"] for _id, fields in stream] == [b"0.5", b"0.8", b"1"]
    clock.set("2026-12-08T10:00:00+00:00")  # a new day: the thresholds are reported again
    counters = (await budgets.admit(*run)).counters
    assert [a.threshold for a in await budgets.charge(counters, 6)] == [0.5]


async def test_alerts_are_reported_once_when_many_runs_cross_together(async_redis: aioredis.Redis) -> None:
    budgets = Budgets(async_redis, rules({"scope": "tenant", "credits": 10, "alert_at": [0.5]}))
    counters = (await budgets.admit("acme", "assistant", "telegram:1", "telegram:1")).counters
    crossed = await asyncio.gather(*(budgets.charge(counters, 1) for _ in range(20)))
    assert sum(len(c) for c in crossed) == 1


@pytest.mark.parametrize(("left", "costs"), [(1.0, (0.9, 0.8)), (0.3, (0.3, 0.3)), (2.0, (0.5, 2.0))])
async def test_two_runs_racing_for_the_last_credits_end_at_most_one_runs_cost_over(
    async_redis: aioredis.Redis, left: float, costs: tuple[float, float]
) -> None:
    """Both are admitted before either is charged; each spends at most the cap it was given (what was left)."""
    budgets = Budgets(async_redis, rules({"scope": "tenant", "credits": 10}))
    run = ("acme", "assistant", "telegram:1", "telegram:1")
    await budgets.charge((await budgets.admit(*run)).counters, 10 - left)
    admitted = await asyncio.gather(budgets.admit(*run), budgets.admit(*run))
    assert all(a.refused is None and a.credits_left == pytest.approx(left) for a in admitted)
    spent = [min(cost, a.credits_left or 0) for cost, a in zip(costs, admitted, strict=True)]  # the runtime's cap
    await asyncio.gather(*(budgets.charge(a.counters, s) for a, s in zip(admitted, spent, strict=True)))
    [total] = await budgets.spent(admitted[0].counters)
    assert total - 10 <= min(spent) + 1e-9  # over by at most one run's metered cost
    assert (await budgets.admit(*run)).refused is not None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"scope": "tenant", "credits": 0}, "greater than 0"),
        ({"scope": "tenant", "credits": 5, "period": "week"}, "'day' or 'month'"),
        ({"scope": "tenant", "credits": 5, "alert_at": [1.5]}, "fractions of the budget"),
        ({"scope": "tenant", "credits": 5, "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"scope": "agent", "credits": 5, "user": "telegram:1"}, "only for scope: user"),
        ({"scope": "tenant", "credits": 5, "agent": "a"}, "covers every agent"),
        ({"scope": "tenant", "credits": 5, "cost": 1}, "Extra inputs"),
    ],
)
def test_a_bad_budget_is_refused_with_what_to_fix(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        rules(raw)


def test_two_rules_for_one_counter_are_refused() -> None:
    with pytest.raises(ValidationError, match=r"budgets\[1\] counts the same thing as budgets\[0\]"):
        rules({"scope": "tenant", "credits": 5}, {"scope": "tenant", "credits": 6})


async def test_the_console_lists_live_counters(async_redis: aioredis.Redis) -> None:
    budgets = Budgets(
        async_redis,
        rules(
            {"scope": "tenant", "credits": 10, "alert_at": [0.5]}, {"scope": "user", "period": "month", "credits": 4}
        ),
    )
    admitted = await budgets.admit("acme", "assistant", "alice", "telegram:1")
    await budgets.charge(admitted.counters, 6)
    rows = await budgets.live("acme")
    assert [(r.scope, r.subject, r.spent, r.credits, r.alerts) for r in rows] == [
        ("tenant", "acme", 6, 10, (0.5,)),
        ("user", "alice", 6, 4, (0.8, 1.0)),
    ]
