"""Retention rules: how long each kind of stored data is kept, by default and per tenant.

The YAML ``retention:`` block::

    retention:
      every: 1h              # how often the workers' sweep runs
      defaults: {events: 30d, dead_letters: 14d}
      tenants:
        acme: {history: 90d, workspaces: 7d, events: keep}

A duration is a whole number and a unit (``s``, ``m``, ``h``, ``d``, ``w``); ``keep`` keeps that kind forever (a
tenant's ``keep`` overrides a default). A kind with no rule is kept as it is today: the sweep does not look at it.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Final, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, model_validator

__all__ = ["KINDS", "Duration", "RetentionConfig", "RetentionKind", "RetentionRules", "parse_duration"]

RetentionKind = Literal["history", "events", "workspaces", "memory", "knowledge", "approvals", "dead_letters"]
"""The kinds of data a rule can bound (``docs/operations/retention.md`` says what each covers)."""

KINDS: Final[tuple[RetentionKind, ...]] = get_args(RetentionKind)

_NOT_STORED: Final = {
    "traces": "traces are exported over OTLP and not stored by Switchboard: set their retention in your collector",
    "caches": "caches are not kept past their own expiry (embeddings cached by content hash go with memory)",
}
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^([1-9][0-9]{0,6})([smhdw])$")


def parse_duration(value: Any) -> float:
    """Seconds of a duration (``30d``, ``12h``), ``inf`` for ``keep``.

    Raises:
        ValueError: not a duration, saying what one looks like.
    """
    if isinstance(value, str) and value.strip().lower() == "keep":
        return math.inf
    found = _DURATION.match(value.strip()) if isinstance(value, str) else None
    if found is None:
        raise ValueError(f"{value!r} is not a duration: write a number and a unit (30d, 12h, 90m, 2w) or keep")
    return float(int(found.group(1)) * _UNITS[found.group(2)])


def _show(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "keep"
    for unit, size in sorted(_UNITS.items(), key=lambda item: -item[1]):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


Duration = Annotated[float, BeforeValidator(parse_duration), PlainSerializer(_show)]
"""A duration in seconds, written ``30d``; ``inf`` is ``keep``; dumped as written, so a dumped config loads again."""


class RetentionRules(BaseModel):
    """One rule per kind (seconds, ``inf`` = keep); a kind left out has no rule here."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    history: Duration | None = None
    """The conversation history the agent reads (entries older than this are dropped)."""
    events: Duration | None = None
    """Session event logs (entries by time)."""
    workspaces: Duration | None = None
    """Files in session workspaces, by modification time."""
    memory: Duration | None = None
    """Remembered facts, by creation time."""
    knowledge: Duration | None = None
    """Documents (knowledge sources and remembered documents), by creation time."""
    approvals: Duration | None = None
    """Decided approval records with their snapshots (pending ones are never removed by age)."""
    dead_letters: Duration | None = None
    """Dead-lettered messages, in the session's list and the operators' stream."""

    @model_validator(mode="before")
    @classmethod
    def _known_kinds(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for kind in data:
                if kind in _NOT_STORED:
                    raise ValueError(f"{kind}: {_NOT_STORED[kind]}")
                if kind not in KINDS:
                    known = ", ".join(KINDS)
                    raise ValueError(f"{kind!r} is not a kind of data with a retention rule (kinds: {known})")
        return data


class RetentionConfig(BaseModel):
    """The ``retention:`` block: defaults for every tenant, per-tenant overrides, and how often the sweep runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    every: Duration = 3600.0
    """How often the workers' sweep runs (one worker at a time)."""
    defaults: RetentionRules = Field(default_factory=RetentionRules)
    tenants: dict[str, RetentionRules] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _finite_every(self) -> RetentionConfig:
        if not math.isfinite(self.every):
            raise ValueError("retention.every must be a duration (1h), not keep")
        for tenant in self.tenants:
            if not tenant or "/" in tenant:
                raise ValueError(f"retention.tenants: {tenant!r} is not a tenant id")
        return self

    @property
    def active(self) -> bool:
        """Whether any rule removes anything (otherwise the sweep never runs)."""
        every = [self.defaults, *self.tenants.values()]
        return any(self._limit(rules, kind) is not None for rules in every for kind in KINDS)

    @staticmethod
    def _limit(rules: RetentionRules, kind: RetentionKind) -> float | None:
        value: float | None = getattr(rules, kind)
        return value if value is not None and math.isfinite(value) else None

    def rule(self, tenant: str, kind: RetentionKind) -> float | None:
        """Seconds ``kind`` of ``tenant`` is kept, or ``None``: kept (no rule, or ``keep``)."""
        own = self.tenants.get(tenant)
        value: float | None = getattr(own, kind) if own is not None else None
        if value is None:
            value = getattr(self.defaults, kind)
        return value if value is not None and math.isfinite(value) else None

    def rules(self, tenant: str) -> dict[RetentionKind, float]:
        """The kinds of ``tenant`` with a rule, and their seconds."""
        return {kind: limit for kind in KINDS if (limit := self.rule(tenant, kind)) is not None}

    def describe(self) -> list[str]:
        """The rules as ``switchboard check`` prints them."""
        out: list[str] = []
        blocks = [("defaults", self.defaults), *((f"tenant {t}", r) for t, r in sorted(self.tenants.items()))]
        for label, rules in blocks:
            set_ = {kind: getattr(rules, kind) for kind in KINDS if getattr(rules, kind) is not None}
            if set_:
                out.append(f"{label}: " + ", ".join(f"{k} {_show(v)}" for k, v in set_.items()))
        return out
