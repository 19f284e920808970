"""A live status message on the user's channel, for a tool call that runs a while (a long shell command).

The core asks for it; the queue layer implements it (:mod:`switchboard.outbound.toolstatus`): the message goes through
the outbox, so a re-run of the call on any worker finds and edits the one an earlier attempt sent, and its updates
edit it under the chat's edit budget, shared by every worker (``docs/ARCHITECTURE.md §5``). A status message is
never the agent's reply: nothing of it enters the conversation history.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from switchboard.core.turn import TurnSink

__all__ = ["StatusMessage", "StatusMessages", "StatusSink"]


class StatusMessage(Protocol):
    """One status message of one tool call, kept up to date while the call runs.

    Its posts and edits reach the platform in the order they were asked for, one at a time, and each one asked
    completes even when its caller is cancelled or stops waiting: the final edit always lands after any update or
    post still in flight, and a post that lands after the call ended still takes the final state.
    """

    @property
    def edits(self) -> bool:
        """Whether the channel can edit a sent message; where it cannot, each :meth:`post` is a new message."""

    async def post(self, text: str) -> bool:
        """Send ``text`` as a new message (the first one posted is the one :meth:`edit` edits).

        Returns whether the message is there (an earlier attempt at the call may have sent it already).
        """

    async def edit(self, text: str, *, final: bool = False) -> bool:
        """Replace the text of the first posted message.

        An update takes a token of the chat's edit budget if one is there now and is skipped otherwise (``False``:
        try again later, with newer text); a ``final`` edit waits a little for a token, and is made either way, but
        never into a chat the platform holds (it waits the hold out, bounded). A message the platform says is gone
        is not edited again (``False``).
        """


class StatusMessages(Protocol):
    """Where a tool call finds its status message."""

    def open(self, name: str) -> StatusMessage:
        """The status message ``name``: stable across re-runs of the call, so a re-run edits the same message."""


@runtime_checkable
class StatusSink(TurnSink, Protocol):
    """A sink that can show tool calls' status messages on the conversation's channel.

    A sink without it shows none: a tool then says nothing while it runs.
    """

    @property
    def status(self) -> StatusMessages | None:
        """The conversation's status messages (``None``: the turn has no conversation to show them in)."""
