"""What a drain holds for the turn in flight, and how a drain ends (shared by :mod:`.drain` and :mod:`.endings`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum

from switchboard.core.messages import ConversationRef
from switchboard.outbound.outbox import Outbox
from switchboard.outbound.streaming import ReplyStream
from switchboard.queue.lease import LeaseToken
from switchboard.queue.ledger import Ledger
from switchboard.worker.busy import BusyTurn

__all__ = ["DrainOutcome", "DrainTurn"]


class DrainOutcome(Enum):
    """How a drain ended (the worker decides what happens to the drain job from it)."""

    RELEASED = "released"
    """The inbox was empty: lease, drain flag and runnable mark removed, and the drain's job closed, in one step."""
    BUSY = "busy"
    """Another live holder has the lease; it drains the session."""
    FENCED = "fenced"
    """The lease passed to another epoch mid-drain; this drain stopped before its next side effect."""
    HANDED_OVER = "handed_over"
    """The worker is stopping: the lease was given up between turns; the session needs a new drain job."""
    YIELDED = "yielded"
    """Other sessions were waiting: the lease was given up, a new drain job queued at the back and this drain's job
    closed, in one step."""
    DEFERRED = "deferred"
    """The model provider asked to wait: the head was put off and the lease given up; the reaper resumes it."""


@dataclass(slots=True)
class DrainTurn:
    """What one drain holds while it runs a turn."""

    lease: LeaseToken
    lost: asyncio.Event
    ledger: Ledger
    conversation: ConversationRef | None = None
    reply_to: str | None = None
    run_id: str = ""
    deltas: int = 0
    acts: int = 0
    outbox: Outbox | None = None
    stream: ReplyStream | None = None
    """The streaming policy of the turn in flight (set once its conversation is known)."""
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a stop was asked (``/stop``, console, or a newer message under ``interrupt``) for the turn in flight."""
    busy: BusyTurn = field(default_factory=BusyTurn)
    """What the ``interrupt`` and ``steer`` busy policies track of the turn in flight."""
    stop_reason: str = ""
    stopped_at: float | None = None
    """When this drain last cancelled a turn on request (answers the ``/stop`` message that asked)."""
    stop_shown: bool = False
    """Whether the turn last cancelled on request showed the user it stopped (its streamed reply says so)."""
    yield_after: bool = False
    """Fairness: the turn in flight ends the session's share while others wait (its completion yields the slot)."""
    yield_elsewhere: bool = False
    """With :attr:`yield_after`: drains of the worker's other shards wait, so the completion yields even when the
    session's own shard queue is empty."""
    typing: list[asyncio.Task[None] | asyncio.TimerHandle] = field(default_factory=list)
