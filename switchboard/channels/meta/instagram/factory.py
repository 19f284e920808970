"""Instagram in the channel table: ``FACTORY`` (settings block, build, checks, fake), which the registry imports."""

from __future__ import annotations

from switchboard.channels.meta.instagram.adapter import InstagramChannel, problems
from switchboard.channels.meta.instagram.settings import InstagramSettings
from switchboard.channels.meta.webhook import HANDSHAKE_METHODS
from switchboard.channels.registry import BuildContext, ChannelFactory

__all__ = ["FACTORY"]


def _build(settings: InstagramSettings, context: BuildContext) -> InstagramChannel:
    return InstagramChannel(settings, context)


FACTORY: ChannelFactory[InstagramSettings] = ChannelFactory(
    name="instagram",
    settings=InstagramSettings,
    build=_build,
    problems=problems,
    fake="switchboard.channels.meta.instagram.fake",
    webhook_methods=HANDSHAKE_METHODS,
)
"""Instagram in the channel table."""
