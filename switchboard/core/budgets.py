"""Budgets per tenant, agent and user over a day or a month: the rules, their periods, and what the user is told.

A rule caps the credits (the price table's unit, ``UsageMetered.credits``) one subject spends in one period: the
tenant, an agent of it, or a user (a principal, or the person it is linked to, ``docs/identity.md``). Spend is counted
in Redis per period (``switchboard.queue.budgets``); a run is refused before the model is asked once any rule that
applies to it is used up, and each threshold of ``alert_at`` is reported once per period (``docs/budgets.md``).
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from switchboard.types import TimeZoneName

__all__ = [
    "BudgetRule",
    "BudgetScope",
    "IdentityConfig",
    "Period",
    "PeriodName",
    "Subject",
    "exhausted_text",
    "period_of",
    "usage_text",
]

BudgetScope = Literal["tenant", "agent", "user"]
PeriodName = Literal["day", "month"]


class BudgetRule(BaseModel):
    """One entry of ``budgets:`` in the YAML file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scope: BudgetScope
    """``tenant``: all runs of a tenant; ``agent``: all runs of one agent; ``user``: the runs one person asks for."""
    period: PeriodName = "day"
    credits: float = Field(gt=0, allow_inf_nan=False)
    """Credits the subject may spend in one period."""
    alert_at: tuple[float, ...] = (0.8, 1.0)
    """Fractions of ``credits`` at which an alert is reported (once each per period)."""
    timezone: TimeZoneName = "UTC"
    """IANA time zone whose midnight (or first of the month) starts a period."""
    tenant: str | None = None
    """The tenant the rule applies to (``None``: every tenant, each counted on its own)."""
    agent: str | None = None
    """For ``scope: agent`` (and to narrow a ``user`` rule): the agent (``None``: every agent, each on its own)."""
    user: str | None = None
    """For ``scope: user``: one principal (``telegram:42``) or person id (``alice``); ``None``: every user, each on
    their own."""

    @field_validator("alert_at")
    @classmethod
    def _fractions(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0 < f <= 1 for f in value):
            raise ValueError("alert_at holds fractions of the budget, each in (0, 1], e.g. [0.5, 0.8, 1.0]")
        return tuple(sorted(set(value)))

    @model_validator(mode="after")
    def _fields_fit_scope(self) -> BudgetRule:
        if self.scope != "user" and self.user is not None:
            raise ValueError(f"user: is only for scope: user (this rule's scope is {self.scope})")
        if self.scope == "tenant" and self.agent is not None:
            raise ValueError("agent: narrows an agent or user budget; a tenant budget covers every agent")
        return self

    def applies(self, tenant: str, agent: str, user: str, principal: str) -> bool:
        """Whether a run of ``agent`` in ``tenant`` for ``user`` (person id or principal) counts against this rule."""
        return (
            (self.tenant is None or self.tenant == tenant)
            and (self.agent is None or self.agent == agent)
            and (self.user is None or self.user in (user, principal))
        )

    def subject(self, tenant: str, agent: str, user: str) -> Subject:
        """Who spends against this rule for such a run (what its counter is named after)."""
        match self.scope:
            case "tenant":
                return Subject(self, tenant, "tenant", tenant)
            case "agent":
                return Subject(self, tenant, "agent", agent)
            case "user":
                return Subject(self, tenant, "user", user if self.agent is None else f"{agent}/{user}")


@dataclass(frozen=True, slots=True)
class Subject:
    """One counter: a rule applied to one tenant, agent or user."""

    rule: BudgetRule
    tenant: str
    scope: BudgetScope
    name: str
    """The tenant, the agent, or the user (``agent/user`` for a user rule narrowed to an agent)."""


@dataclass(frozen=True, slots=True)
class Period:
    """One day or month in a time zone: its stamp (``2026-12-07``, ``2026-12``) and its bounds (Unix time)."""

    stamp: str
    start: float
    end: float
    resets: datetime
    """The local time the next period starts."""


def period_of(name: PeriodName, timezone: str, now: float) -> Period:
    """The period of kind ``name`` holding ``now`` in ``timezone``."""
    zone = ZoneInfo(timezone)
    local = datetime.fromtimestamp(now, zone)
    if name == "day":
        start = local.replace(hour=0, minute=0, second=0, microsecond=0)
        end = (start + timedelta(days=1, hours=2)).replace(hour=0)  # +2 h: across a DST change, still the next day
        return Period(start.strftime("%Y-%m-%d"), start.timestamp(), end.timestamp(), end)
    start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    days = calendar.monthrange(start.year, start.month)[1]
    end = (start + timedelta(days=days, hours=2)).replace(day=1, hour=0)
    return Period(start.strftime("%Y-%m"), start.timestamp(), end.timestamp(), end)


def _resets(rule: BudgetRule, period: Period) -> str:
    when = period.resets
    zone = "UTC" if rule.timezone in ("UTC", "Etc/UTC") else rule.timezone
    if rule.period == "day":
        return f"at {when:%H:%M} {zone}"
    return f"on {when.day} {when:%B} at {when:%H:%M} {zone}"


def exhausted_text(subject: Subject, period: Period) -> str:
    """The one message a user gets when a run is refused because ``subject``'s budget is used up."""
    span = "today" if subject.rule.period == "day" else "this month"
    who = "You have" if subject.scope == "user" else "This assistant has"
    mine = "your" if subject.scope == "user" else "its"
    return f"{who} used {mine} budget for {span}; it resets {_resets(subject.rule, period)}."


def usage_text(lines: list[tuple[Subject, Period, float]]) -> str:
    """What ``/usage`` answers: each budget that applies to the user, its spend and when it resets."""
    if not lines:
        return "No budget applies to you here: nothing is counted against you."
    out = ["Your usage:"]
    for subject, period, spent in lines:
        what = {"tenant": "this service", "agent": "this assistant", "user": "you"}[subject.scope]
        span = "today" if subject.rule.period == "day" else "this month"
        share = min(spent / subject.rule.credits, 9.99)
        out.append(
            f"- {what}, {span}: {spent:g} of {subject.rule.credits:g} credits ({share:.0%}); "
            f"resets {_resets(subject.rule, period)}"
        )
    return "\n".join(out)


class IdentityConfig(BaseModel):
    """The ``identity:`` block: whether people link their own accounts (``/link``), and how codes behave."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    self_link: bool = False
    """Answer ``/link`` in chats: a person links two of their accounts with a one-time code."""
    resolve: bool = False
    """Resolve every turn's sender to their person even without user budgets (so the policy sees it); costs one
    Redis read per turn."""
    code_ttl_s: int = Field(600, ge=30, le=86_400)
    """How long a ``/link`` code stays valid."""
    codes_per_hour: int = Field(5, ge=1, le=100)
    """Codes one principal may ask for in an hour (and wrong codes it may try)."""
