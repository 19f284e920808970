"""Period budgets in Redis: the credits each tenant, agent and user spent this day or month, checked and charged.

A run is admitted only while every budget that applies to it has credits left, and its own credit cap is narrowed to
the least of what is left (so no run alone passes a budget). Its metered credits are charged to every counter at once
(one script), which reports each alert threshold crossed for the first time this period. The bound this gives under
concurrency is spelled out in ``docs/budgets.md``: runs admitted together may each spend what was left when they were
admitted, so two racing for the last credits end at most one run's metered cost over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis.asyncio as aioredis

from switchboard.core.budgets import BudgetRule, Period, Subject, exhausted_text, period_of, usage_text
from switchboard.core.events import BudgetAlerted, BudgetExhausted
from switchboard.queue import scripts
from switchboard.queue.keys import GlobalKeys

__all__ = ["ALERTS_CAP", "Admission", "Budgets", "Counter", "SpendRow"]

logger = logging.getLogger(__name__)

ALERTS_CAP: Final = 1_000
"""Approximate length of a tenant's stream of budget alerts."""
KEEP_AFTER_S: Final = 24 * 3600
"""How long a counter outlives its period (the console shows the period just ended)."""
_KEYS = GlobalKeys()


@dataclass(frozen=True, slots=True)
class Counter:
    """One budget counter of one run: the rule's subject, the period now, and its Redis key."""

    subject: Subject
    period: Period
    key: str


@dataclass(frozen=True, slots=True)
class Admission:
    """What the budgets say about a run about to start."""

    counters: tuple[Counter, ...]
    refused: BudgetExhausted | None = None
    """The budget that is used up (the run must not start), if any."""
    text: str = ""
    """What the user is told when refused."""
    credits_left: float | None = None
    """The least credits left across the budgets (``None``: none applies): the run's credit cap."""
    binding_text: str = ""
    """What the user is told if the run stops at that cap: the budget with the least left is used up."""


@dataclass(frozen=True, slots=True)
class SpendRow:
    """One live counter, as the console lists it."""

    tenant: str
    scope: str
    subject: str
    period: str
    spent: float
    credits: float
    alerts: tuple[float, ...]
    """Thresholds already reported this period."""
    resets_at: float
    """When the period ends and the next one starts counting from nothing (Unix time)."""


def _float(value: bytes | str | None) -> float:
    return float(value) if value is not None else 0.0


class Budgets:
    """The ``budgets:`` rules of the YAML file over the Redis counters."""

    def __init__(
        self, redis: aioredis.Redis, rules: Sequence[BudgetRule], *, clock: Callable[[], float] = time.time
    ) -> None:
        self.redis = redis
        self.rules = tuple(rules)
        self.clock = clock
        self.by_user = any(rule.scope == "user" for rule in self.rules)
        """Whether any rule counts per user (then the sender's person is looked up)."""

    def counters(self, tenant: str, agent: str, user: str, principal: str) -> tuple[Counter, ...]:
        """The counters a run of ``agent`` for ``user`` (person id or principal) spends against, now.

        Rules that name the same counter (``{scope: user}`` and ``{scope: user, user: telegram:42}`` for that user)
        give one: the most specific rule (most of ``tenant``, ``agent``, ``user`` named; on a tie the first listed),
        so a rule naming one user or agent replaces the general one for it and no run is charged twice.
        """
        now = self.clock()
        chosen: dict[str, tuple[int, Counter]] = {}
        for rule in self.rules:
            if rule.applies(tenant, agent, user, principal):
                subject = rule.subject(tenant, agent, user)
                period = period_of(rule.period, rule.timezone, now)
                key = _KEYS.budget(tenant, subject.scope, f"{rule.period}:{subject.name}", period.stamp)
                named = sum(value is not None for value in (rule.tenant, rule.agent, rule.user))
                if key not in chosen or named > chosen[key][0]:
                    chosen[key] = (named, Counter(subject, period, key))
        return tuple(counter for _named, counter in chosen.values())

    async def spent(self, counters: Sequence[Counter]) -> list[float]:
        """What each counter spent this period (one script call)."""
        return [spent for spent, _closed in await self._read(counters)]

    async def _read(self, counters: Sequence[Counter]) -> list[tuple[float, bool]]:
        if not counters:
            return []
        values = await scripts.BUDGET_READ(self.redis, [c.key for c in counters], [])
        return [(_float(spent), closed is not None) for spent, closed in values]

    async def admit(self, tenant: str, agent: str, user: str, principal: str) -> Admission:
        """Whether a run may start: refused once any budget that applies is used up; else its credit cap."""
        counters = self.counters(tenant, agent, user, principal)
        if not counters:
            return Admission(counters)
        read = await self._read(counters)
        left, binding = None, ""
        for counter, (used, closed) in zip(counters, read, strict=True):
            subject = counter.subject
            if closed or used >= subject.rule.credits - 1e-9:
                refused = BudgetExhausted(
                    tenant=tenant,
                    scope=subject.scope,
                    subject=subject.name,
                    period=counter.period.stamp,
                    spent=round(used, 6),
                    credits=subject.rule.credits,
                )
                return Admission(counters, refused, exhausted_text(subject, counter.period))
            remaining = subject.rule.credits - used
            if left is None or remaining < left:
                left, binding = remaining, exhausted_text(subject, counter.period)
        return Admission(counters, credits_left=left, binding_text=binding)

    async def charge(
        self, counters: Sequence[Counter], credits: float, *, stopped_at_cap: float | None = None
    ) -> list[BudgetAlerted]:
        """Add a run's metered ``credits`` to its counters; the alerts crossed for the first time, as events.

        ``stopped_at_cap``: the run, capped at this many credits (the least left across its budgets), stopped for
        credits; the counters that set the cap are closed for the period (what is left cannot pay for a run, so the
        next one gets the clear message instead of a run that cannot answer).
        """
        if not counters or (credits <= 0 and stopped_at_cap is None):
            return []
        tenant = counters[0].subject.tenant
        close = "" if stopped_at_cap is None else repr(float(stopped_at_cap))
        args: list[scripts.ScriptArg] = [repr(float(credits)), repr(self.clock()), ALERTS_CAP, close]
        for c in counters:
            rule = c.subject.rule
            thresholds = ",".join(f"{t:g}" for t in rule.alert_at) or "2"  # "2": never reached (the stop comes first)
            args += [repr(rule.credits), int(c.period.end + KEEP_AFTER_S), thresholds, c.subject.scope]
            args += [c.subject.name, c.period.stamp]
        keys = [_KEYS.budget_counters(tenant), _KEYS.budget_alerts(tenant), *(c.key for c in counters)]
        crossed = await scripts.BUDGET_CHARGE(self.redis, keys, args)
        alerts = []
        for i in range(0, len(crossed), 3):
            counter = counters[int(crossed[i]) - 1]
            subject = counter.subject
            alert = BudgetAlerted(
                tenant=tenant,
                scope=subject.scope,
                subject=subject.name,
                period=counter.period.stamp,
                threshold=float(crossed[i + 1]),
                spent=round(_float(crossed[i + 2]), 6),
                credits=subject.rule.credits,
            )
            logger.warning(
                "budget alert: %s %s %s reached %g%% of %g credits (%s)",
                tenant,
                subject.scope,
                subject.name,
                alert.threshold * 100,
                alert.credits,
                alert.period,
            )
            alerts.append(alert)
        return alerts

    async def usage(self, tenant: str, agent: str, user: str, principal: str) -> str:
        """What ``/usage`` answers for this user: each budget that applies, its spend and when it resets."""
        counters = self.counters(tenant, agent, user, principal)
        spent = await self.spent(counters)
        return usage_text([(c.subject, c.period, s) for c, s in zip(counters, spent, strict=True)])

    async def live(self, tenant: str) -> list[SpendRow]:
        """Every counter of ``tenant`` not yet expired, with its spend and the alerts reported."""
        now = self.clock()
        found: Any = await self.redis.zrangebyscore(_KEYS.budget_counters(tenant), now, "+inf", withscores=True)
        if not found:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for key, _expires in found:
                pipe.hgetall(key.decode())
            hashes = await pipe.execute()
        rows = []
        for (_key, expires), fields in zip(found, hashes, strict=True):
            if not fields:
                continue
            text = {k.decode(): v.decode() for k, v in fields.items()}
            alerts = tuple(sorted(float(k[6:]) for k in text if k.startswith("alert:")))
            rows.append(
                SpendRow(
                    tenant,
                    text["scope"],
                    text["subject"],
                    text["period"],
                    round(float(text.get("spent", 0)), 6),
                    float(text["budget"]),
                    alerts,
                    float(expires) - KEEP_AFTER_S,  # a counter is indexed by its expiry, a fixed time after its end
                )
            )
        return sorted(rows, key=lambda r: (r.scope, r.subject, r.period))
