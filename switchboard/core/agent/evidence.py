"""The running turn as :class:`~switchboard.core.memory.evidence.TurnEvidence`: what a memory write may cite."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from switchboard.core.memory.evidence import SeenMessage, SeenToolResult
from switchboard.core.messages import InboundMessage
from switchboard.core.model import ChatMessage
from switchboard.core.turn import HistoryEntry

__all__ = ["ContextEvidence"]


class ContextEvidence:
    """Live view of a turn: its inbound messages, the loaded history, and the messages this run produced."""

    def __init__(
        self,
        inbound: Callable[[], Sequence[InboundMessage]],
        history: Callable[[], Sequence[HistoryEntry]],
        work: Callable[[], Sequence[ChatMessage]],
    ) -> None:
        self._inbound = inbound
        self._history = history
        self._work = work

    def messages(self) -> list[SeenMessage]:
        """The turn's messages and the user messages of the loaded history."""
        seen = [SeenMessage(message.id, message.text) for message in self._inbound()]
        history = self._history()  # outside text folded into a user entry is no word of the user
        seen += [SeenMessage(e.message_id or "", e.text) for e in history if e.role == "user" and not e.untrusted]
        return seen

    def tool_results(self) -> list[SeenToolResult]:
        """The tool results of this run, each with its call's tool name and arguments."""
        work = self._work()
        calls = {call.id: call for message in work if message.role == "assistant" for call in message.tool_calls}
        found: list[SeenToolResult] = []
        for message in work:
            if message.role != "tool" or not message.tool_call_id:
                continue
            call = calls.get(message.tool_call_id)
            found.append(
                SeenToolResult(
                    call_id=message.tool_call_id,
                    tool=call.name if call is not None else (message.name or ""),
                    arguments=call.arguments if call is not None else {},
                    text=message.content,
                )
            )
        return found
