"""The echo channel's settings block: ``SWITCHBOARD_ECHO__*`` and every YAML account of ``channels.echo``."""

from __future__ import annotations

from pydantic import SecretStr

from switchboard.settings.channels import ChannelSettings

__all__ = ["EchoSettings"]


class EchoSettings(ChannelSettings):
    """``SWITCHBOARD_ECHO__APP_ID``, ``__SECRET`` (signs webhooks) and ``__API_BASE_URL`` (where replies go)."""

    app_id: str | None = None
    secret: SecretStr | None = None
    api_base_url: str = "http://127.0.0.1:9"

    @property
    def enabled(self) -> bool:
        return self.secret is not None
