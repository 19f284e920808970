"""Scheduled jobs: an agent turn or a message, at a time or on a cron expression, in one conversation.

A job is created by an operator (the YAML ``schedules:`` block, ``switchboard schedules add``, the console API) or by
the agent itself (the ``schedule_message`` / ``schedule_turn`` tools). Each occurrence is delivered into the job's
session through the same ingest path as a user's message (:mod:`switchboard.queue.schedules` claims and fires them),
as a :class:`~switchboard.core.messages.Scheduled` event. This module is the pure part: the job's validated shape and
when it next runs (cron expressions by ``croniter``, in the job's IANA time zone).
"""

from __future__ import annotations

import datetime as dt
from typing import Final, Literal
from zoneinfo import ZoneInfo

from croniter import CroniterBadCronError, croniter
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from switchboard.types import TimeZoneName

__all__ = [
    "JOB_ID_PATTERN",
    "MAX_TEXT_CHARS",
    "JobTarget",
    "ScheduleSpec",
    "Template",
    "next_after",
    "occurrence_key",
]

JOB_ID_PATTERN: Final = r"^[A-Za-z0-9_.:-]{1,64}$"
MAX_TEXT_CHARS: Final = 4000
"""Longest text of a job (a prompt or a message)."""


class Template(BaseModel):
    """An approved WhatsApp message template, sent instead of the text outside the 24-hour window."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9_]{1,512}$")
    """The template's name as approved in WhatsApp Manager (lower case, digits, underscores)."""
    language: str = Field(pattern=r"^[A-Za-z]{2,3}(_[A-Za-z0-9]{2,4})?$")
    """Its language code (``en_US``, ``de``)."""

    def spelled(self) -> str:
        """``name:language``, as the WhatsApp channel's ``window_template`` spells it."""
        return f"{self.name}:{self.language}"


class JobTarget(BaseModel):
    """The conversation a job's occurrences go into (what its session key is made of)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    channel: str = Field(pattern=r"^[a-z0-9_]{1,32}$")
    conversation: str = Field(min_length=1, max_length=256)
    """The platform's conversation id (a WhatsApp number, a Telegram chat id, a web chat session id)."""
    account: str = Field("default", min_length=1, max_length=64)
    agent: str = Field("", max_length=64)
    """The agent of the session (empty: the tenant's default agent)."""
    thread: str | None = Field(None, max_length=256)


class ScheduleSpec(BaseModel):
    """One scheduled job as an operator or an agent states it.

    Exactly one of ``at`` (once) and ``cron`` (recurring) is given.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=JOB_ID_PATTERN)
    """Unique within the gateway; an occurrence's message id is derived from it and the occurrence time."""
    tenant: str = Field("default", min_length=1, max_length=64)
    target: JobTarget
    action: Literal["turn", "message"]
    """``turn``: the agent runs a turn on ``text`` (a prompt only it reads); ``message``: ``text`` is sent as it is."""
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    at: dt.datetime | None = None
    """When a one-off job runs (ISO 8601; a time without an offset is read in ``timezone``)."""
    cron: str | None = None
    """A five-field cron expression (``0 9 * * mon-fri``), read in ``timezone``."""
    timezone: TimeZoneName = "UTC"
    """IANA time zone of ``cron`` and of an ``at`` without an offset."""
    misfire: Literal["run_once", "skip"] = "run_once"
    """An occurrence found more than ``grace_s`` late (the gateway was down): run it once anyway, or skip it."""
    grace_s: int = Field(300, ge=0, le=7 * 24 * 3600)
    """How late an occurrence may still run as if on time."""
    template: Template | None = None
    """WhatsApp: the approved template sent when the 24-hour window is closed (without one such an occurrence is not
    delivered, and says why)."""
    created_by: str = Field("operator", max_length=200)
    """Who made the job: ``operator``, ``console:<name>``, ``api``, or ``agent:<session>``."""
    role: Literal["guest", "user"] | None = None
    """The role its turns act with: the role of the turn whose agent made the job, at most ``user``, whoever writes
    the job (``None``: an operator's job, whose turns act as ``user``)."""

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = " ".join(value.split())
        if len(value.split()) != 5 or not croniter.is_valid(value):
            raise ValueError(f"not a five-field cron expression: {value!r} (e.g. '0 9 * * mon-fri')")
        return value

    @model_validator(mode="after")
    def _one_when(self) -> ScheduleSpec:
        if (self.at is None) == (self.cron is None):
            raise ValueError("give exactly one of 'at' (a one-off time) and 'cron' (a recurring expression)")
        return self

    def first_at(self, now: float) -> float | None:
        """The first occurrence (Unix time) at or after the job's creation at ``now``; ``None``: never runs."""
        if self.at is not None:
            at = self.at if self.at.tzinfo else self.at.replace(tzinfo=ZoneInfo(self.timezone))
            return at.timestamp()
        return next_after(self, now)


def next_after(spec: ScheduleSpec, after: float) -> float | None:
    """The job's next occurrence strictly after ``after`` (Unix time); ``None`` for a one-off job."""
    if spec.cron is None:
        return None
    zone = ZoneInfo(spec.timezone)
    start = dt.datetime.fromtimestamp(after, zone)
    try:
        following: dt.datetime = croniter(spec.cron, start).get_next(dt.datetime)
    except CroniterBadCronError as err:  # validated on the way in; a stored job from another version
        raise ValueError(f"job {spec.id}: {err}") from None
    return following.timestamp()


def occurrence_key(job_id: str, due_at: float) -> str:
    """The dedup key of one occurrence: a second fire of the same occurrence is a duplicate at ingest."""
    return f"schedule:{job_id}:{round(due_at * 1000)}"
