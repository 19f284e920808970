"""WhatsApp in the channel table: ``FACTORY`` (settings block, build, checks, fake), which the registry imports."""

from __future__ import annotations

from switchboard.channels.meta.webhook import HANDSHAKE_METHODS
from switchboard.channels.meta.whatsapp.adapter import WhatsAppChannel, problems
from switchboard.channels.meta.whatsapp.settings import WhatsAppSettings
from switchboard.channels.registry import BuildContext, ChannelFactory

__all__ = ["FACTORY"]


def _build(settings: WhatsAppSettings, context: BuildContext) -> WhatsAppChannel:
    return WhatsAppChannel(settings, context)


FACTORY: ChannelFactory[WhatsAppSettings] = ChannelFactory(
    name="whatsapp",
    settings=WhatsAppSettings,
    build=_build,
    problems=problems,
    fake="switchboard.channels.meta.whatsapp.fake.platform",
    webhook_methods=HANDSHAKE_METHODS,
)
"""WhatsApp in the channel table."""
