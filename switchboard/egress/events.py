"""The fact recorded for every request egress handles, and where it goes.

An :class:`~switchboard.core.events.EgressRequested` (a member of the session event log's union) names the agent,
session, method, host, port, path (never the query string), status, bytes each way, the decision and its reason, and
the *names* of the secrets injected — never a header value, a body or a secret's value. :class:`RedisEgressSink`
appends it to the session's event log and counts it in the deployment-wide figures that ``/metrics`` shows
(``switchboard_egress_allowed``, ``switchboard_egress_refused``).
"""

from __future__ import annotations

from typing import Any, Protocol

import redis.asyncio as aioredis

from switchboard.core.events import EgressDecision as Decision
from switchboard.core.events import EgressRequested, EventAdapter
from switchboard.queue.keys import SessionKeys, ShardKeys
from switchboard.types import SessionKey

__all__ = ["Decision", "EgressRequested", "EgressSink", "RedisEgressSink"]


class EgressSink(Protocol):
    """Where egress facts go (the session event log and the counters in production; a list in tests)."""

    async def record(self, event: EgressRequested) -> None:
        """Keep one fact; must not raise for a storage hiccup that should not fail the request."""


class RedisEgressSink:
    """Appends each fact to its session's event log and counts it in the deployment-wide figures."""

    def __init__(self, redis: aioredis.Redis, *, maxlen: int = 2_000) -> None:
        """Write through ``redis``; each session's log is capped near ``maxlen`` entries."""
        self.redis = redis
        self.maxlen = maxlen

    async def record(self, event: EgressRequested) -> None:
        """XADD to the session's log (when the request had one) and HINCRBY the decision's counter."""
        stats = ShardKeys.every()[0].stats  # a request of no session counts in any shard: a read sums them all
        async with self.redis.pipeline(transaction=False) as pipe:
            if event.session:
                keys = SessionKeys(SessionKey(event.session))
                fields: dict[Any, Any] = {"kind": event.kind, "data": EventAdapter.dump_json(event).decode()}
                pipe.xadd(keys.events, fields, maxlen=self.maxlen, approximate=True)
                stats = keys.shard.stats
            pipe.hincrby(stats, f"egress_{event.decision}", 1)
            await pipe.execute()
