"""The web chat in the channel table: ``FACTORY`` (settings block, build, checks, fake), which the registry imports."""

from __future__ import annotations

from typing import Final

from switchboard.channels.registry import BuildContext, ChannelFactory
from switchboard.channels.web.adapter import WebChannel
from switchboard.channels.web.settings import WebSettings

__all__ = ["FACTORY"]


def _build(block: WebSettings, context: BuildContext) -> WebChannel:
    return WebChannel(context.publish, account=context.account, read_upload=context.read_upload)


FACTORY: Final = ChannelFactory(
    name="web", settings=WebSettings, build=_build, webhook_methods=frozenset(), builtin=True
)
"""The web chat: built in, always on, served by its own API rather than ``/webhooks/web``."""
