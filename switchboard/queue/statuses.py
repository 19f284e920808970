"""Delivery and read reports from the platforms (WhatsApp statuses, Messenger and Instagram receipts).

They are not messages: each becomes a ``delivery_reported`` fact in its session's event log and a count for
``/metrics`` (``switchboard_delivery_statuses_total{status}``), written in one round trip by the ingest router
together with the request's messages (docs/ARCHITECTURE.md §4). A report's facts are not fenced: no worker owns
them, and a platform's retry may record one twice (the log is an audit trail, not a ledger).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import redis.asyncio as aioredis

from switchboard.channels.base import DeliveryStatus
from switchboard.core.events import DeliveryReported
from switchboard.queue.eventlog import encode_event
from switchboard.queue.keys import SessionKeys
from switchboard.types import SessionKey

__all__ = ["STATUS_COUNTERS", "record_statuses"]

STATUS_COUNTERS = {status: f"delivery_{status}" for status in ("sent", "delivered", "read", "failed")}
"""Status → its counter in the deployment's stats hash."""


async def record_statuses(
    redis: aioredis.Redis, reports: Sequence[tuple[SessionKey, DeliveryStatus]], *, maxlen: int, timeout_s: float
) -> None:
    """Append each report to its session's event log and count it, in one pipeline.

    Raises:
        TimeoutError: Redis did not confirm within ``timeout_s``.
        RedisError: Redis refused or went away.
    """
    if not reports:
        return
    now = time.time()
    async with asyncio.timeout(timeout_s), redis.pipeline(transaction=False) as pipe:
        for session, report in reports:
            event = DeliveryReported(
                at=now,
                channel=report.conversation.channel,
                status=report.status,
                platform_id=report.platform_id[:256],
                error=report.error[:200],
            )
            fields = {"kind": event.kind, "data": encode_event(event)}
            pipe.xadd(SessionKeys(session).events, fields, maxlen=maxlen, approximate=True)  # type: ignore[arg-type]
            pipe.hincrby(SessionKeys(session).shard.stats, STATUS_COUNTERS[report.status], 1)
        await pipe.execute()
