"""``switchboard migrate``: the steps that move a layout-1 data set to the sharded layout, in order.

Each step is ``step(r, tally)``: a sync client on the single node and a tally it counts in; idempotent and resumable.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import redis

from switchboard.queue.migrations import shard_indexes

__all__ = ["STEPS", "Step"]

Step = Callable[[redis.Redis, collections.Counter[str]], None]
"""One migration step."""

STEPS: tuple[Step, ...] = (shard_indexes.step,)
"""The steps in order (sessions → shard indexes → tenant tags → drain queue; each helper adds its own)."""
