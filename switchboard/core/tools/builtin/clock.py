"""The ``current_time`` tool: today's date and the time, in UTC or an IANA time zone."""

from __future__ import annotations

import datetime as dt
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator

from switchboard.core.tools.definition import Tool, ToolContext

__all__ = ["TOOLS", "CurrentTimeInput", "current_time"]


class CurrentTimeInput(BaseModel):
    """Arguments of ``current_time``."""

    model_config = ConfigDict(extra="forbid")

    timezone: str | None = Field(None, description="IANA time zone such as Europe/Paris; UTC when omitted.")

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip()
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r}: use an IANA name such as Europe/Paris or UTC") from None
        return value


def now_in(zone: str | None, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """The date and time in ``zone`` (UTC when ``None``), as the tool returns it."""
    instant = now or dt.datetime.now(dt.UTC)
    local = instant.astimezone(ZoneInfo(zone) if zone else dt.UTC)
    return {
        "iso": local.isoformat(timespec="seconds"),
        "date": local.date().isoformat(),
        "time": local.strftime("%H:%M:%S"),
        "weekday": local.strftime("%A"),
        "timezone": zone or "UTC",
        "utc_offset": local.strftime("%z"),
        "unix": int(instant.timestamp()),
    }


async def current_time(args: CurrentTimeInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: the current date and time."""
    return now_in(args.timezone)


TOOLS: list[Tool] = [
    Tool(
        name="current_time",
        description="The current date, time and weekday, in UTC or in the IANA time zone you name.",
        input=CurrentTimeInput,
        fn=current_time,
        side_effect="read",
        cost=1,
        timeout_s=2.0,
    )
]
"""The clock tools."""
