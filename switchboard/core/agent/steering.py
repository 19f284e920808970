"""④ Steering: messages the user sends while a turn runs reach that turn before its next model call.

The queue layer's sink (a :class:`~switchboard.core.turn.SteeringSink`) reads them; the runtime adds them to the
turn's conversation as the user's words (:func:`steered_in`), after whatever the turn did so far, so the next
request carries them. A turn's last call without tools keeps them among the user's messages
(:func:`steered_first`), never in the work log of tool calls.
"""

from __future__ import annotations

from collections.abc import Sequence

from switchboard.core.inbound import event_text
from switchboard.core.model import ChatMessage
from switchboard.core.protocols import conforms
from switchboard.core.turn import SteeringSink, TurnSink

__all__ = ["steered_first", "steered_in"]


async def steered_in(sink: TurnSink) -> list[ChatMessage]:
    """The user's messages the sink has for the running turn now, as one user message (none: an empty list)."""
    if not conforms(sink, SteeringSink):
        return []
    messages = await sink.steered()
    if not messages:
        return []
    texts = [text for m in messages if (text := event_text(m))]  # a click reads "chose option <id> (<label>)"
    return [ChatMessage(role="user", content="\n\n".join(texts))] if texts else []


def steered_first(messages: Sequence[ChatMessage], opening: int) -> tuple[list[ChatMessage], int]:
    """``messages`` with the steered ones moved to the end of the opening (``opening`` grown to match).

    The turn's own messages after the opening are assistant calls and tool results, plus the user's words steered in
    between them (the only user messages of their own trust class there).
    """
    head, turn = list(messages[:opening]), messages[opening:]
    steered = [m for m in turn if m.role == "user" and m.trust is None]
    if not steered:
        return [*head, *turn], opening
    rest = [m for m in turn if not (m.role == "user" and m.trust is None)]
    return [*head, *steered, *rest], opening + len(steered)
