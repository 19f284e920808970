"""The echo channel's adapter: a text-only platform, written the way a new channel is.

The platform posts ``{"id", "chat", "text"}`` signed with ``X-Echo-Signature: hex(HMAC-SHA256(secret, body))`` and
takes replies at ``POST <api>/send {"chat", "text"}``. Replies are the agent's Markdown as plain text, split at the
platform's 2,000 characters; choices are numbered lines (no buttons); it has no files, edits nor typing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Final, assert_never

import aiohttp

from switchboard.channels.base import (
    Capabilities,
    FileData,
    HttpAnswer,
    Inbound,
    Listener,
    RawRequest,
    Receipt,
    SendContext,
)
from switchboard.channels.render.plain import render_parts
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
from switchboard.core.messages import Attachment, ConversationRef, InboundMessage, Sender
from switchboard.errors import AttachmentError, DeliveryError, MalformedBodyError, SignatureError

from .settings import EchoSettings

__all__ = ["ANSWER", "CHANNEL", "SIGNATURE_HEADER", "EchoChannel"]

CHANNEL: Final = "echo"
SIGNATURE_HEADER = "X-Echo-Signature"
ANSWER = HttpAnswer(200, b'{"echo":"accepted"}')
"""What the platform expects back: the route must answer with the adapter's answer, not a fixed one."""
CAPABILITIES: Final = Capabilities(max_text=2000)


class EchoChannel:
    """One echo account."""

    def __init__(self, settings: EchoSettings, account: str) -> None:
        assert settings.secret is not None
        self._secret = settings.secret.get_secret_value().encode()
        self._api = settings.api_base_url.rstrip("/")
        self._account = account

    @property
    def name(self) -> str:
        return CHANNEL

    @property
    def account(self) -> str:
        return self._account

    @property
    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    async def verify(self, request: RawRequest) -> None:
        trouble = request.headers.get("X-Echo-Trouble")  # how a real adapter can fail while verifying
        if trouble == "keys-unreachable":
            raise ConnectionRefusedError("the platform's key endpoint is down")
        if trouble == "bug":
            raise RuntimeError("an adapter bug")
        expected = hmac.new(self._secret, request.body, hashlib.sha256).hexdigest().encode()
        if not hmac.compare_digest(expected, request.headers.get(SIGNATURE_HEADER, "").encode()):
            raise SignatureError("bad echo signature", channel=CHANNEL)

    async def receive(self, request: RawRequest) -> Inbound:
        if request.headers.get("X-Echo-Trouble") == "parse-bug":  # how a real adapter's parsing can have a bug
            raise RuntimeError("an adapter bug")
        try:
            raw = json.loads(request.body)
            if not isinstance(raw["text"], str):
                raise TypeError("text is a string")
            if not raw["text"].strip():
                return Inbound(answer=ANSWER)
            conversation = ConversationRef(channel=CHANNEL, account=request.account, conversation=str(raw["chat"]))
            message = InboundMessage(
                dedup_key=str(raw["id"]),
                conversation=conversation,
                sender=Sender(id=str(raw["chat"])),
                text=raw["text"],
            )
        except (ValueError, KeyError, TypeError) as err:
            raise MalformedBodyError("not an echo payload", channel=CHANNEL) from err
        return Inbound(messages=(message,), answer=ANSWER)

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        match action:
            case SendText(text=text) | StreamText(text=text):
                return await self._send(text, conversation, send)
            case SendError(message=text):
                return await self._send(text, conversation, send)
            case OfferChoice():
                lines = [action.question, *(f"{n}. {o.label}" for n, o in enumerate(action.options, 1))]
                return await self._send("\n".join(lines), conversation, send)
            case SendFile() | EditText():
                raise DeliveryError(f"echo has no {action.kind}s", channel=CHANNEL, retryable=False)
            case SendVoice():  # no voice notes here: the text reply is all (the capabilities declare none)
                return Receipt(parts=0)
            case StreamDelta() | SendTyping() | SetStatus() | AckChoice() | ShowToolCall() | SettleChoices():
                return Receipt(parts=0)
            case _:
                assert_never(action)

    async def _send(self, markdown: str, conversation: ConversationRef, send: SendContext) -> Receipt:
        parts = render_parts(markdown, CAPABILITIES.max_text, CAPABILITIES.text_unit)
        ids = list(send.sent)
        async with aiohttp.ClientSession() as http:
            for part in parts[len(ids) :]:
                await send.pace()
                async with http.post(f"{self._api}/send", json={"chat": conversation.conversation, "text": part}) as r:
                    if r.status != 200:
                        raise DeliveryError(f"echo refused: {r.status}", channel=CHANNEL, retryable=r.status >= 500)
                    ids.append(str((await r.json())["id"]))
                await send.part_sent(ids[-1])
        return Receipt(platform_ids=tuple(ids), parts=len(parts))

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FileData:
        raise AttachmentError("echo sends no files", channel=CHANNEL)

    def listener(self) -> Listener | None:
        return None

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
