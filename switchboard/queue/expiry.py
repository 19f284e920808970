"""Approvals past their expiry: the reaper tells each session, so its model tells the user the action did not happen.

The sweep reads every shard's :attr:`ShardKeys.approvals_due` up to now (the server's clock; merged, oldest expiry
first) and ingests, into each approval's session, an :class:`~switchboard.core.messages.OperatorActed` ``decide``
with verdict ``expire`` by ``switchboard`` (dedup key ``expire:<id>``). The worker applies it under the session
lease like any decision (:meth:`~switchboard.queue.approvals.RedisApprovals.approval_decide` records ``expired``
once, and removes the entry from the index); until then a later sweep's ingest is a duplicate, so the session gets
exactly one such message.
"""

from __future__ import annotations

import logging
from typing import Final

import redis.asyncio as aioredis

from switchboard.core.messages import OperatorActed
from switchboard.queue.approvals import parse_approval_member
from switchboard.queue.fanout import lowest
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys, ShardKeys, tenant_of
from switchboard.queue.operators import GATEWAY_PRINCIPAL, operator_message, session_conversation
from switchboard.settings import QueueSettings

__all__ = ["EXPIRY_BATCH", "ApprovalExpiry", "expiry_dedup_key"]

logger = logging.getLogger(__name__)

EXPIRY_BATCH: Final = 500
"""Due approvals handled per sweep (oldest expiry first); the rest wait for the next sweep."""


def _due(shard: ShardKeys) -> str:
    return shard.approvals_due


def expiry_dedup_key(approval_id: str) -> str:
    """The dedup key of an approval's expiry message (one per approval, whichever sweep sends it)."""
    return f"expire:{approval_id}"


class ApprovalExpiry:
    """Sends each due approval's expiry into its session (one reaper runs it at a time, under the reaper lock)."""

    def __init__(self, redis: aioredis.Redis, settings: QueueSettings) -> None:
        self.redis = redis
        self.ingestor = Ingestor(redis, settings)

    async def sweep(self) -> int:
        """Ingest the expiry of every due approval; returns how many were new (not duplicates)."""
        seconds, micros = await self.redis.time()
        now = seconds + micros / 1_000_000
        due = [member for member, _at in await lowest(self.redis, _due, EXPIRY_BATCH, through=now)]
        sent = 0
        for member in due:
            session, approval_id = parse_approval_member(member)
            shard = SessionKeys(session).shard
            status = await self.redis.hget(SessionKeys(session).approval(approval_id), "status")
            if status not in (b"pending", "pending"):
                # the record is gone (past its retention) or no longer pending: a left-over entry nothing would ever
                # remove, holding a place in every batch ahead of the approvals really due
                await self.redis.zrem(shard.approvals_due, member)
                await self.redis.zrem(shard.approvals_pending(tenant_of(session)), member)
                await self.redis.zrem(SessionKeys(session).approvals, approval_id)
                continue
            conversation = await session_conversation(self.redis, session)
            if conversation is None:  # not a session any channel can hold: nothing could ever apply it
                await self.redis.zrem(shard.approvals_due, member)
                logger.warning("dropped the expiry of approval %s: %s is not a session key", approval_id, session)
                continue
            event = OperatorActed(
                action="decide", operator=GATEWAY_PRINCIPAL, approval_id=approval_id, verdict="expire"
            )
            message = operator_message(conversation, event, dedup_key=expiry_dedup_key(approval_id))
            result = await self.ingestor.ingest(message)
            sent += not result.duplicate
        if sent:
            logger.info("sent the expiry of %d approvals into their sessions", sent)
        return sent
