"""Vocabulary aliases shared by every layer."""

from typing import Annotated, Final, Literal, NewType, TypeAlias, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, StringConstraints

__all__ = [
    "CHANNEL_NAME_PATTERN",
    "SESSION_STATES",
    "AccountName",
    "AgentName",
    "BusyPolicy",
    "ChannelName",
    "MessageId",
    "SessionKey",
    "SessionState",
    "TenantId",
    "TimeZoneName",
]

CHANNEL_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"
"""What a channel name may be: it is a path segment (``/webhooks/<name>``), part of a session key and of
``SWITCHBOARD_<NAME>__*``, and written into JSON unescaped."""

ChannelName: TypeAlias = Annotated[str, StringConstraints(pattern=CHANNEL_NAME_PATTERN)]
"""A channel's name. Which channels exist is the channel registry's table (``switchboard.channels.registry``), not
a closed list here: a name is only checked for its shape."""

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

SessionState = Literal[
    "reasoning", "waiting_for_data", "waiting_for_approval", "retrying", "queued", "done", "taken_over"
]
"""What a session is doing, in the one vocabulary the console, its API and ``switchboard sessions`` all use.

``taken_over``: an operator holds it; ``reasoning``: a worker runs its turn; ``waiting_for_data``: the turn waits on
a tool call; ``retrying``: its last attempt failed or the provider asked to wait; ``waiting_for_approval``: a gated
action waits for a decision; ``queued``: messages wait for a worker; ``done``: nothing to do."""
SESSION_STATES: Final[tuple[SessionState, ...]] = get_args(SessionState)
"""Every :data:`SessionState`, in the order the console lists them."""


def _time_zone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {value!r}: use an IANA name such as UTC or Europe/Berlin") from None
    return value


TimeZoneName: TypeAlias = Annotated[str, AfterValidator(_time_zone)]
"""An IANA time zone (``UTC``, ``Europe/Berlin``), checked when configured."""
