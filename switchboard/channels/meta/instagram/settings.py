"""Instagram's settings block, ``SWITCHBOARD_INSTAGRAM__*`` (and every YAML account of the channel)."""

from __future__ import annotations

from switchboard.channels.meta.settings import MetaAppSettings

__all__ = ["InstagramSettings"]


class InstagramSettings(MetaAppSettings):
    """``SWITCHBOARD_INSTAGRAM__*``."""

    account_id: str | None = None
    """The Instagram professional account id (``entry[].id`` of its webhooks); looked up with ``GET /me`` when
    unset (needed in the YAML for every further account: one app URL serves them all)."""
    human_agent: bool = False
    """Outside the 24-hour window, send replies tagged ``HUMAN_AGENT`` (7 days; only where a person answers)."""
