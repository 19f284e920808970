"""Session state: three typed slots carried across turns and shown to the agent at the start of each.

``plan`` (the work in hand), ``context`` (paths to re-read, never their content) and ``state`` (flow variables): each
one value, overwritten on update and capped, so the state stays a summary rather than a second conversation. A slot
written with untrusted content in view is marked (:data:`UNTRUSTED_KEY`) until overwritten in a clean turn, and a
turn that shows it counts as holding untrusted content; the mark is written before a tainted value and removed only
after a clean one, so a crash errs on the side of the mark.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.errors import ToolError

__all__ = [
    "SLOT_MAX_BYTES",
    "SLOT_NAMES",
    "SLOT_TOOLS",
    "UNTRUSTED_KEY",
    "ContextUpdate",
    "PlanUpdate",
    "Slots",
    "StateUpdate",
    "slot_bytes",
]

logger = logging.getLogger(__name__)

SLOT_NAMES = ("plan", "context", "state")
SLOT_MAX_BYTES = 8 * 1024
"""Largest slot value, as canonical JSON in UTF-8."""
UNTRUSTED_KEY = "untrusted"
"""Stored beside the slots: the sorted names of the slots whose value was written after untrusted content."""


def slot_bytes(value: Any) -> int:
    """Size of a slot value as canonical JSON (sorted keys, compact, UTF-8)."""
    return len(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode())


class PlanUpdate(BaseModel):
    """The whole plan; it replaces the previous one."""

    model_config = ConfigDict(extra="forbid")

    goal: str = Field(description="What the user wants, in one or two sentences.")
    approach: str = Field("", description="How you intend to get there.")
    progress: str = Field("", description="What is done and what is next.")


class ContextUpdate(BaseModel):
    """The whole list of paths to re-read; it replaces the previous one."""

    model_config = ConfigDict(extra="forbid")

    paths: list[str] = Field(
        description="Workspace paths or URLs worth re-reading later (their names, never their content).",
        max_length=200,
    )


class StateUpdate(BaseModel):
    """All flow variables; they replace the previous ones."""

    model_config = ConfigDict(extra="forbid")

    values: dict[str, Any] = Field(description="Ids, names, choices and the current step, as a flat JSON object.")


class Slots(BaseModel):
    """The three slots of one session, as loaded at the start of a turn."""

    model_config = ConfigDict(frozen=True)

    plan: dict[str, str] | None = None
    context: list[str] | None = None
    state: dict[str, Any] | None = None
    untrusted: frozenset[str] = frozenset()
    """Slots whose value was written after untrusted content had entered that turn's context."""

    @classmethod
    def from_store(cls, raw: Mapping[str, Any]) -> Slots:
        """Read stored slots leniently: a slot that does not fit its type is ignored (and logged)."""
        values: dict[str, Any] = {}
        for name in SLOT_NAMES:
            if raw.get(name) is None:
                continue
            try:
                values[name] = getattr(cls.model_validate({name: raw[name]}), name)
            except ValidationError:
                logger.warning("ignoring stored %s slot that does not fit its type", name)
        return cls(**values, untrusted=_marks(raw))

    def with_value(self, name: str, value: Any, *, untrusted: bool = False) -> Slots:
        """A copy with one slot overwritten; ``untrusted``: written after untrusted content entered the turn."""
        if name not in SLOT_NAMES:
            raise KeyError(name)
        marks = self.untrusted | {name} if untrusted else self.untrusted - {name}
        return self.model_copy(update={name: value, "untrusted": marks})

    @property
    def tainted(self) -> bool:
        """A slot holding a value is marked untrusted: content showing it counts as untrusted."""
        return any(getattr(self, name) for name in self.untrusted)

    @property
    def empty(self) -> bool:
        """No slot holds anything."""
        return not (self.plan or self.context or self.state)

    def as_inputs(self) -> dict[str, Any]:
        """The slots as CodeAct program inputs (empty values rather than ``None``)."""
        return {"plan": dict(self.plan or {}), "context": list(self.context or []), "state": dict(self.state or {})}

    def render(self) -> str:
        """The slots as the agent sees them at the start of a turn (fixed layout)."""
        lines = ["## Session state (kept across turns; each update replaces the whole slot)"]
        if self.plan:
            lines.append("plan:")
            lines.extend(f"  {key}: {self.plan[key]}" for key in ("goal", "approach", "progress") if self.plan.get(key))
        else:
            lines.append("plan: (none)")
        if self.context:
            lines.append("context (paths to re-read when you need them):")
            lines.extend(f"  - {path}" for path in self.context)
        else:
            lines.append("context: (none)")
        if self.state:
            lines.append("state: " + json.dumps(self.state, sort_keys=True, ensure_ascii=False, default=str))
        else:
            lines.append("state: (none)")
        return "\n".join(lines)


def _marks(raw: Mapping[str, Any]) -> frozenset[str]:
    """The stored untrusted marks (anything unreadable counts as no mark on a known slot)."""
    stored = raw.get(UNTRUSTED_KEY)
    if not isinstance(stored, list):
        return frozenset()
    return frozenset(name for name in stored if name in SLOT_NAMES)


async def _save(name: str, value: Any, ctx: ToolContext) -> dict[str, Any]:
    size = slot_bytes(value)
    if size > SLOT_MAX_BYTES:
        raise ToolError(
            f"the {name} slot holds at most {SLOT_MAX_BYTES} bytes of JSON and this value is {size} bytes: "
            f"keep it short (summaries, ids and paths, not content) and try again",
            error_class="validation",
        )
    if ctx.store is None:
        raise ToolError("session state is not available in this run", error_class="permanent")
    marks = _marks(await ctx.store.load_slots())
    tainted = ctx.untrusted_context
    if tainted and name not in marks:  # the mark goes first: a crash in between leaves it, never a bare value
        await ctx.store.save_slot(UNTRUSTED_KEY, sorted(marks | {name}))
    await ctx.store.save_slot(name, value)
    if not tainted and name in marks:
        await ctx.store.save_slot(UNTRUSTED_KEY, sorted(marks - {name}))
    return {"slot": name, "value": value, "bytes": size}


async def _update_plan(args: PlanUpdate, ctx: ToolContext) -> dict[str, Any]:
    return await _save("plan", args.model_dump(), ctx)


async def _update_context(args: ContextUpdate, ctx: ToolContext) -> dict[str, Any]:
    paths = [p.strip() for p in args.paths if p.strip()]
    return await _save("context", list(dict.fromkeys(paths)), ctx)


async def _update_state(args: StateUpdate, ctx: ToolContext) -> dict[str, Any]:
    return await _save("state", args.values, ctx)


SLOT_TOOLS: list[Tool] = [
    Tool(
        name="update_plan",
        description="Replace the plan slot (goal, approach, progress). It is shown to you at the start of every turn.",
        input=PlanUpdate,
        fn=_update_plan,
        side_effect="write",
        risk="low",  # the agent's own notes: never gated
        idempotent=True,  # replaces the slot: a repeat writes the same value
        resources=lambda args: ("plan slot",),
        cost=1,
        timeout_s=5.0,
        retry_on=frozenset(),
    ),
    Tool(
        name="update_context",
        description="Replace the context slot: the paths worth re-reading in later turns (names, not content).",
        input=ContextUpdate,
        fn=_update_context,
        side_effect="write",
        risk="low",  # the agent's own notes: never gated
        idempotent=True,  # replaces the slot: a repeat writes the same value
        resources=lambda args: ("context slot",),
        cost=1,
        timeout_s=5.0,
        retry_on=frozenset(),
    ),
    Tool(
        name="update_state",
        description="Replace the state slot: flow variables such as ids, names, choices and the current step.",
        input=StateUpdate,
        fn=_update_state,
        side_effect="write",
        risk="low",  # the agent's own notes: never gated
        idempotent=True,  # replaces the slot: a repeat writes the same value
        resources=lambda args: ("state slot",),
        cost=1,
        timeout_s=5.0,
        retry_on=frozenset(),
    ),
]
"""The tools that update the slots (register them; agents list them in ``tools``)."""
