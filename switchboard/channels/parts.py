"""The parts of one resumable send: what earlier attempts sent, and the one loop that sends the rest.

A reply longer than a platform's message limit goes out as several messages. Each is recorded (fenced, durable:
``SendContext.part_sent``) before the next is sent, so a retry on any worker resumes after the parts already sent
and never sends one twice. Every channel sends its parts through :class:`SentParts`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from switchboard.channels.base import Receipt, SendContext

__all__ = ["SentParts"]

P = TypeVar("P")


class SentParts:
    """The platform ids of one logical send so far: those earlier attempts recorded, then this attempt's.

    Args:
        send: The send's context (its ``sent`` are the ids recorded so far).
        skip: How many of the recorded ids belong to an earlier step of the same send and are not kept here.
    """

    __slots__ = ("_send", "ids")

    def __init__(self, send: SendContext, *, skip: int = 0) -> None:
        self._send = send
        self.ids: list[str] = list(send.sent[skip:])

    def __len__(self) -> int:
        return len(self.ids)

    async def record(self, platform_id: str) -> None:
        """Record one more part as sent (before the next is sent).

        Raises:
            FencedWriteError: the session's lease passed to another worker (stop sending).
        """
        await self._send.part_sent(platform_id)
        self.ids.append(platform_id)

    async def send(self, parts: Sequence[P], post: Callable[[int, P], Awaitable[str]], *, offset: int = 0) -> None:
        """Send each of ``parts`` not sent yet, in order, recording each.

        ``post(index, part)`` sends one part (waiting for its send tokens itself) and returns its platform id;
        ``offset`` counts the ids of this send that come before ``parts`` (a file before its caption's rest).
        """
        for index in range(max(len(self.ids) - offset, 0), len(parts)):
            await self.record(await post(index, parts[index]))

    def receipt(self, parts: int | None = None, **detail: str) -> Receipt:
        """The receipt of the parts sent so far (``parts``: how many the send counts, if not one per id)."""
        return Receipt(platform_ids=tuple(self.ids), parts=len(self.ids) if parts is None else parts, detail=detail)
