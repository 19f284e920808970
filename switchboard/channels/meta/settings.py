"""What the settings blocks of Meta's channels share (one app: token, secret, Graph API root)."""

from __future__ import annotations

from pydantic import SecretStr

from switchboard.settings.channels import ChannelSettings

__all__ = ["MetaAppSettings"]


class MetaAppSettings(ChannelSettings):
    """What WhatsApp's and Instagram's blocks share: one Meta app's token, secret and Graph API root."""

    access_token: SecretStr | None = None
    app_secret: SecretStr | None = None
    verify_token: SecretStr | None = None
    graph_base_url: str = "https://graph.facebook.com/v23.0"

    @property
    def enabled(self) -> bool:  # noqa: D102
        return self.access_token is not None
