"""The echo channel in the channel table: ``FACTORY``, the module its one line names."""

from __future__ import annotations

from switchboard.channels.registry import ChannelFactory

from .adapter import CHANNEL, EchoChannel
from .settings import EchoSettings

__all__ = ["FACTORY"]


def _problems(block: EchoSettings) -> list[str]:
    return [] if block.app_id else ["echo: SWITCHBOARD_ECHO__APP_ID is not set; set it to the echo app's id"]


FACTORY: ChannelFactory[EchoSettings] = ChannelFactory(
    name=CHANNEL,
    settings=EchoSettings,
    build=lambda block, context: EchoChannel(block, context.account),
    problems=_problems,
    fake="tests.channels.echo.fake",
)
