"""A small recording channel for the outbound tests: the real ``Channel`` protocol with real ``Capabilities``.

It plays the platform too (:class:`FakePlatform`: messages by id, in the order they were posted, each edit and
stream call logged) and behaves like an adapter should: it splits text by ``max_text``, calls ``send.pace()``
before every platform call and ``send.part_sent`` after every part, and resumes after ``send.sent``. It can die
after a number of parts (:class:`Crash`, standing for the process being killed), refuse one part, or answer 429.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import assert_never

from switchboard.channels.base import (
    Capabilities,
    FileData,
    Inbound,
    Listener,
    RawRequest,
    Receipt,
    SendContext,
)
from switchboard.core.actions import (
    AckChoice,
    Action,
    EditText,
    OfferChoice,
    SendError,
    SendFile,
    SendText,
    SendTyping,
    SetStatus,
    SettleChoices,
    ShowToolCall,
    StreamDelta,
    StreamText,
)
from switchboard.core.messages import Attachment, ConversationRef
from switchboard.errors import AttachmentError, DeliveryError, RateLimitedError, SignatureError
from switchboard.types import ChannelName


class Crash(BaseException):
    """Stands for the process dying: nothing after it runs."""


@dataclass
class FakePlatform:
    """The platform's side: what it shows and every call it got."""

    messages: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    """Message ids in the order they were posted."""
    calls: list[tuple[str, str]] = field(default_factory=list)
    """``(method, message id or handle)`` for every call that reached the platform."""
    files: dict[str, bytes] = field(default_factory=dict)
    die_after_posts: int | None = None
    """Raise :class:`Crash` right after this many posts (counted from now on, across channels)."""
    refuse_post: int | None = None
    """Refuse the post with this number (1-based, across channels) once, retryably."""
    limit_post: int | None = None
    """Answer the post with this number with a 429 once."""
    retry_after: float = 60.0
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _posts: int = 0

    def texts(self) -> list[str]:
        """The posted messages' current texts, in posting order."""
        return [self.messages[i] for i in self.order]

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.calls if m == method)

    def post(self, text: str) -> str:
        number = self._posts + 1
        if self.limit_post == number:
            self.limit_post = None
            raise RateLimitedError("429 Too Many Requests", channel="telegram", retry_after=self.retry_after)
        if self.refuse_post == number:
            self.refuse_post = None
            raise DeliveryError("503 from the platform", channel="telegram", retryable=True)
        self._posts = number
        message_id = str(next(self._ids))
        self.messages[message_id] = text
        self.order.append(message_id)
        self.calls.append(("post", message_id))
        return message_id

    def after_post(self) -> None:
        if self.die_after_posts is not None:
            self.die_after_posts -= 1
            if self.die_after_posts == 0:
                self.die_after_posts = None
                raise Crash


class FakeChannel:
    """One account's adapter over :class:`FakePlatform` (implements ``switchboard.channels.base.Channel``)."""

    def __init__(self, platform: FakePlatform, capabilities: Capabilities, *, account: str = "default") -> None:
        self.platform = platform
        self._caps = capabilities
        self._account = account
        self.performed: list[tuple[Action, str]] = []
        """Every action with its send's idempotency key."""

    @property
    def name(self) -> ChannelName:
        return "telegram"

    @property
    def account(self) -> str:
        return self._account

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    async def verify(self, request: RawRequest) -> None:
        raise SignatureError("the fake channel receives nothing", channel="telegram", status=401)

    async def receive(self, request: RawRequest) -> Inbound:
        return Inbound()

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FileData:
        raise AttachmentError("the fake channel has no files", channel="telegram")

    def listener(self) -> Listener | None:
        return None

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def split(self, text: str) -> list[str]:
        size = self._caps.max_text
        return [text[i : i + size] for i in range(0, len(text), size)]

    async def _post_parts(self, parts: list[str], send: SendContext) -> Receipt:
        ids = list(send.sent)
        for part in parts[len(ids) :]:
            await send.pace()
            message_id = self.platform.post(part)
            await send.part_sent(message_id)
            ids.append(message_id)
            self.platform.after_post()
        return Receipt(platform_ids=tuple(ids), parts=len(parts))

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        self.performed.append((action, send.idempotency_key))
        match action:
            case SendText() | SendError():
                text = action.text if isinstance(action, SendText) else action.message
                return await self._post_parts(self.split(text), send)
            case EditText():
                if not self._caps.edits:
                    raise DeliveryError("no edits here", channel="telegram", retryable=False)
                if len(action.text) > self._caps.max_text:
                    raise DeliveryError("message is too long", channel="telegram", retryable=False)
                await send.pace()
                self.platform.messages[action.message_id] = action.text
                self.platform.calls.append(("edit", action.message_id))
                return Receipt(platform_ids=(action.message_id,))
            case StreamText():
                if action.handle is None:
                    self.platform.calls.append(("stream_open", "s1"))
                    return Receipt(parts=0, handle="s1")
                if not action.final:
                    self.platform.calls.append(("stream_append", action.handle))
                    return Receipt(parts=0, handle=action.handle)
                self.platform.calls.append(("stream_close", action.handle))
                return await self._post_parts(self.split(action.text), send)
            case SendFile():
                data = await send.read_file(action.path)
                await send.pace()
                message_id = self.platform.post(f"[file {data.name}]")
                self.platform.files[message_id] = data.data
                await send.part_sent(message_id)
                return Receipt(platform_ids=(message_id,))
            case (
                SendTyping()
                | SetStatus()
                | StreamDelta()
                | OfferChoice()
                | AckChoice()
                | ShowToolCall()
                | SettleChoices()
            ):
                self.platform.calls.append((action.kind, ""))
                return Receipt(parts=0)
            case _:
                assert_never(action)
