"""What Redis holds, read for "nothing was written" and "this was queued" checks in attack tests."""

from __future__ import annotations

import redis

from switchboard.core.messages import InboundMessage

__all__ = ["keyspace", "stored"]


def keyspace(r: redis.Redis) -> list[bytes]:
    """Every key name, sorted: equal before and after a refused request when nothing was written."""
    return sorted(r.keys("*"))


def stored(r: redis.Redis) -> list[InboundMessage]:
    """Every inbound message the ingest holds, in any session."""
    found = []
    for key in r.keys("sb:*:messages"):
        found += [InboundMessage.model_validate_json(v) for v in r.hvals(key)]
    return found
