"""``switchboard migrate``'s steps, in order (each idempotent and resumable; see the cluster plan §4.6)."""

from __future__ import annotations

from switchboard.queue.migrations import drain_queue

__all__ = ["STEPS"]

STEPS = (drain_queue.step,)
