"""⑤ The worker's :class:`~switchboard.queue.drain.Deliverer` over channel adapters.

It routes each action to the adapter of the conversation's ``(channel, account)``; the adapters do the
platform dialect (chunking, edits, 429s as ``RateLimitedError``). The outbox around it owns idempotency.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from switchboard.channels.base import Channel, Receipt
from switchboard.core.actions import Action
from switchboard.core.messages import ConversationRef
from switchboard.errors import DeliveryError

__all__ = ["ChannelDeliverer", "ChannelRegistry"]

ChannelRegistry = Mapping[tuple[str, str], Channel] | Callable[[ConversationRef], Channel | None]


class ChannelDeliverer:
    """Delivers actions through the channel adapter registered for each conversation."""

    def __init__(self, channels: ChannelRegistry) -> None:
        """Route through ``channels``.

        Args:
            channels: ``(channel, account) → adapter`` (what the web tier keeps in ``app[CHANNELS]``), or a
                function that finds the adapter for a conversation.
        """
        if callable(channels):
            self._find = channels
        else:
            registry = channels
            self._find = lambda conv: registry.get((conv.channel, conv.account))

    def _channel(self, conversation: ConversationRef) -> Channel:
        channel = self._find(conversation)
        if channel is None:
            raise DeliveryError(
                f"no adapter for {conversation.channel}/{conversation.account}",
                channel=conversation.channel,
                retryable=False,
            )
        return channel

    def streams(self, conversation: ConversationRef) -> bool:
        """Whether the conversation's channel shows streamed deltas."""
        channel = self._find(conversation)
        return bool(channel is not None and channel.streams)

    async def perform(self, action: Action, conversation: ConversationRef, *, idempotency_key: str) -> Receipt:
        """Perform ``action`` on the conversation's channel.

        Raises:
            DeliveryError: no adapter for the conversation, or the platform refused the send.
            RateLimitedError: the platform asked to wait (the outbox retries the send).
        """
        return await self._channel(conversation).perform(action, conversation, idempotency_key=idempotency_key)
