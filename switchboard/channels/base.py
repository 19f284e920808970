"""The channel interface: what every platform adapter provides, and what the gateway gives it.

An adapter is one platform account: it verifies a raw request in constant time, reads it into an :class:`Inbound`,
and performs every ``Action`` kind within its :class:`Capabilities` through the :class:`SendContext` the queue hands
it. Adapters leave ``agent`` and ``tenant`` empty; the ingest router fills them from the account's configuration.
Long-running connections are listeners (:class:`Listener`), one per account across all processes. How to add a channel:
``docs/ARCHITECTURE.md`` §12.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, assert_never

from multidict import CIMultiDictProxy, MultiMapping

from switchboard.core.actions import (
    AckChoice,
    Action,
    EditText,
    OfferChoice,
    SendError,
    SendFile,
    SendText,
    SendTyping,
    SendVoice,
    SetStatus,
    SettleChoices,
    ShowToolCall,
    StreamDelta,
    StreamText,
)
from switchboard.core.messages import Attachment, ConversationRef, InboundMessage
from switchboard.types import ChannelName

__all__ = [
    "OK_JSON",
    "ActionSender",
    "Capabilities",
    "Channel",
    "DeliveryStatus",
    "Emit",
    "FileData",
    "HttpAnswer",
    "Inbound",
    "Listener",
    "Rate",
    "RawRequest",
    "Receipt",
    "SendContext",
    "header_values",
    "json_object",
    "perform_action",
    "retry_after_s",
]


@dataclass(slots=True)
class RawRequest:
    """An inbound HTTP request as the adapter sees it: raw bytes, before any parsing. Read-only by convention.

    Not a frozen dataclass, as :class:`Inbound` and ``IngestResult``: one is made per webhook request, and a frozen
    dataclass's ``__init__`` sets every field through ``object.__setattr__`` (figures: ``docs/benchmarks.md``).
    """

    method: str
    path: str
    headers: Mapping[str, str]
    """Case-insensitive mapping (aiohttp's ``CIMultiDictProxy`` or equivalent)."""
    query: Mapping[str, str]
    body: bytes
    account: str = "default"
    """The account named by the URL (``/webhooks/{channel}/{account}``)."""


def header_values(headers: Mapping[str, str], name: str) -> list[str]:
    """Every value of header ``name``, case-insensitively (a repeated header gives several: signature checks refuse)."""
    if type(headers) is CIMultiDictProxy:  # aiohttp's request headers: no ABC check on the hot path
        return headers.getall(name, [])
    if isinstance(headers, MultiMapping):
        return [str(value) for value in headers.getall(name, [])]
    lowered = name.lower()
    return [value for key, value in headers.items() if key.lower() == lowered]


def json_object(raw: bytes) -> dict[str, Any] | None:
    """``raw`` parsed, if it is a JSON object (a platform's answer or payload); ``None`` for anything else."""
    try:
        parsed = json.loads(raw)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def retry_after_s(value: str | None) -> float:
    """A ``Retry-After`` header's seconds, within 0 s to an hour (1 s when it is missing or not a number)."""
    try:
        seconds = float(value) if value is not None else 1.0
    except ValueError:
        return 1.0
    return min(max(seconds, 0.0), 3600.0) if seconds == seconds else 1.0


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """The HTTP answer a platform expects (Slack's empty 200, Discord's PONG or deferred response, a challenge)."""

    status: int = 200
    body: bytes = b""
    content_type: str | None = "application/json"
    """``None`` sends no ``Content-Type`` (an empty body)."""


OK_JSON = HttpAnswer(200, b'{"ok":true}')
"""The default answer: what the Telegram and web routes have always returned."""


@dataclass(frozen=True, slots=True)
class DeliveryStatus:
    """What a platform reported about a message the gateway sent: recorded in that session's event log, not a message.

    The conversation is built like an inbound message's (agent and tenant filled by the ingest router).
    """

    conversation: ConversationRef
    status: Literal["sent", "delivered", "read", "failed"]
    platform_id: str = ""
    """The platform's id of the sent message (empty: a read mark that covers everything sent before)."""
    error: str = ""
    """For ``failed``: the platform's error code and title (never message text)."""


@dataclass(slots=True)
class Inbound:
    """What one verified request carried, and how to answer it once every message is durably accepted.

    Read-only by convention (not frozen: see :class:`RawRequest`).
    """

    messages: tuple[InboundMessage, ...] = ()
    """Drafts (``id`` empty, ``agent``/``tenant`` empty): all of them are accepted, or the request is not
    acknowledged (5xx, the platform retries; duplicates are dropped by their dedup keys)."""
    answer: HttpAnswer = OK_JSON
    statuses: tuple[DeliveryStatus, ...] = ()
    """Delivery and read reports about sent messages, recorded with the messages (same all-or-5xx rule)."""


@dataclass(frozen=True, slots=True)
class Receipt:
    """What a send produced on the platform."""

    platform_ids: tuple[str, ...] = ()
    """Ids of the platform messages it became, in order (what ``EditText.message_id`` takes)."""
    parts: int = 1
    detail: dict[str, str] = field(default_factory=dict)
    handle: str | None = None
    """The stream an opening ``StreamText`` started (what later ``StreamText.handle`` carries)."""


@dataclass(frozen=True, slots=True)
class Rate:
    """A token bucket: ``per_s`` tokens a second, at most ``burst`` saved up."""

    per_s: float
    burst: int = 1


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a channel can show, declared once; the streaming policy and the tools plan with it."""

    max_text: int
    """The longest text of one message, in ``text_unit``s, after rendering."""
    text_unit: Literal["chars", "bytes", "utf16"] = "chars"
    edits: bool = False
    """``EditText`` works (the streaming policy may stream by editing)."""
    streaming: Literal["none", "edits", "native", "transport"] = "none"
    """How a reply streams: not at all (final reply only), by editing a preview under a shared edit budget, with
    the platform's own stream (``StreamText``), or on the channel's own transport (``StreamDelta``: web chat)."""
    buttons: int = 0
    """Most options an ``OfferChoice`` shows as buttons (0: options become numbered text)."""
    button_label: int = 0
    """Longest button label in characters (longer labels are shortened; the id still identifies the option)."""
    files: bool = False
    voice: bool = False
    """``SendVoice`` is shown as a voice note (or playable audio); a channel without it is never sent one, and no
    speech is made for it (the text reply alone)."""
    statuses: bool = False
    """``SetStatus`` shows: the channel is told when a turn starts and when the session goes idle (web chat)."""
    tool_activity: bool = False
    """``ShowToolCall`` and ``SettleChoices`` show: the channel is sent each tool call as it starts and ends, and
    each decided offer (web chat). A channel without it is sent neither, at no cost."""
    typing: bool = False
    typing_refresh_s: float = 4.0
    """How often a typing indicator must be repeated to stay visible."""
    bot_rate: Rate = Rate(30.0, 30)
    """Sends a second for the whole bot account, shared by every worker."""
    chat_rate: Rate = Rate(1.0, 3)
    """Sends a second into one conversation, shared by every worker."""
    edit_rate: Rate = Rate(0.5, 1)
    """Preview edits a second into one conversation while streaming (the edit budget), shared by every worker."""


@dataclass(frozen=True, slots=True)
class FileData:
    """A workspace file read for sending."""

    name: str
    data: bytes
    mime_type: str | None


class SendContext(Protocol):
    """What the queue gives a channel for one send (an outbox record behind it)."""

    @property
    def idempotency_key(self) -> str:
        """Stable across retries and re-runs of the same logical send (Discord ``nonce`` takes it)."""

    @property
    def sent(self) -> tuple[str, ...]:
        """Platform ids of the parts an earlier attempt already sent: resume after them, never resend them."""

    async def part_sent(self, platform_id: str) -> None:
        """Record one more part as sent (fenced, durable) before sending the next.

        Raises:
            FencedWriteError: the session's lease passed to another worker (stop sending).
        """

    async def pace(self) -> None:
        """Wait for a token of the account's and the conversation's send buckets (shared in Redis)."""

    async def read_file(self, path: str) -> FileData:
        """Read ``path`` (relative to the session workspace) from whichever store holds it.

        Raises:
            DeliveryError: no such file, or it escapes the workspace (``retryable=False``).
        """


class ActionSender(Protocol):
    """A channel's sender with a method per send action, for :func:`perform_action`."""

    async def text(self, markdown: str, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Send a reply."""

    async def error(self, message: str, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Send a failure notice."""

    async def edit(self, action: EditText, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Edit a sent message, or refuse."""

    async def stream(self, action: StreamText, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Stream a reply natively, or answer ``{"streaming": "unavailable"}``."""

    async def typing(self, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Show the typing indicator."""

    async def choice(self, action: OfferChoice, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Offer options."""

    async def file(self, action: SendFile, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Send a workspace file."""


async def perform_action(
    sender: ActionSender, action: Action, conversation: ConversationRef, send: SendContext
) -> Receipt:
    """Carry out one send action with ``sender``, for a channel whose clicks are acknowledged by the HTTP answer."""
    match action:
        case SendText():
            return await sender.text(action.text, conversation, send)
        case SendError():
            return await sender.error(action.message, conversation, send)
        case EditText():
            return await sender.edit(action, conversation, send)
        case StreamText():
            return await sender.stream(action, conversation, send)
        case SendTyping():
            return await sender.typing(conversation, send)
        case OfferChoice():
            return await sender.choice(action, conversation, send)
        case SendFile():
            return await sender.file(action, conversation, send)
        case SetStatus() | StreamDelta() | ShowToolCall() | SettleChoices():
            return Receipt(parts=0)
        case SendVoice():
            return Receipt(parts=0, detail={"voice": "unsupported"})  # the text reply went out: nothing to add
        case AckChoice():
            return Receipt(parts=0, detail={"ack": "http"})  # the webhook's answer acknowledged the click
        case _:
            assert_never(action)


Emit = Callable[[Inbound], Awaitable[None]]
"""Hands what a listener received to the ingest router; returns once it is durably accepted (raises
``QueueUnavailableError`` otherwise — the listener must not confirm the update to the platform then)."""


class Listener(Protocol):
    """A long-running connection that receives for one account (run by one process at a time, under a lease)."""

    async def listen(self, emit: Emit) -> None:
        """Receive until cancelled; reconnect on transient failures by itself."""


class Channel(Protocol):
    """One platform account's adapter."""

    @property
    def name(self) -> ChannelName:
        """The channel this adapter speaks."""

    @property
    def account(self) -> str:
        """The account name (``default`` for the env-configured one)."""

    @property
    def capabilities(self) -> Capabilities:
        """What the channel can show."""

    async def verify(self, request: RawRequest) -> None:
        """Check the request comes from the platform: constant time, raw bytes, before parsing.

        A platform's unsigned handshake (Meta's ``GET`` with ``hub.verify_token``) is checked here too.

        Raises:
            SignatureError: 401 / 403.
        """

    async def receive(self, request: RawRequest) -> Inbound:
        """Turn a verified request into inbound messages and the answer the platform expects.

        Drops what is not for the agent (the bot's own messages, group chatter without a mention).

        Raises:
            MalformedBodyError: 400.
        """

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Carry out one send action.

        Raises:
            RateLimitedError: the platform asked to wait (the send alone is retried later).
            DeliveryError: ``retryable`` for network trouble and 5xx, not for refusals.
        """

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FileData:
        """Download an attachment the user sent, refusing more than ``limit`` bytes.

        Raises:
            AttachmentError: too large, gone, or the platform refused.
        """

    def listener(self) -> Listener | None:
        """The account's long-running connection, or ``None`` when it receives by webhook only."""

    async def start(self) -> None:
        """Look the account up on its platform (bot id, username); failures are logged, never raised."""

    async def aclose(self) -> None:
        """Release connection pools."""
