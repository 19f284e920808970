"""Budgets of one turn (``docs/ARCHITECTURE.md`` §3.6) and the credit price table.

A :class:`Budget` counts steps, tool calls, tokens, credits, output and time against the agent's limits, checked
before every step with its worst case, so a credit cap is never passed; once one runs out, a last call without tools
answers the user. Credits come from a :class:`PriceTable` plus each tool's own cost.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from switchboard.core.agent.config import AgentLimits
from switchboard.core.turn import TurnRequest

__all__ = ["INPUT_ESTIMATE_MARGIN", "MIN_ANSWER_TOKENS", "Budget", "BudgetName", "PriceTable", "StepTokens"]

MIN_ANSWER_TOKENS = 16
"""A final answer the credits left cannot pay this many tokens for is not asked for (a fixed reply instead)."""

INPUT_ESTIMATE_MARGIN = 1.25
"""Input tokens are estimated before a step (four ASCII characters a token); providers count their own way and
add framing, so the credit check before a step assumes a quarter more."""

BudgetName = Literal[
    "steps", "tool_calls", "tokens", "credits", "deadline", "context", "repeat_guard", "output", "compaction"
]
"""Which budget (or guard) ended a turn early; reported as ``TurnResult.stopped_by``. ``compaction``: the context
could not keep an open action word for word, and the turn stopped for review (``compaction_held``)."""


class StepTokens(NamedTuple):
    """The tokens one model step used, as its provider reported them."""

    input: int
    """Every input token, cache reads and writes included."""
    output: int
    cached: int = 0
    """Of ``input``, read from the provider's prompt cache."""
    written: int = 0
    """Of ``input``, written to the provider's prompt cache."""


class PriceTable:
    """Credits per 1,000 tokens by model spec, e.g. ``{"openai:gpt-4.1-mini": {"input": 0.4, "output": 1.6}}``.

    ``cached_input`` prices the input tokens read from the provider's prompt cache and ``cache_write`` those written
    to it (Anthropic bills writes above the input price); either left out costs the ``input`` price.

    A speech model's entry has ``characters`` instead: credits per 1,000 characters spoken
    (``{"openai:gpt-4o-mini-tts": {"characters": 15}}``).

    A spec with no entry costs nothing; ``openai:gpt-4.1-mini-2025`` falls back to the longest
    configured prefix (``openai:gpt-4.1-mini``), so dated snapshots share their family's price.
    """

    def __init__(self, prices: Mapping[str, Mapping[str, float]] | None = None) -> None:
        self._prices: dict[str, tuple[float, float]] = {
            spec: (float(p.get("input", 0.0)), float(p.get("output", 0.0))) for spec, p in (prices or {}).items()
        }
        self._characters: dict[str, float] = {
            spec: float(p["characters"]) for spec, p in (prices or {}).items() if "characters" in p
        }
        self._cache: dict[str, tuple[float, float]] = {
            spec: (float(p.get("cached_input", p.get("input", 0.0))), float(p.get("cache_write", p.get("input", 0.0))))
            for spec, p in (prices or {}).items()
        }

    def speech_credits(self, spec: str, characters: int) -> float:
        """Credits a speech request cost: ``characters`` (credits per 1,000 characters spoken) of the spec's entry.

        Looked up like :meth:`rates` (the longest configured prefix); no entry costs nothing.
        """
        best = spec if spec in self._characters else ""
        if not best:
            for key in self._characters:
                if spec.startswith(key) and len(key) > len(best):
                    best = key
        return self._characters[best] * characters / 1000.0 if best else 0.0

    def rates(self, spec: str) -> tuple[float, float]:
        """``(input, output)`` credits per 1,000 tokens for a model spec."""
        found = self._prices.get(spec)
        if found is not None:
            return found
        best = self._entry(spec)
        return self._prices[best] if best else (0.0, 0.0)

    def cache_rates(self, spec: str) -> tuple[float, float]:
        """``(cached_input, cache_write)`` credits per 1,000 tokens for a model spec (looked up like :meth:`rates`)."""
        found = self._cache.get(spec)
        if found is not None:
            return found
        best = self._entry(spec)
        return self._cache[best] if best else (0.0, 0.0)

    def _entry(self, spec: str) -> str:
        """The longest configured prefix of ``spec`` (``""``: none)."""
        best = ""
        for key in self._prices:
            if spec.startswith(key) and len(key) > len(best):
                best = key
        return best

    def model_credits(
        self, spec: str, input_tokens: int, output_tokens: int, cached_tokens: int = 0, written_tokens: int = 0
    ) -> float:
        """Credits one model step cost; ``cached_tokens`` and ``written_tokens`` are part of ``input_tokens``."""
        rate_in, rate_out = self.rates(spec)
        credits = input_tokens * rate_in + output_tokens * rate_out
        if cached_tokens or written_tokens:
            rate_cached, rate_written = self.cache_rates(spec)
            cached, written = max(0, cached_tokens), max(0, written_tokens)
            credits += cached * (rate_cached - rate_in) + written * (rate_written - rate_in)
        return credits / 1000.0


@dataclass
class Budget:
    """What one turn may still spend, and what it has spent.

    Build it with :meth:`for_turn`; limits are the agent's, narrowed by the request envelope.
    """

    max_steps: int
    max_tool_calls: int
    max_tokens: int | None
    """Input plus output tokens over the whole turn (``None``: bounded by steps only)."""
    max_credits: float | None
    max_output_chars: int
    deadline: float
    """Unix time by which the turn must end."""
    prices: PriceTable = field(default_factory=PriceTable)
    steps: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    """Of ``input_tokens``, read from the provider's prompt cache."""
    cache_write_tokens: int = 0
    """Of ``input_tokens``, written to the provider's prompt cache."""
    credits: float = 0.0
    started: float = field(default_factory=time.time)

    @classmethod
    def for_turn(cls, request: TurnRequest, prices: PriceTable, *, now: float | None = None) -> Budget:
        """The budget of ``request``: agent limits narrowed by the envelope's own budgets."""
        limits: AgentLimits = request.agent.limits
        start = time.time() if now is None else now
        steps = limits.max_steps if request.step_budget is None else min(limits.max_steps, request.step_budget)
        tokens = _narrow_int(limits.max_turn_tokens, request.token_budget)
        credits = _narrow_float(limits.max_credits, request.credit_budget)
        return cls(
            max_steps=max(1, steps),
            max_tool_calls=limits.max_tool_calls,
            max_tokens=tokens,
            max_credits=credits,
            max_output_chars=limits.max_output_chars,
            deadline=min(request.deadline, start + limits.deadline_s),
            prices=prices,
            started=start,
        )

    # ---------------------------------------------------------------- charging

    def charge_model(
        self,
        spec: str,
        input_tokens: int,
        output_tokens: int,
        cached_tokens: int = 0,
        written_tokens: int = 0,
        *,
        step: bool = True,
    ) -> float:
        """Count one model step; returns its cost.

        ``cached_tokens`` and ``written_tokens`` are part of its input; ``step=False``: a call outside the loop (e.g.
        classifying the turn), whose tokens and credits count but which takes no step.
        """
        self.steps += step
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cached_input_tokens += cached_tokens
        self.cache_write_tokens += written_tokens
        cost = self.prices.model_credits(spec, input_tokens, output_tokens, cached_tokens, written_tokens)
        self.credits += cost
        return cost

    def charge_tool(self, cost: int) -> None:
        """Count one tool call and its credits."""
        self.tool_calls += 1
        self.credits += cost

    # ---------------------------------------------------------------- questions

    @property
    def tokens(self) -> int:
        """Tokens used so far (input plus output)."""
        return self.input_tokens + self.output_tokens

    @property
    def tool_calls_left(self) -> int:
        """Tool calls the turn may still make."""
        return max(0, self.max_tool_calls - self.tool_calls)

    def can_afford_tool(self, cost: int, *, pending_calls: int = 0, pending_credits: int = 0) -> bool:
        """Whether one more call of a tool with this cost fits the call and credit budgets.

        ``pending_calls`` and ``pending_credits``: what calls admitted alongside it (a batch of reads) will charge.
        """
        if self.tool_calls_left - pending_calls <= 0:
            return False
        return self.max_credits is None or self.credits + pending_credits + cost <= self.max_credits + 1e-9

    def step_worst_case(self, spec: str, input_tokens: int, max_output_tokens: int) -> float:
        """Credits one model step can cost at most: its estimated input (with a margin) and every output token."""
        rate_in, rate_out = self.prices.rates(spec)
        return (input_tokens * INPUT_ESTIMATE_MARGIN * rate_in + max_output_tokens * rate_out) / 1000.0

    def can_afford_step(self, spec: str, input_tokens: int, max_output_tokens: int) -> bool:
        """Whether a model step fits the credit budget even if it costs its worst case (a cap is a cap)."""
        if self.max_credits is None:
            return True
        worst = self.step_worst_case(spec, input_tokens, max_output_tokens)
        return self.credits + worst <= self.max_credits + 1e-9

    def affordable_output_tokens(self, spec: str, input_tokens: int, wanted: int) -> int:
        """The most output tokens (up to ``wanted``) a step with this input may write within the credit budget."""
        if self.max_credits is None:
            return wanted
        rate_in, rate_out = self.prices.rates(spec)
        left = self.max_credits - self.credits - input_tokens * INPUT_ESTIMATE_MARGIN * rate_in / 1000.0
        if left < 0:
            return 0
        if rate_out <= 0:
            return wanted
        return max(0, min(wanted, int(left * 1000.0 / rate_out)))

    def remaining_s(self, *, now: float | None = None) -> float:
        """Seconds until the deadline (negative once it has passed)."""
        return self.deadline - (time.time() if now is None else now)

    def exhausted(self, *, now: float | None = None) -> BudgetName | None:
        """The first budget that has run out, or ``None`` while the turn may take another step."""
        if self.remaining_s(now=now) <= 0:
            return "deadline"
        if self.steps >= self.max_steps:
            return "steps"
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            return "tokens"
        if self.max_credits is not None and self.credits >= self.max_credits - 1e-9:
            return "credits"
        if self.max_tool_calls > 0 and self.tool_calls_left <= 0:
            return "tool_calls"
        return None

    def summary(self) -> dict[str, float | int | None]:
        """What was spent against what was allowed (for events and the final no-tools turn)."""
        return {
            "steps": self.steps,
            "max_steps": self.max_steps,
            "tool_calls": self.tool_calls,
            "max_tool_calls": self.max_tool_calls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "max_tokens": self.max_tokens,
            "credits": round(self.credits, 6),
            "max_credits": self.max_credits,
        }


def _narrow_int(a: int | None, b: int | None) -> int | None:
    """The tighter of two optional limits."""
    return b if a is None else a if b is None else min(a, b)


def _narrow_float(a: float | None, b: float | None) -> float | None:
    """The tighter of two optional limits."""
    return b if a is None else a if b is None else min(a, b)
