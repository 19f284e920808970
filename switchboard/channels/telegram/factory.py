"""Telegram in the channel table: ``FACTORY`` (settings block, build, checks, fake), which the registry imports."""

from __future__ import annotations

from switchboard.channels.registry import BuildContext, ChannelFactory
from switchboard.channels.telegram.adapter import TelegramChannel
from switchboard.channels.telegram.settings import TelegramSettings

__all__ = ["FACTORY"]


def _build(settings: TelegramSettings, context: BuildContext) -> TelegramChannel:
    return TelegramChannel(
        settings,
        account=context.account,
        require_mention=context.require_mention,
        groups=context.groups,
        agent=context.agent,
        tenant=context.tenant,
    )


def _problems(settings: TelegramSettings) -> list[str]:
    if settings.transport == "webhook" and settings.secret_token is None:
        return [
            "telegram: SWITCHBOARD_TELEGRAM__SECRET_TOKEN is not set; every webhook would be refused (choose 1-256 "
            "chars of A-Z a-z 0-9 _ - and run `switchboard telegram set-webhook URL`), or set "
            "SWITCHBOARD_TELEGRAM__TRANSPORT=polling on a host without a public HTTPS URL"
        ]
    return []


FACTORY: ChannelFactory[TelegramSettings] = ChannelFactory(
    name="telegram",
    settings=TelegramSettings,
    build=_build,
    problems=_problems,
    fake="switchboard.channels.telegram.fake.simulation",
    webhook_methods=frozenset({"POST"}),
)
"""The Telegram entry of the channel table (``switchboard.channels.registry``)."""
