"""The web chat's settings block: empty (it is built in and always on)."""

from __future__ import annotations

from switchboard.settings.channels import ChannelSettings

__all__ = ["WebSettings"]


class WebSettings(ChannelSettings):
    """The web chat has no ``SWITCHBOARD_WEB__*`` settings: it is built in and always on."""

    @property
    def enabled(self) -> bool:  # noqa: D102
        return True
