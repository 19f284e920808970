"""Vocabulary aliases shared by every layer."""

from typing import Literal, NewType

__all__ = [
    "AccountName",
    "AgentName",
    "BusyPolicy",
    "ChannelName",
    "MessageId",
    "SessionKey",
    "TenantId",
]

ChannelName = Literal["telegram", "slack", "discord", "teams", "whatsapp", "instagram", "messenger", "web"]
"""Every channel the gateway knows; the web chat is built in."""

SessionKey = NewType("SessionKey", str)
"""``tenant/agent/channel/account/conversation[/thread]``; see :func:`switchboard.core.messages.session_key`."""

MessageId = NewType("MessageId", str)
"""Gateway-assigned id of an accepted inbound message."""

TenantId = str
AgentName = str
AccountName = str

BusyPolicy = Literal["sequential", "collect", "interrupt", "steer"]
"""What happens to messages that arrive while a session runs: one run each (``sequential``), folded into the next
run (``collect``), cancelling the running turn, which restarts with everything waiting (``interrupt``), or handed to
the running turn at its next step (``steer``)."""
