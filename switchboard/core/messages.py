"""② The normalised inbound message and the conversation it belongs to."""

from __future__ import annotations

import re
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from switchboard.types import ChannelName, SessionKey

__all__ = ["ConversationRef", "InboundMessage", "Sender", "session_key"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.:@+=-]")


def _component(value: str) -> str:
    """Escape one session-key component so that it can never contain ``/``, ``{`` or ``}``."""
    return _UNSAFE.sub(lambda m: "%" + "%".join(f"{b:02X}" for b in m.group().encode()), value) or "-"


def session_key(
    tenant: str, agent: str, channel: str, account: str, conversation: str, thread: str | None = None
) -> SessionKey:
    """Build the session key ``tenant/agent/channel/account/conversation[/thread]``.

    Components are percent-escaped, so a key is always safe inside a Redis hash tag and a file path.
    """
    parts = [tenant, agent, channel, account, conversation] + ([thread] if thread else [])
    return SessionKey("/".join(_component(p) for p in parts))


class ConversationRef(BaseModel):
    """Where a conversation lives on its platform: everything a send action needs to reach it."""

    model_config = ConfigDict(frozen=True)

    tenant: str = "default"
    agent: str
    channel: ChannelName
    account: str = "default"
    conversation: str
    """Platform conversation id (Telegram chat id, web chat session id, ...)."""
    thread: str | None = None
    """Platform thread id where the platform has threads (Telegram forum topic, Slack thread_ts)."""
    extra: dict[str, str] = Field(default_factory=dict)
    """Channel-specific routing data needed to reply (never secrets)."""

    @property
    def session_key(self) -> SessionKey:
        """The session this conversation maps to."""
        return session_key(self.tenant, self.agent, self.channel, self.account, self.conversation, self.thread)


class Sender(BaseModel):
    """Who wrote the message."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str | None = None
    is_bot: bool = False


class InboundMessage(BaseModel):
    """One message from a user, in the shape every later stage understands."""

    model_config = ConfigDict(frozen=True)

    id: str = ""
    """Gateway message id; assigned at ingest (empty in a freshly parsed draft)."""
    dedup_key: str
    """The platform's own event id (Telegram ``update_id``, web ``client_id``, ...), unique per account."""
    conversation: ConversationRef
    sender: Sender
    text: str
    platform_message_id: str | None = None
    """The platform's id of this message, for reply threading."""
    received_at: float = Field(default_factory=time.time)
    """Unix time the gateway accepted it."""
    meta: dict[str, Any] = Field(default_factory=dict)
    """Small channel-specific facts (chat type, mention flags); never secrets."""

    @property
    def session_key(self) -> SessionKey:
        """The session this message belongs to."""
        return self.conversation.session_key
