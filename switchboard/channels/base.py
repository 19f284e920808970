"""The small surface every channel adapter has: verify, answer handshakes, parse, perform send actions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from switchboard.core.actions import Action
from switchboard.core.messages import ConversationRef, InboundMessage
from switchboard.types import ChannelName

__all__ = ["Channel", "HandshakeReply", "RawRequest", "Receipt"]


@dataclass(frozen=True, slots=True)
class RawRequest:
    """An inbound HTTP request as the adapter sees it: raw bytes, before any parsing."""

    method: str
    path: str
    headers: Mapping[str, str]
    """Case-insensitive mapping (aiohttp's ``CIMultiDictProxy`` or equivalent)."""
    query: Mapping[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class HandshakeReply:
    """A reply the adapter gives by itself (Meta ``hub.challenge``, Slack ``url_verification``)."""

    status: int
    body: bytes = b""
    content_type: str = "text/plain"


@dataclass(frozen=True, slots=True)
class Receipt:
    """What a send produced on the platform."""

    platform_ids: tuple[str, ...] = ()
    parts: int = 1
    detail: dict[str, str] = field(default_factory=dict)


class Channel(Protocol):
    """One platform account's adapter.

    ``verify`` runs first, on raw bytes, in constant time; it raises ``SignatureError``.
    ``parse`` raises ``MalformedBodyError``; it returns zero or more message drafts (``id`` empty)
    and drops what is not for the agent (bot's own messages, group chatter without a mention).
    ``perform`` raises ``DeliveryError`` / ``RateLimitedError``.
    """

    @property
    def name(self) -> ChannelName:
        """The channel this adapter speaks."""

    @property
    def streams(self) -> bool:
        """Whether the channel shows ``StreamDelta`` actions."""

    def handshake(self, request: RawRequest) -> HandshakeReply | None:
        """Answer a platform handshake, or ``None`` when the request is not one."""

    def verify(self, request: RawRequest) -> None:
        """Check the request comes from the platform."""

    def parse(self, request: RawRequest) -> list[InboundMessage]:
        """Normalise the body into message drafts."""

    async def perform(self, action: Action, conversation: ConversationRef, *, idempotency_key: str) -> Receipt:
        """Carry out one send action on the platform."""

    async def aclose(self) -> None:
        """Release connection pools."""
