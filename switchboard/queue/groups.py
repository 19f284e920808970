"""Kept group context in Redis: unanswered group messages stored without a run, handed to the next answered turn.

The ingest router keeps a message an adapter marked ``group_context_only`` (:func:`keep`: one script, no inbox, no
drain job); a worker about to answer a message marked ``group_context`` takes the kept messages into that message's
record (:func:`take`), where the agent runtime reads them as untrusted data (:mod:`switchboard.core.groups`). Nothing
here runs for an account without ``group_replies.keep_context``.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from switchboard.core.events import ContextKept
from switchboard.core.groups import CONTEXT_META, ContextLine, KeepContext, context_place, fit_context
from switchboard.core.messages import InboundMessage, session_key
from switchboard.queue.eventlog import encode_event
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import LeaseToken
from switchboard.queue.scripts import CONTEXT_KEEP, CONTEXT_TAKE
from switchboard.types import SessionKey

__all__ = ["context_session", "keep", "take"]


def context_session(message: InboundMessage) -> SessionKey:
    """The session whose kept context ``message`` adds to or reads."""
    conv = message.conversation
    conversation, thread = context_place(conv.conversation, conv.thread, message.meta)
    return session_key(conv.tenant, conv.agent, conv.channel, conv.account, conversation, thread)


async def keep(
    redis: aioredis.Redis, message: InboundMessage, rule: KeepContext, *, dedup_ttl_s: int, events_maxlen: int
) -> bool:
    """Keep ``message`` (routed) as context of its session; ``False`` for a retry of one already kept.

    One script: the dedup record, the capped list, its TTL and a ``context_kept`` fact in the session's log.
    """
    keys = SessionKeys(context_session(message))
    text = message.text[: rule.max_chars]
    line = ContextLine(sender=message.sender.id, name=message.sender.name, text=text, at=message.received_at)
    event = ContextKept(
        message_id=message.platform_message_id,
        channel=message.conversation.channel,
        sender=message.sender.id,
        chars=len(text),
    )
    kept = await CONTEXT_KEEP(
        redis,
        [keys.group_context, keys.dedup(f"context:{message.dedup_key}"), keys.events],
        [line.model_dump_json(), rule.max_messages, rule.ttl_s, dedup_ttl_s, events_maxlen, encode_event(event)],
    )
    return bool(kept)


async def take(
    redis: aioredis.Redis, lease: LeaseToken, messages: Sequence[tuple[str, InboundMessage]]
) -> list[InboundMessage]:
    """The messages (``(id, message)`` pairs), with the kept context handed to each that asks for it.

    A message asks with ``group_context`` set to a size in characters. The context goes into its record under the
    session lease (a retried attempt reads the same), then the entries taken leave the list (which may belong to
    another session: a Slack channel's chatter before a post that opens a thread). A message without the mark costs
    nothing.
    """
    result: list[InboundMessage] = []
    for message_id, message in messages:
        wanted = message.meta.get(CONTEXT_META)
        if isinstance(wanted, bool) or not isinstance(wanted, int):
            result.append(message)  # not asked for, or already taken into the record
            continue
        keys = SessionKeys(context_session(message))
        raw = await redis.lrange(keys.group_context, 0, -1)
        lines = fit_context([ContextLine.model_validate_json(item) for item in raw], max_chars=wanted)
        meta = {**message.meta, CONTEXT_META: [line.model_dump(mode="json") for line in lines]}
        updated = message.model_copy(update={"meta": meta})
        own = SessionKeys(lease.session)
        await CONTEXT_TAKE(
            redis,
            [own.lease, own.fenced_rejections, own.messages],
            [lease.token, message_id, updated.model_dump_json()],
            session=lease.session,
            epoch=lease.epoch,
        )
        if raw:
            await redis.ltrim(keys.group_context, len(raw), -1)
        result.append(updated)
    return result
