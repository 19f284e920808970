"""Messages operators and the gateway itself put into a session: :class:`~switchboard.core.messages.OperatorActed`.

They ride the session's inbox like a user's message, so they are ordered with the conversation and applied by the
worker under the session lease. Their conversation is the one the session's last channel message named (kept in the
session's meta by ``complete``: its routing data reaches the same chat), else the one its key spells.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import unquote

import redis.asyncio as aioredis

from switchboard.channels.registry import CHANNEL_MODULES
from switchboard.core.messages import ConversationRef, InboundMessage, OperatorActed, Sender
from switchboard.queue.keys import SessionKeys
from switchboard.types import SessionKey

__all__ = ["GATEWAY_PRINCIPAL", "operator_message", "session_conversation"]

GATEWAY_PRINCIPAL: Final = "switchboard"
"""The principal of what the gateway does itself (an approval's expiry)."""


async def session_conversation(redis: aioredis.Redis, session: SessionKey) -> ConversationRef | None:
    """Where the session's conversation lives; ``None`` when its key is not a session key of a known channel."""
    raw = await redis.hget(SessionKeys(session).meta, "conversation")
    if raw:
        conversation = ConversationRef.model_validate_json(raw)
        if conversation.session_key == session:
            return conversation
    parts = [unquote(p) for p in session.split("/")]
    if len(parts) not in (5, 6) or parts[2] not in CHANNEL_MODULES or not all(parts):
        return None
    return ConversationRef.model_validate(
        {
            "tenant": parts[0],
            "agent": parts[1],
            "channel": parts[2],
            "account": parts[3],
            "conversation": parts[4],
            "thread": parts[5] if len(parts) > 5 else None,
        }
    )


def operator_message(
    conversation: ConversationRef, event: OperatorActed, *, dedup_key: str, text: str = ""
) -> InboundMessage:
    """The draft that carries ``event`` into the conversation's session (the sender is the acting principal)."""
    name = event.operator.split(":", 1)[-1]
    return InboundMessage(
        dedup_key=dedup_key,
        conversation=conversation,
        sender=Sender(id=event.operator, name=name),
        text=text,
        event=event,
    )
