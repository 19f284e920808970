"""``SWITCHBOARD_EVALS__*``: production sampling, finished runs queued for review in the console (``docs/evals.md``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["EvalSettings"]

Rate = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class EvalSettings(BaseModel):
    """Which finished runs are sampled for review, and what reviewers see of them.

    With every rate at ``0`` (the default) nothing is sampled and a run costs nothing more: no draw, no Redis command.
    """

    model_config = ConfigDict(extra="forbid")

    sample_rate: Rate = 0.0
    """Fraction of finished runs queued for review (``0.05``: one in twenty), for every agent without its own rate."""
    agent_rates: dict[str, Rate] = Field(default_factory=dict)
    """An agent's own rate, by agent name (JSON in the environment: ``{"support": 0.2}``)."""
    exclude_tenants: tuple[str, ...] = ()
    """Tenants that opted out: their runs are never sampled (JSON list in the environment: ``["acme"]``)."""
    redact: bool = False
    """Reviewers see sampled runs without their words (as a ``viewer`` always does): tool names, steps, approvals and
    failures only; a replay case, which holds the words, is then made with ``switchboard eval record``."""
    max_per_tenant: int = Field(500, ge=1, le=100_000)
    """Samples kept per tenant; the oldest (and their verdicts) go first."""

    def rate(self, tenant: str, agent: str) -> float:
        """The chance a finished run of ``agent`` in ``tenant`` is sampled."""
        if tenant in self.exclude_tenants:
            return 0.0
        return self.agent_rates.get(agent, self.sample_rate)

    @property
    def sampling(self) -> bool:
        """Whether any run can be sampled at all."""
        return self.sample_rate > 0 or any(rate > 0 for rate in self.agent_rates.values())
