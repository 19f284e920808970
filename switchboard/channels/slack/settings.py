"""Slack's settings block, ``SWITCHBOARD_SLACK__*`` (and every YAML account of the channel)."""

from __future__ import annotations

from pydantic import SecretStr

from switchboard.settings.channels import ChannelSettings

__all__ = ["SlackSettings"]


class SlackSettings(ChannelSettings):
    """``SWITCHBOARD_SLACK__*``."""

    bot_token: SecretStr | None = None
    signing_secret: SecretStr | None = None
    """Verifies the Events API's HTTP requests (``X-Slack-Signature``)."""
    app_token: SecretStr | None = None
    """App-level token (``xapp-…``): Socket Mode instead of the HTTP endpoint (one connection holder across
    processes)."""
    api_base_url: str = "https://slack.com/api/"

    @property
    def enabled(self) -> bool:
        """A bot token, and a way to receive: the signing secret (HTTP) or an app token (Socket Mode)."""
        return self.bot_token is not None and (self.signing_secret is not None or self.app_token is not None)
