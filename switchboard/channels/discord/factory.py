"""Discord in the channel table: ``FACTORY`` (settings block, build, checks, fake), which the registry imports."""

from __future__ import annotations

from switchboard.channels.discord.adapter import DiscordChannel, problems
from switchboard.channels.discord.settings import DiscordSettings
from switchboard.channels.registry import BuildContext, ChannelFactory

__all__ = ["FACTORY"]


def _build(settings: DiscordSettings, context: BuildContext) -> DiscordChannel:
    return DiscordChannel(settings, context)


FACTORY: ChannelFactory[DiscordSettings] = ChannelFactory(
    name="discord",
    settings=DiscordSettings,
    build=_build,
    problems=problems,
    fake="switchboard.channels.discord.fake.platform",
)
"""Discord in the channel table."""
