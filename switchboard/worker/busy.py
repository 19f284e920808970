"""What a drain does with messages that land while a turn runs: the ``interrupt`` and ``steer`` busy policies.

``interrupt`` cancels the running turn like a ``/stop`` and restarts it with everything waiting, under the same run id
(at most :data:`MAX_INTERRUPTS` times, so a flood cannot starve the session); ``steer`` hands new plain-text messages
to the running turn before each model call, acked with the turn. ``sequential`` and ``collect`` only decide what a
turn takes (``docs/ARCHITECTURE.md`` §5).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Final

from switchboard.core.messages import InboundMessage
from switchboard.queue.cancellation import interrupting_message
from switchboard.queue.ledger import MAX_COLLECT, MAX_INTERRUPTS, Attempt, Ledger
from switchboard.types import BusyPolicy

__all__ = ["INTERRUPTED_CODE", "INTERRUPTED_TEXT", "BusyTurn", "answered_part"]

logger = logging.getLogger(__name__)

INTERRUPTED_CODE: Final = "interrupted"
"""The ``SendError.code`` that ends a streamed partial reply whose turn a newer message interrupted."""
INTERRUPTED_TEXT: Final = "Interrupted by your newer message: the next reply answers both."
"""What a streaming channel shows where that partial reply ended."""


@dataclass(slots=True)
class BusyTurn:
    """The busy-policy state of the turn in flight in one drain (reset by :meth:`start` for every turn)."""

    policy: BusyPolicy = "sequential"
    head: str = ""
    taken: list[str] = field(default_factory=list)
    """Inbox entries the turn has, in inbox order: what ``begin`` took, then what was steered in."""
    interrupts: int = 0
    interrupted: bool = False
    """A newer message asked to stop the turn (set with the drain's stop event)."""
    steered: list[InboundMessage] = field(default_factory=list)
    steered_ids: list[str] = field(default_factory=list)
    steered_bodies: list[str] = field(default_factory=list)

    def start(self, attempt: Attempt) -> None:
        """A new turn begins with what ``begin`` took."""
        self.policy = attempt.policy
        self.head = attempt.ids[0] if attempt.ids else ""
        self.taken = list(attempt.ids)
        self.interrupts = attempt.interrupts
        self.interrupted = False
        self.steered, self.steered_ids, self.steered_bodies = [], [], []

    def interrupt(self, reason: str) -> bool | None:
        """Judge a stop request: ``None`` for a real stop, else whether it interrupts this turn (it is then marked).

        An interrupt is ignored when the turn already holds the message that asked (the request raced the end of
        the turn before), and once the turn's head has been interrupted :data:`MAX_INTERRUPTS` times.
        """
        by = interrupting_message(reason)
        if by is None:
            return None
        if not self.head or by in self.taken or self.interrupts >= MAX_INTERRUPTS:
            return False
        self.interrupted = True
        return True

    async def take_steered(self, ledger: Ledger) -> list[InboundMessage]:
        """Under ``steer``, the messages that arrived behind the turn's since it last asked (read from Redis)."""
        if self.policy != "steer" or not self.head or len(self.taken) >= MAX_COLLECT:
            return []
        ids, bodies = await ledger.steer(self.head, len(self.taken))
        new = [InboundMessage.model_validate_json(body) for body in bodies if body]
        self.taken += ids
        self.steered_ids += ids
        self.steered_bodies += bodies
        self.steered += new
        if ids:
            logger.debug("steered %d message(s) into the running turn of %s", len(ids), ledger.lease.session)
        return new

    def answered(self, attempt: Attempt, messages: list[InboundMessage]) -> tuple[Attempt, list[InboundMessage]]:
        """The attempt and messages a finished turn acks: what ``begin`` took plus what was steered in."""
        if not self.steered_ids:
            return attempt, messages
        ids = [*attempt.ids, *self.steered_ids]
        bodies = [*attempt.bodies, *self.steered_bodies]
        return dataclasses.replace(attempt, ids=ids, bodies=bodies), [*messages, *self.steered]


def answered_part(
    attempt: Attempt, messages: list[InboundMessage], reply_to: str | None
) -> tuple[Attempt, list[InboundMessage]]:
    """What a reply an earlier attempt produced (and this one resumes) answered: no message that came later.

    ``begin`` folds everything waiting now, which may include messages that landed after that reply was written;
    acking those with it would lose them. The reply answered up to the message it replies to (the last its run
    took at the start), or as many as that run took with steered ones (:attr:`Attempt.took`), whichever is more.
    """
    if reply_to is None or reply_to not in attempt.ids:
        return attempt, messages
    n = max(attempt.ids.index(reply_to) + 1, attempt.took)
    if n >= len(attempt.ids):
        return attempt, messages
    kept = set(attempt.ids[:n])
    part = dataclasses.replace(attempt, ids=attempt.ids[:n], bodies=attempt.bodies[:n])
    return part, [m for m in messages if m.id in kept]
