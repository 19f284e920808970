"""Messenger's settings block, ``SWITCHBOARD_MESSENGER__*`` (and every YAML account of the channel)."""

from __future__ import annotations

from pydantic import SecretStr

from switchboard.settings.channels import ChannelSettings

__all__ = ["MessengerSettings"]


class MessengerSettings(ChannelSettings):
    """``SWITCHBOARD_MESSENGER__*``."""

    page_access_token: SecretStr | None = None
    app_secret: SecretStr | None = None
    verify_token: SecretStr | None = None
    graph_base_url: str = "https://graph.facebook.com/v23.0"
    page_id: str | None = None
    """The Facebook Page id (``entry[].id`` of its webhooks); looked up with ``GET /me`` when unset (needed in the
    YAML for every further account: one app URL serves them all)."""
    human_agent: bool = False
    """Outside the 24-hour window, send replies tagged ``HUMAN_AGENT`` (7 days; only where a person answers)."""

    @property
    def enabled(self) -> bool:  # noqa: D102
        return self.page_access_token is not None
