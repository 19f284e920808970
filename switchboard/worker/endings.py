"""How a drained turn ends, other than by running: finished, resumed, stopped, failed, deferred or dead-lettered.

:class:`TurnEndings` is a part of :class:`~switchboard.worker.drain.Drainer`; every step writes through the turn's
fenced :class:`Ledger`, and the model is never re-run for a send.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

import redis.asyncio as aioredis

from switchboard.channels.base import Receipt
from switchboard.core.actions import Action, SendError, SendText, SetStatus, StreamText
from switchboard.core.agent.config import Agent
from switchboard.core.events import SendDeadLettered
from switchboard.core.messages import ConversationRef, InboundMessage
from switchboard.core.turn import HistoryEntry
from switchboard.errors import DeliveryError, ModelError
from switchboard.outbound.deliver import Deliverer
from switchboard.outbound.notices import (
    DEAD_LETTER_CODE,
    DEFER_NOTICE_S,
    FailureKind,
    dead_letter_text,
    deferred_text,
    failure_kind,
    undelivered_text,
)
from switchboard.outbound.outbox import Outbox, PendingSend, idempotency_key
from switchboard.outbound.sending import Undelivered, deliver_reply
from switchboard.outbound.streaming import PREVIEW
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease
from switchboard.queue.ledger import Attempt
from switchboard.queue.segments import SegmentLabels, run_field
from switchboard.settings import QueueSettings
from switchboard.worker.busy import INTERRUPTED_CODE, INTERRUPTED_TEXT
from switchboard.worker.drainturn import DrainOutcome, DrainTurn

__all__ = ["TurnEndings", "end_interrupted"]

logger = logging.getLogger(__name__)


def _error_text(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= 300 else text[:297] + "..."


class TurnEndings:
    """The ending steps of :class:`~switchboard.worker.drain.Drainer` (a base class, not used on its own).

    - **finished**: the reply was delivered, or its send dead-lettered (the turn is completed either way: the model is
      never re-run for a send, see :mod:`switchboard.outbound.sending`);
    - **resumed**: an earlier attempt produced the reply and died before completing the turn; the send is resumed
      from the outbox record;
    - **failed**: the attempt is logged and retried after a back-off, up to ``max_attempts``; a model provider asking
      to wait (``ModelError.retry_after``) defers the turn instead (see :meth:`TurnEndings._defer`);
    - **dead-lettered**: the message is set aside with its reason, and the user is told what kind of failure it was.
    """

    redis: aioredis.Redis
    settings: QueueSettings
    lease: Lease
    deliverer: Deliverer
    _sleep: Callable[[float], Awaitable[None]]
    agent_for: Callable[[InboundMessage], Agent]
    labels: SegmentLabels

    def _run_field(self, messages: Sequence[InboundMessage], outcome: Literal["failed", "cancelled"]) -> str:
        """The stats field counting this outcome for the turn's agent and tenant (segmented metrics)."""
        if not messages:
            return ""
        try:
            agent = self.agent_for(messages[0]).name
        except Exception:  # counting a failure must never hide it: the agent is then counted as "other"
            agent = ""
        return run_field(self.labels, agent, messages[0].conversation.tenant, outcome)

    async def _notify(self, turn: DrainTurn, action: Action, logical: str) -> None:
        raise NotImplementedError  # the drainer's

    async def _pause(self, turn: DrainTurn, delay: float) -> None:
        """Wait ``delay`` seconds, or less when the lease is lost meanwhile (the next fenced step stops the drain)."""
        if delay <= 0:
            return
        lost = asyncio.ensure_future(turn.lost.wait())
        pause = asyncio.ensure_future(self._sleep(delay))
        try:
            await asyncio.wait({lost, pause}, return_when="FIRST_COMPLETED")
        finally:
            lost.cancel()
            pause.cancel()

    async def _deliver(
        self,
        turn: DrainTurn,
        outbox: Outbox,
        reply: SendText | StreamText,
        conversation: ConversationRef,
        *,
        facts: str = "",
        attempts_made: int = 0,
    ) -> Receipt | Undelivered:
        """Send the turn's reply durably (:func:`~switchboard.outbound.sending.deliver_reply`), pausing by the lease."""
        return await deliver_reply(
            outbox,
            reply,
            conversation,
            run_id=turn.run_id,
            settings=self.settings,
            pause=lambda delay: self._pause(turn, delay),
            facts=facts,
            attempts_made=attempts_made,
        )

    async def _finish(
        self,
        turn: DrainTurn,
        attempt: Attempt,
        messages: Sequence[InboundMessage],
        outbox: Outbox,
        *,
        text: str,
        sent: Receipt | Undelivered | None,
        started: float,
        work: Sequence[HistoryEntry] = (),
    ) -> None:
        """Complete the turn: its reply was delivered (``Receipt``), dead-lettered (``Undelivered``) or empty.

        ``work`` is the turn's tool calls and results, stored in the history before the answer.
        """
        undelivered: SendDeadLettered | None = None
        if isinstance(sent, Undelivered):
            undelivered = SendDeadLettered(message_id=turn.reply_to, attempts=sent.attempts, reason=sent.reason)
            await self._tell(turn, outbox, SendError(code="undelivered", message=undelivered_text()), "undelivered")
        statuses = turn.stream is not None and turn.stream.caps.statuses
        remaining = await turn.ledger.complete(
            attempt,
            messages,
            reply_text=text,
            reply_to=turn.reply_to,
            receipt=sent if isinstance(sent, Receipt) else None,
            started=started,
            outbox_keys=outbox.used,
            undelivered=undelivered,
            work=work,
            release=not statuses,  # a channel that shows the idle status is told first, under the lease
            yield_slot=turn.yield_after,
            yield_elsewhere=turn.yield_elsewhere,
            next_history=self.settings.history_maxlen,  # the drain's next attempt, in the same step
        )
        if remaining == 0 and statuses:
            await self._notify(turn, SetStatus(status="idle", reply_to=turn.reply_to), "status:idle")

    async def _resume(
        self,
        turn: DrainTurn,
        attempt: Attempt,
        messages: Sequence[InboundMessage],
        outbox: Outbox,
        pending: PendingSend,
    ) -> None:
        """An earlier attempt produced the reply and died before completing the turn: finish its send, not the run."""
        started = time.time()
        reply = pending.action
        assert isinstance(reply, SendText | StreamText)
        logger.info("resuming the %s reply of %s (%d send attempts made)", pending.state, turn.run_id, pending.attempts)
        sent: Receipt | Undelivered
        if pending.state == "sent":
            sent = Receipt(parts=pending.parts)
        else:
            conversation = messages[-1].conversation
            sent = await self._deliver(turn, outbox, reply, conversation, attempts_made=pending.attempts)
        await self._finish(turn, attempt, messages, outbox, text=reply.text, sent=sent, started=started)

    async def _stopped(
        self,
        turn: DrainTurn,
        attempt: Attempt,
        messages: Sequence[InboundMessage],
        outbox: Outbox,
        started: float,
        reason: str,
    ) -> None:
        """A turn stopped on request: recorded as cancelled, not retried; a streamed partial reply is closed."""
        turn.stopped_at = time.time()
        for pending in turn.typing:
            pending.cancel()
        turn.typing.clear()
        # what streamed so far is closed, with the notice; the /stop behind it then says nothing more
        turn.stop_shown = turn.stream is not None and await turn.stream.stopped()
        remaining = await turn.ledger.complete(
            attempt,
            messages,
            reply_text="",
            reply_to=turn.reply_to,
            receipt=None,
            started=started,
            outbox_keys=outbox.used,
            cancelled=reason,
            segment=self._run_field(messages, "cancelled"),
        )
        if remaining == 0:
            await self._notify(turn, SetStatus(status="idle", reply_to=turn.reply_to), "status:idle")

    async def _failed(
        self,
        turn: DrainTurn,
        attempt: Attempt,
        messages: Sequence[InboundMessage],
        outbox: Outbox,
        err: Exception,
    ) -> DrainOutcome | None:
        """Log a failed attempt and back off before the next, or defer the turn, or dead-letter the message."""
        text = _error_text(err)
        logger.warning("run %s attempt %d failed: %s", turn.run_id, attempt.attempt, type(err).__name__)
        kind = failure_kind(err)
        delay = self.settings.retry_backoff_s * 2 ** (attempt.attempt - 1)
        wait = err.retry_after if isinstance(err, ModelError) and err.retryable and err.retry_after else 0.0
        if wait > delay:
            if wait > self.settings.max_defer_s:
                reason = (
                    f"the model provider asked to wait {wait:.0f} s, longer than SWITCHBOARD_QUEUE__MAX_DEFER_S "
                    f"({self.settings.max_defer_s:.0f} s): {text}"
                )[:300]
                await turn.ledger.fail(attempt, reason, segment=self._run_field(messages, "failed"))
                await self._dead_letter(turn, attempt, messages, outbox, reason, attempt.attempt, kind)
                return None
            deferred = await self._defer(turn, attempt, wait, text)
            if deferred is not None:
                return deferred
        await turn.ledger.fail(attempt, text, segment=self._run_field(messages, "failed"))
        if attempt.attempt >= self.settings.max_attempts:
            await self._dead_letter(turn, attempt, messages, outbox, text, attempt.attempt, kind)
            return None
        await self._pause(turn, max(delay, wait))
        return None

    async def _defer(self, turn: DrainTurn, attempt: Attempt, wait: float, text: str) -> DrainOutcome | None:
        """Put the turn off by the provider's ``retry_after`` without holding a slot; tell the user the first time.

        (Only a wait of :data:`~switchboard.outbound.notices.DEFER_NOTICE_S` or more is worth a notice.)

        The attempt is handed back and the lease given up; the reaper gives the session a new drain job once the
        wait is over (:attr:`ShardKeys.deferred`), so the session's later messages stay behind it. ``None``
        when the message was already deferred ``max_attempts`` times (it then fails like any attempt).
        """
        until = time.time() + wait
        reason = f"rate-limited by the model provider: {text}"[:300]
        deferrals = await turn.ledger.defer(
            attempt, until=until, reason=reason, max_deferrals=self.settings.max_attempts
        )
        if deferrals == 0:
            return None
        logger.info("run %s deferred %.0f s at the model provider's request", turn.run_id, wait)
        if deferrals == 1 and wait >= DEFER_NOTICE_S:
            notice = SendText(text=deferred_text(wait), reply_to=turn.reply_to)
            await self._notify(turn, notice, f"deferred:{attempt.ids[0]}")
        await self.lease.abandon(turn.lease)
        return DrainOutcome.DEFERRED

    async def _still_deferred(self, turn: DrainTurn, attempt: Attempt) -> bool:
        """Whether the session's head was put off and is not due yet (then the drain gives it back untouched)."""
        deferred = SessionKeys(turn.lease.session).shard.deferred
        due = await self.redis.zscore(deferred, turn.lease.session)
        if due is None:
            return False
        if float(due) > time.time():
            await self.lease.abandon(turn.lease, return_attempt_of=attempt.ids[0])
            return True
        await self.redis.zrem(deferred, turn.lease.session)
        return False

    async def _dead_letter(
        self,
        turn: DrainTurn,
        attempt: Attempt,
        messages: Sequence[InboundMessage],
        outbox: Outbox,
        reason: str,
        attempts: int,
        kind: FailureKind,
    ) -> None:
        logger.warning("dead-lettering %s after %d attempts", attempt.ids[0], attempts)
        if messages:
            notice = SendError(code=DEAD_LETTER_CODE, message=dead_letter_text(kind), reply_to=turn.reply_to)
            await self._tell(turn, outbox, notice, "dead_letter")
        remaining = await turn.ledger.dead_letter(attempt, reason=reason, attempts=attempts, outbox_keys=outbox.used)
        if remaining == 0:
            await self._notify(turn, SetStatus(status="idle", reply_to=turn.reply_to), "status:idle")

    async def _tell(self, turn: DrainTurn, outbox: Outbox, notice: SendError, logical: str) -> None:
        """Send a failure notice through the outbox (once), best effort: the platform may refuse it too."""
        if turn.conversation is None:
            return
        notice = notice.model_copy(update={"reply_to": turn.reply_to})
        try:
            await outbox.send(notice, turn.conversation, run_id=turn.run_id, logical=logical)
        except DeliveryError as err:
            logger.info("%s notice for %s not delivered: %s", logical, turn.lease.session, type(err).__name__)


async def end_interrupted(turn: DrainTurn, attempt: Attempt, outbox: Outbox, reason: str) -> None:
    """End a turn a newer message interrupted: nothing acked, a streamed partial reply closed, the attempt returned.

    The drain then goes on: its next ``begin`` restarts the turn with the interrupted messages and everything waiting.
    """
    for pending in turn.typing:
        pending.cancel()
    turn.typing.clear()
    if turn.stream is not None:
        await turn.stream.stopped(code=INTERRUPTED_CODE, notice=INTERRUPTED_TEXT, restarts=True)
    preview = idempotency_key(turn.run_id, PREVIEW)  # kept: the restarted turn edits that same preview message
    done = [key for key in outbox.used if key != preview]
    n = await turn.ledger.interrupt(attempt, reason=reason, outbox_keys=done)
    logger.info("run %s interrupted by a newer message (%d so far)", turn.run_id, n)
