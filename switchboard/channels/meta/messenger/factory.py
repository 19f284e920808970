"""Messenger in the channel table: ``FACTORY`` (settings block, build, checks, fake), which the registry imports."""

from __future__ import annotations

from switchboard.channels.meta.messenger.adapter import MessengerChannel, problems
from switchboard.channels.meta.messenger.settings import MessengerSettings
from switchboard.channels.meta.webhook import HANDSHAKE_METHODS
from switchboard.channels.registry import BuildContext, ChannelFactory

__all__ = ["FACTORY"]


def _build(settings: MessengerSettings, context: BuildContext) -> MessengerChannel:
    return MessengerChannel(settings, context)


FACTORY: ChannelFactory[MessengerSettings] = ChannelFactory(
    name="messenger",
    settings=MessengerSettings,
    build=_build,
    problems=problems,
    fake="switchboard.channels.meta.messaging.fake.platform",
    webhook_methods=HANDSHAKE_METHODS,
)
"""Messenger in the channel table."""
