"""``switchboard migrate``: the steps moving a data set to the sharded layout (issue #26).

Minimal on this branch (the migrate helper owns this module: ``LAYOUT``, ``migrate``, ``check_layout``): only
:data:`STEPS`, in order.
"""

from __future__ import annotations

from switchboard.queue.migrations import tenant_tags

__all__ = ["STEPS"]

STEPS = (tenant_tags.step,)
"""Each ``step(r, tally)``: sync, on the one node, idempotent and resumable."""
