"""WhatsApp's settings block, ``SWITCHBOARD_WHATSAPP__*`` (and every YAML account of the channel)."""

from __future__ import annotations

from switchboard.channels.meta.settings import MetaAppSettings

__all__ = ["WhatsAppSettings"]


class WhatsAppSettings(MetaAppSettings):
    """``SWITCHBOARD_WHATSAPP__*``."""

    phone_number_id: str | None = None
    window_template: str | None = None
    """Approved template sent instead of a reply outside the 24-hour window, as ``name:language``
    (``hello_world:en_US``); unset: such a reply is not sent and a ``window_closed`` failure is recorded."""
