"""⑤ Delivering a finished turn's reply: the send alone is retried, never the model.

The reply is a durable outbox record from its first claim. A retryable failure backs off and tries again; a
permanent refusal, the last attempt, or a platform wait over ``SWITCHBOARD_QUEUE__MAX_DEFER_S`` dead-letters the send
while the turn still completes. A worker that dies meanwhile leaves the record, and the next attempt at the turn
resumes the send at the next part.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from switchboard.channels.base import Receipt
from switchboard.core.actions import SendText, StreamText
from switchboard.core.messages import ConversationRef
from switchboard.errors import DeliveryError, RateLimitedError
from switchboard.outbound.outbox import Outbox
from switchboard.settings import QueueSettings

__all__ = ["REPLY", "Undelivered", "deliver_reply"]

logger = logging.getLogger(__name__)

REPLY = "reply"
"""The logical name of a turn's reply in the outbox (its idempotency key is ``(run_id, "reply")``)."""


@dataclass(frozen=True, slots=True)
class Undelivered:
    """A reply whose send was dead-lettered."""

    reason: str
    attempts: int
    permanent: bool
    """The platform refused it for good (``retryable=False``), rather than failing every attempt."""


async def deliver_reply(
    outbox: Outbox,
    reply: SendText | StreamText,
    conversation: ConversationRef,
    *,
    run_id: str,
    settings: QueueSettings,
    pause: Callable[[float], Awaitable[None]],
    facts: str = "",
    attempts_made: int = 0,
) -> Receipt | Undelivered:
    """Send ``reply`` durably, retrying the send alone; returns the receipt, or why it was dead-lettered.

    Args:
        outbox: the drain's outbox (fenced by its lease).
        reply: the rendered reply (a ``StreamText`` closing a native stream, see :mod:`switchboard.outbound.streaming`).
        conversation: where it goes.
        run_id: the turn's run id.
        settings: ``send_max_attempts``, ``send_backoff_s`` and ``max_defer_s`` (the longest platform wait).
        pause: waits between attempts (the drain's wait, which stops early when the lease is lost).
        facts: held events to write with the first claim.
        attempts_made: delivery attempts an earlier worker already made (resuming a pending send).

    Raises:
        FencedWriteError: the lease passed to another epoch (the new holder resumes the send).
    """
    attempt = attempts_made
    while True:
        attempt += 1
        try:
            outcome = await outbox.send(
                reply, conversation, run_id=run_id, logical=REPLY, facts=facts, durable=True, attempt=attempt
            )
        except DeliveryError as err:
            facts = ""  # written by the claim already
            reason = str(err)[:300]
            if isinstance(err, RateLimitedError) and err.retry_after > settings.max_defer_s:
                logger.warning(
                    "reply of %s dead-lettered: %s asked to wait %.0f s", run_id, err.channel, err.retry_after
                )
                reason = (
                    f"{err.channel} asked to wait {err.retry_after:.0f} s before sending, longer than "
                    f"SWITCHBOARD_QUEUE__MAX_DEFER_S ({settings.max_defer_s:.0f} s): {reason}"
                )[:300]
                return Undelivered(reason, attempt, permanent=False)
            if not err.retryable or attempt >= settings.send_max_attempts:
                logger.warning("reply of %s dead-lettered after %d send attempts", run_id, attempt)
                return Undelivered(reason, attempt, permanent=not err.retryable)
            delay = settings.send_backoff_s * 2 ** (attempt - 1)
            if isinstance(err, RateLimitedError):
                delay = max(delay, err.retry_after)
                if outbox.waited_s + delay > settings.max_defer_s:  # nor may many short waits add up to a long one
                    reason = (
                        f"{err.channel} kept asking to wait ({outbox.waited_s + delay:.0f} s in all), longer than "
                        f"SWITCHBOARD_QUEUE__MAX_DEFER_S ({settings.max_defer_s:.0f} s): {reason}"
                    )[:300]
                    logger.warning("reply of %s dead-lettered: %s kept rate-limiting it", run_id, err.channel)
                    return Undelivered(reason, attempt, permanent=False)
                outbox.waited_s += delay
            logger.info("reply of %s not delivered (attempt %d); retrying the send in %.2f s", run_id, attempt, delay)
            await pause(delay)
            continue
        return outcome.receipt or Receipt()  # skipped: an earlier attempt delivered it
