"""⑤ A one-off text to a conversation outside any turn: access control's answer to a refused sender.

The send goes through the conversation's adapter, paced by the account's and the chat's shared send buckets like
every reply; it is not retried (the sender is answered again, at the earliest, after the refusal's notice interval).
"""

from __future__ import annotations

import secrets

from switchboard.channels.base import FileData
from switchboard.channels.registry import ChannelSet
from switchboard.core.actions import SendText
from switchboard.core.messages import ConversationRef
from switchboard.errors import DeliveryError
from switchboard.outbound.ratelimits import SendBuckets

__all__ = ["DirectText"]


class _OneOff:
    """The send context of one direct text: paced, recording nothing, reading no files."""

    def __init__(self, buckets: SendBuckets, channels: ChannelSet, conversation: ConversationRef) -> None:
        self._buckets = buckets
        self._channels = channels
        self._conversation = conversation
        self._key = f"direct:{secrets.token_hex(8)}"

    @property
    def idempotency_key(self) -> str:
        """Fresh per send: a direct text is never resumed."""
        return self._key

    @property
    def sent(self) -> tuple[str, ...]:
        """Nothing was sent before."""
        return ()

    async def part_sent(self, platform_id: str) -> None:
        """Nothing to record."""

    async def pace(self) -> None:
        """Take a token of the account's and the chat's send buckets."""
        await self._buckets.pace(self._conversation, self._channels.capabilities(self._conversation))

    async def read_file(self, path: str) -> FileData:
        """A direct text sends no files.

        Raises:
            DeliveryError: always (``retryable=False``).
        """
        raise DeliveryError("a direct text sends no files", channel=self._conversation.channel, retryable=False)


class DirectText:
    """Sends one text to a conversation through its channel's adapter (``access`` refusals)."""

    def __init__(self, channels: ChannelSet, buckets: SendBuckets) -> None:
        self.channels = channels
        self.buckets = buckets

    async def __call__(self, conversation: ConversationRef, text: str) -> None:
        """Send ``text`` to ``conversation``.

        Raises:
            DeliveryError: the platform refused it, or the conversation's channel has no adapter here.
            RateLimitedError: no send token within the buckets' bounded wait.
        """
        send = _OneOff(self.buckets, self.channels, conversation)
        await self.channels.perform(SendText(text=text), conversation, send)
