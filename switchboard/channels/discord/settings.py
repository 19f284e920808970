"""Discord's settings block, ``SWITCHBOARD_DISCORD__*`` (and every YAML account of the channel)."""

from __future__ import annotations

from pydantic import SecretStr

from switchboard.settings.channels import ChannelSettings

__all__ = ["DiscordSettings"]


class DiscordSettings(ChannelSettings):
    """``SWITCHBOARD_DISCORD__*``."""

    bot_token: SecretStr | None = None
    public_key: str | None = None
    """The application's Ed25519 public key (hex), which verifies requests to the interactions endpoint."""
    application_id: str | None = None
    """Looked up with ``GET /applications/@me`` when unset."""
    api_base_url: str = "https://discord.com/api/v10"
    gateway: bool = True
    """Hold a gateway connection for ordinary messages (``false``: slash commands and buttons only)."""

    @property
    def enabled(self) -> bool:  # noqa: D102
        return self.bot_token is not None or self.public_key is not None
