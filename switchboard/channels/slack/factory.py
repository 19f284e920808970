"""Slack in the channel table: ``FACTORY`` (settings block, build, checks, fake), which the registry imports."""

from __future__ import annotations

from switchboard.channels.registry import BuildContext, ChannelFactory
from switchboard.channels.slack.adapter import SlackChannel, problems
from switchboard.channels.slack.settings import SlackSettings

__all__ = ["FACTORY"]


def _build(settings: SlackSettings, context: BuildContext) -> SlackChannel:
    return SlackChannel(
        settings,
        account=context.account,
        require_mention=context.require_mention,
        groups=context.groups,
        agent=context.agent,
        tenant=context.tenant,
    )


FACTORY: ChannelFactory[SlackSettings] = ChannelFactory(
    name="slack",
    settings=SlackSettings,
    build=_build,
    problems=problems,
    fake="switchboard.channels.slack.fake.platform",
)
"""Slack in the channel table."""
