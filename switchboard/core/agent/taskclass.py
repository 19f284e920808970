"""Task classes and model routing of an agent: which budget a turn runs under, and which model runs each step.

An agent's ``task_classes`` name kinds of work (``lookup``, ``action``, ``research``), each with its own step, token,
credit and time budgets and a rule matching the turn's messages (a command, the channel, keywords, a regex). A turn
is classified once, before it runs (:func:`classify`); the first class, in the order written, whose rule matches wins,
and the class named ``default`` (when declared) takes the rest. The class's budgets narrow the agent's ``limits`` on
the turn's envelope, never widen them.

Routing (``models: {small: ..., strong: ...}``) sends cheap steps to a small model and the planning and final
synthesis to a strong one (:func:`step_model`). A classifier other than the rules (a small model) plugs in as a
:class:`Classifier`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from switchboard.core.messages import CommandIssued, InboundMessage

__all__ = [
    "DEFAULT_CLASS",
    "Classification",
    "Classifier",
    "ModelRouting",
    "ModelSize",
    "RuleClassifier",
    "TaskClass",
    "TaskMatch",
    "classify",
    "step_model",
]

DEFAULT_CLASS = "default"
"""The class a turn no rule matched falls into, when the agent declares one by that name."""

ModelSize = Literal["small", "strong"]


class TaskMatch(BaseModel):
    """When a turn belongs to a class: any one of the conditions set matches (none set: never, except ``default``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    commands: list[str] = Field(default_factory=list)
    """Command names without the slash (``research`` matches ``/research …``)."""
    channels: list[str] = Field(default_factory=list)
    """Channel names (``slack``, ``webchat``)."""
    keywords: list[str] = Field(default_factory=list)
    """Words or phrases found in the message text, case-insensitively, on word boundaries."""
    pattern: str | None = None
    """A regular expression searched in the message text (case-insensitive)."""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"not a valid regular expression: {err}") from None
        return value

    @field_validator("commands")
    @classmethod
    def _bare_commands(cls, value: list[str]) -> list[str]:
        return [name.strip().lstrip("/").lower() for name in value if name.strip().lstrip("/")]

    def matches(self, message: InboundMessage) -> str | None:
        """Which condition ``message`` meets (``command:research``, ``keyword:price``…), or ``None``."""
        event = message.event
        if self.commands and isinstance(event, CommandIssued) and event.name.lower() in self.commands:
            return f"command:{event.name.lower()}"
        if self.channels and message.conversation.channel in self.channels:
            return f"channel:{message.conversation.channel}"
        text = message.text
        for word in self.keywords:
            if re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text, re.IGNORECASE):
                return f"keyword:{word}"
        if self.pattern is not None and re.search(self.pattern, text, re.IGNORECASE):
            return "pattern"
        return None


class TaskClass(BaseModel):
    """One kind of work: its budgets (each narrows the agent's ``limits``) and the rule that picks it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    match: TaskMatch = Field(default_factory=TaskMatch)
    max_steps: int | None = Field(None, ge=1)
    """Model steps a turn of this class may take (the step budget)."""
    max_tokens: int | None = Field(None, ge=1)
    """Input plus output tokens over the turn (the token budget)."""
    max_credits: float | None = Field(None, ge=0)
    """Credits the turn may spend (the credit budget)."""
    deadline_s: float | None = Field(None, gt=0)
    """Seconds the turn may run (the time budget)."""
    model: ModelSize | None = None
    """Run every step of the class on this model of the agent's ``models`` (``None``: the per-step rule)."""


class ModelRouting(BaseModel):
    """A small model for cheap steps, a strong one for planning and synthesis (``provider:name`` each).

    The first step of a turn (reading and routing the request, often a tool call) runs on ``small``; a step that
    follows a tool result, and the last answer of a turn stopped by a budget, run on ``strong``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    small: str = Field(min_length=1)
    strong: str = Field(min_length=1)


@dataclass(frozen=True)
class Classification:
    """The class a turn runs under and why."""

    name: str
    rule: str
    """The condition that matched (``command:research``, ``keyword:price``, ``pattern``, ``default``)."""


class Classifier(Protocol):
    """Picks a turn's class; the rules are one, a small model may be another."""

    async def classify(
        self, classes: Mapping[str, TaskClass], messages: Sequence[InboundMessage]
    ) -> Classification | None:
        """The class of the turn over ``messages`` (``None``: no class, the agent's own limits)."""


class RuleClassifier:
    """The declared rules: :func:`classify`."""

    async def classify(
        self, classes: Mapping[str, TaskClass], messages: Sequence[InboundMessage]
    ) -> Classification | None:
        """See :func:`classify`."""
        return classify(classes, messages)


def classify(classes: Mapping[str, TaskClass], messages: Sequence[InboundMessage]) -> Classification | None:
    """The first class, in the order declared, whose rule the turn's last message meets; else ``default`` if any."""
    if not classes or not messages:
        return None
    last = messages[-1]
    for name, task in classes.items():
        rule = task.match.matches(last)
        if rule is not None:
            return Classification(name, rule)
    return Classification(DEFAULT_CLASS, "default") if DEFAULT_CLASS in classes else None


def step_model(routing: ModelRouting, *, after_tool_result: bool, final: bool, pinned: ModelSize | None) -> str:
    """The spec that runs one step under ``routing``: the class's pin, else small first and strong after tools."""
    size: ModelSize = pinned or ("strong" if after_tool_result or final else "small")
    return routing.small if size == "small" else routing.strong
