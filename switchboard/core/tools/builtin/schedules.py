"""The agent's own scheduled jobs: ``schedule_message``, ``schedule_turn``, ``list_schedules``, ``cancel_schedule``.

A job the agent makes goes into its own conversation only (the session the call serves), and it can list and cancel
only that session's jobs. Making and cancelling one are writes, so the policy decides each call like any write (a
rule on ``schedule_*`` can make a person approve them). The jobs live in the queue layer, reached through
:class:`SessionSchedules`, a Protocol the session store implements.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from switchboard.core.protocols import conforms
from switchboard.core.schedules import MAX_TEXT_CHARS
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.errors import ToolError

__all__ = [
    "TOOLS",
    "CancelScheduleInput",
    "ScheduleMessageInput",
    "ScheduleTurnInput",
    "SessionSchedules",
]


@runtime_checkable
class SessionSchedules(Protocol):
    """A session's own scheduled jobs (implemented by the queue layer's session store)."""

    async def schedule_add(
        self,
        action: Literal["turn", "message"],
        text: str,
        *,
        at: dt.datetime | None,
        cron: str | None,
        timezone: str,
        key: str,
        role: Literal["guest", "user"] = "user",
    ) -> dict[str, Any]:
        """Make a job into this session; ``key`` (the call's idempotency key) names it, so a retry makes no second.

        Its turns act with ``role``, the role of the turn that made it (a guest cannot schedule itself a user's turn).

        Raises:
            ValueError: the job is invalid, its time has passed, or the session holds its most jobs.
        """
        ...

    async def schedule_list(self) -> list[dict[str, Any]]:
        """This session's jobs with their next occurrence and what became of the last one."""
        ...

    async def schedule_cancel(self, job_id: str) -> bool:
        """Remove one of this session's jobs; ``False`` when it has no such job."""
        ...


class _When(BaseModel):
    model_config = ConfigDict(extra="forbid")

    at: dt.datetime | None = Field(
        None, description="When to run once: ISO 8601 (2026-12-24T09:00:00+01:00); without an offset, in 'timezone'."
    )
    cron: str | None = Field(None, description="Or a recurring five-field cron expression, e.g. '0 9 * * mon-fri'.")
    timezone: str = Field("UTC", description="IANA time zone of 'cron' (and of an 'at' without an offset).")

    @model_validator(mode="after")
    def _one(self) -> _When:
        if (self.at is None) == (self.cron is None):
            raise ValueError("give exactly one of 'at' and 'cron'")
        return self


class ScheduleMessageInput(_When):
    """Arguments of ``schedule_message``."""

    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS, description="The message sent to the user, as is.")


class ScheduleTurnInput(_When):
    """Arguments of ``schedule_turn``."""

    prompt: str = Field(
        min_length=1, max_length=MAX_TEXT_CHARS, description="What you will be asked to do then (only you read it)."
    )


class CancelScheduleInput(BaseModel):
    """Arguments of ``cancel_schedule``."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=64, description="The job id list_schedules gave.")


def _schedules(ctx: ToolContext) -> SessionSchedules:
    store = ctx.store
    if not conforms(store, SessionSchedules):
        raise ToolError("scheduled jobs cannot be kept here (this session's store has none)")
    return store


async def _add(action: Literal["turn", "message"], text: str, args: _When, ctx: ToolContext) -> dict[str, Any]:
    try:
        return await _schedules(ctx).schedule_add(
            action,
            text,
            at=args.at,
            cron=args.cron,
            timezone=args.timezone,
            key=ctx.idempotency_key,
            role="guest" if ctx.role == "guest" else "user",  # a job outlives its maker's role: never an admin's
        )
    except ValueError as err:
        raise ToolError(str(err)) from None


async def schedule_message(args: ScheduleMessageInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: send ``text`` into this conversation at a time or on a cron expression."""
    return await _add("message", args.text, args, ctx)


async def schedule_turn(args: ScheduleTurnInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: run a turn on ``prompt`` in this conversation at a time or on a cron expression."""
    return await _add("turn", args.prompt, args, ctx)


class _NoInput(BaseModel):
    model_config = ConfigDict(extra="forbid")


async def list_schedules(args: _NoInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: this conversation's jobs."""
    jobs = await _schedules(ctx).schedule_list()
    return {"count": len(jobs), "jobs": jobs}


async def cancel_schedule(args: CancelScheduleInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: cancel one of this conversation's jobs."""
    if not await _schedules(ctx).schedule_cancel(args.id):
        raise ToolError(f"this conversation has no scheduled job {args.id!r} (see list_schedules)")
    return {"cancelled": args.id}


TOOLS: list[Tool] = [
    Tool(
        name="schedule_message",
        description="Send a message to the user in this conversation later: once at a time ('at') or recurring on a "
        "cron expression ('cron'), in a time zone. The text is sent as it is, without you.",
        input=ScheduleMessageInput,
        fn=schedule_message,
        side_effect="write",
        risk="medium",
        cost=5,
        timeout_s=5.0,
    ),
    Tool(
        name="schedule_turn",
        description="Be woken in this conversation later with a prompt (once at 'at', or on a cron expression), to "
        "do something then: check, summarise, remind in your own words.",
        input=ScheduleTurnInput,
        fn=schedule_turn,
        side_effect="write",
        risk="medium",
        cost=5,
        timeout_s=5.0,
    ),
    Tool(
        name="list_schedules",
        description="The scheduled jobs of this conversation: id, when they run next, what became of the last run.",
        input=_NoInput,
        fn=list_schedules,
        side_effect="read",
        timeout_s=5.0,
    ),
    Tool(
        name="cancel_schedule",
        description="Cancel one of this conversation's scheduled jobs by its id.",
        input=CancelScheduleInput,
        fn=cancel_schedule,
        side_effect="write",
        cost=5,
        timeout_s=5.0,
    ),
]
"""The scheduling tools."""
