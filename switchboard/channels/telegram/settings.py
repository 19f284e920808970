"""Telegram's settings block, ``SWITCHBOARD_TELEGRAM__*`` (and every YAML account of the channel)."""

from __future__ import annotations

from typing import Literal

from pydantic import SecretStr, field_validator

from switchboard.settings.channels import ChannelSettings

__all__ = ["TelegramSettings"]


class TelegramSettings(ChannelSettings):
    """``SWITCHBOARD_TELEGRAM__*``."""

    bot_token: SecretStr | None = None
    secret_token: SecretStr | None = None
    """Value Telegram echoes in ``X-Telegram-Bot-Api-Secret-Token``; 1–256 of ``A-Z a-z 0-9 _ -``."""
    api_base_url: str = "https://api.telegram.org"
    """Bot API root: the part before ``/bot<token>/<method>``."""
    bot_username: str | None = None
    """The bot's @username, used to notice mentions in groups (looked up with ``getMe`` when unset)."""
    transport: Literal["webhook", "polling"] = "webhook"
    """``webhook`` (Telegram posts to ``/webhooks/telegram``) or ``polling`` (``getUpdates``, for hosts without a
    public HTTPS URL; one poller per bot across every process)."""

    @field_validator("secret_token")
    @classmethod
    def _secret_charset(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            raw = v.get_secret_value()
            if not (1 <= len(raw) <= 256) or not all(c.isascii() and (c.isalnum() or c in "_-") for c in raw):
                raise ValueError("must be 1-256 characters of A-Z a-z 0-9 _ - (Telegram's rule for secret_token)")
        return v

    @property
    def enabled(self) -> bool:  # noqa: D102
        return self.bot_token is not None
