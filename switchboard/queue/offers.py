"""Offered choices, recorded per session, so the gateway (not the model) knows whether a click answers an offer.

A click is whatever the platform or the page sent: forged ids, stale buttons and buttons pressed by someone else all
arrive. So every offer the drain sends is recorded in the session (fenced, the last :data:`OFFERS_KEPT` for
:data:`OFFERS_TTL_S`), and each click is checked against that record before its turn: a known id gets ``offered``
and the recorded label, any other is marked not offered.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import redis.asyncio as aioredis

from switchboard.core.actions import Action, OfferChoice
from switchboard.core.messages import ChoiceSelected, InboundMessage
from switchboard.queue import scripts
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.lease import LeaseToken
from switchboard.types import SessionKey

__all__ = ["OFFERS_KEPT", "OFFERS_TTL_S", "check_choices", "offered_labels", "record_offer"]

OFFERS_KEPT = 20
"""How many of a session's latest offers a click may answer (older ones are evicted, newest first kept)."""
OFFERS_TTL_S = 7 * 24 * 3600
"""How long after the session's last offer its offers can still be answered."""

_GLOBAL = GlobalKeys()


async def record_offer(redis: aioredis.Redis, lease: LeaseToken, action: Action, key: str) -> None:
    """Record the options of ``action`` (if it offers a choice) as offered in the lease's session.

    ``key`` is the send's idempotency key: a resumed send of the same offer is not recorded twice.

    Raises:
        FencedWriteError: the lease passed to another epoch (nothing is written).
    """
    if not isinstance(action, OfferChoice):
        return
    options = [{"id": option.id, "label": option.label} for option in action.options]
    record = json.dumps({"key": key, "options": options}, separators=(",", ":"), ensure_ascii=False)
    keys = SessionKeys(lease.session)
    await scripts.OFFER_RECORD(
        redis,
        [keys.lease, keys.fenced_rejections, keys.offers],
        [lease.token, record, OFFERS_KEPT, OFFERS_TTL_S * 1000],
        session=lease.session,
        epoch=lease.epoch,
    )


async def offered_labels(redis: aioredis.Redis, session: SessionKey) -> dict[str, str]:
    """Option id → label of every option the session was offered lately (the newest offer's label wins)."""
    raw: list[bytes | str] = await redis.lrange(SessionKeys(session).offers, 0, OFFERS_KEPT - 1)
    labels: dict[str, str] = {}
    for record in raw:
        try:
            options = json.loads(record)["options"]
        except (ValueError, KeyError, TypeError):
            continue  # not a record this module wrote: it vouches for nothing
        for option in options if isinstance(options, list) else ():
            if isinstance(option, dict) and isinstance(option.get("id"), str) and isinstance(option.get("label"), str):
                labels.setdefault(option["id"], option["label"])
    return labels


def _checked(message: InboundMessage, labels: dict[str, str]) -> InboundMessage:
    event = message.event
    if not isinstance(event, ChoiceSelected):
        return message
    label = labels.get(event.option_id)
    return message.model_copy(
        update={
            "event": event.model_copy(update={"offered": label is not None}),
            "text": message.text if label is None else label,
        }
    )


async def check_choices(
    redis: aioredis.Redis, session: SessionKey, messages: Sequence[InboundMessage]
) -> list[InboundMessage]:
    """``messages`` with every click marked offered (with the recorded label) or not, from the session's record.

    Reads Redis only when the turn holds a click.
    """
    if not any(isinstance(m.event, ChoiceSelected) for m in messages):
        return list(messages)
    labels = await offered_labels(redis, session)
    return [_checked(m, labels) for m in messages]
