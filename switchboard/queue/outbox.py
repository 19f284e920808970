"""The outbox: idempotency records around every send, so a re-run turn sends no reply twice.

Each send has an idempotency key ``sha256(run_id, logical action, ordinal)``; because ``run_id`` is
stable across re-runs, a re-run computes the same keys. Records live in ``SessionKeys.outbox`` and
move ``claimed → sent``:

- before the platform call, a fenced claim: ``sent`` already → skip (an earlier attempt delivered it);
  ``claimed`` by an earlier attempt that never recorded the result → send again and count a possible
  *send-window duplicate* (the crash fell between the platform call and its record);
- right after the platform call, the ``sent`` record (the window between the two is kept tiny);
- a send that failed cleanly drops its claim, so a later retry is not counted as a duplicate.

``RateLimitedError.retry_after`` is honoured by retrying the send alone, never the model.
The key is also passed to the channel, which forwards it where the platform dedups (Discord ``nonce``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from switchboard.channels.base import Receipt
from switchboard.core.actions import Action
from switchboard.core.messages import ConversationRef
from switchboard.errors import DeliveryError, RateLimitedError
from switchboard.queue import scripts
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.lease import LeaseToken

__all__ = ["MAX_RATE_LIMIT_RETRIES", "Outbox", "SendOutcome", "idempotency_key"]

logger = logging.getLogger(__name__)

MAX_RATE_LIMIT_RETRIES = 5
"""Platform 429s honoured per send before the send counts as failed."""
_GLOBAL = GlobalKeys()

Perform = Callable[[Action, ConversationRef, str], Awaitable[Receipt]]


def idempotency_key(run_id: str, action: str, ordinal: int = 0) -> str:
    """``sha256(run_id, logical action, ordinal)`` as hex: the same for every re-run of a turn."""
    return hashlib.sha256(f"{run_id}\x1f{action}\x1f{ordinal}".encode()).hexdigest()


class SendOutcome:
    """What :meth:`Outbox.send` did."""

    __slots__ = ("key", "receipt", "skipped")

    def __init__(self, key: str, receipt: Receipt | None, skipped: bool) -> None:
        self.key = key
        self.receipt = receipt
        self.skipped = skipped
        """``True`` when an earlier attempt had already delivered this send."""


class Outbox:
    """Fenced, idempotent sends for one session under one lease."""

    def __init__(
        self,
        redis: aioredis.Redis,
        lease: LeaseToken,
        perform: Perform,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        events_maxlen: int = 2_000,
    ) -> None:
        self.redis = redis
        self.events_maxlen = events_maxlen
        """The session event log's cap, for facts that ride on a claim."""
        self.lease = lease
        self._perform = perform
        self._sleep = sleep
        self._keys = SessionKeys(lease.session)
        self.used: list[str] = []
        """Idempotency keys this outbox claimed (dropped from the record when the turn is acked)."""

    def _fenced_keys(self) -> list[str]:
        return [self._keys.lease, _GLOBAL.fenced_rejections, self._keys.outbox]

    async def send(
        self,
        action: Action,
        conversation: ConversationRef,
        *,
        run_id: str,
        logical: str,
        ordinal: int = 0,
        facts: str = "",
    ) -> SendOutcome:
        """Claim, perform and record one send.

        ``facts`` (:func:`~switchboard.queue.ledger.encode_facts`) are events the drain held back: the claim
        writes them first, in the same fenced step (one round trip fewer than writing them on their own).

        Raises:
            FencedWriteError: the lease passed to another epoch (nothing is sent).
            DeliveryError: the platform refused the send (the claim is dropped first).
        """
        key = idempotency_key(run_id, logical, ordinal)
        claimed = json.dumps({"state": "claimed", "epoch": self.lease.epoch, "kind": action.kind, "at": time.time()})
        keys = [*self._fenced_keys(), _GLOBAL.stats]
        args: list[scripts.ScriptArg] = [self.lease.token, key, claimed]
        if facts:
            keys.append(self._keys.events)
            args += [facts, self.events_maxlen]
        verdict = await scripts.OUTBOX_CLAIM(
            self.redis,
            keys,
            args,
            session=self.lease.session,
            epoch=self.lease.epoch,
        )
        self.used.append(key)
        if verdict in (b"sent", "sent"):
            return SendOutcome(key, None, skipped=True)
        if verdict in (b"reclaimed", "reclaimed"):
            logger.warning("re-sending %s for %s after an unrecorded earlier attempt", logical, self.lease.session)
        try:
            receipt = await self._perform_with_retries(action, conversation, key)
        except DeliveryError:
            # the platform refused it: nothing was delivered, so a retry is not a duplicate
            await self._record(key, "")
            raise
        sent = {
            "state": "sent",
            "epoch": self.lease.epoch,
            "kind": action.kind,
            "at": time.time(),
            "platform_ids": list(receipt.platform_ids),
        }
        await self._record(key, json.dumps(sent))
        return SendOutcome(key, receipt, skipped=False)

    async def _perform_with_retries(self, action: Action, conversation: ConversationRef, key: str) -> Receipt:
        for attempt in range(MAX_RATE_LIMIT_RETRIES + 1):
            try:
                return await self._perform(action, conversation, key)
            except RateLimitedError as err:
                if attempt == MAX_RATE_LIMIT_RETRIES:
                    raise
                logger.info("%s rate-limited; retrying the send in %.2f s", err.channel, err.retry_after)
                await self._sleep(max(err.retry_after, 0.0))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _record(self, key: str, record: str) -> None:
        await scripts.OUTBOX_RECORD(
            self.redis,
            self._fenced_keys(),
            [self.lease.token, key, record],
            session=self.lease.session,
            epoch=self.lease.epoch,
        )
