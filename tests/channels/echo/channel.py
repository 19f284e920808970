"""A text-only channel written the way a new channel is: this module plus one line in the channel table.

The platform ("echo") posts ``{"id", "chat", "text"}`` signed with ``X-Echo-Signature: hex(HMAC-SHA256(secret,
body))`` and takes replies at ``POST <api>/send {"chat", "text"}``. Its name is borrowed from a channel that has no
module yet (``teams``): channel names are a closed ``Literal``. Its settings use names a ``teams`` block accepts,
because the gateway's ``Settings`` already holds a ``teams`` field.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Literal, assert_never

import aiohttp
from pydantic import SecretStr

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
from switchboard.channels.registry import ChannelFactory
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
    StreamDelta,
    StreamText,
)
from switchboard.core.messages import Attachment, ConversationRef, InboundMessage, Sender
from switchboard.errors import AttachmentError, DeliveryError, MalformedBodyError, SignatureError
from switchboard.settings.channels import ChannelSettings

__all__ = ["ANSWER", "FACTORY", "SIGNATURE_HEADER", "EchoChannel", "EchoSettings"]

SIGNATURE_HEADER = "X-Echo-Signature"
ANSWER = HttpAnswer(200, b'{"echo":"accepted"}')
"""What the platform expects back: the route must answer with the adapter's answer, not a fixed one."""


class EchoSettings(ChannelSettings):
    """``SWITCHBOARD_TEAMS__APP_ID``, ``__APP_PASSWORD`` (the signing secret) and ``__LOGIN_BASE_URL`` (the API)."""

    app_id: str | None = None
    app_password: SecretStr | None = None
    login_base_url: str = "http://127.0.0.1:9"

    @property
    def enabled(self) -> bool:
        return self.app_password is not None


class EchoChannel:
    """One echo account."""

    def __init__(self, settings: EchoSettings, account: str) -> None:
        assert settings.app_password is not None
        self._secret = settings.app_password.get_secret_value().encode()
        self._api = settings.login_base_url.rstrip("/")
        self._account = account

    @property
    def name(self) -> Literal["teams"]:
        return "teams"

    @property
    def account(self) -> str:
        return self._account

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(max_text=2000)

    async def verify(self, request: RawRequest) -> None:
        trouble = request.headers.get("X-Echo-Trouble")  # how a real adapter can fail while verifying
        if trouble == "keys-unreachable":
            raise ConnectionRefusedError("the platform's key endpoint is down")
        if trouble == "bug":
            raise RuntimeError("an adapter bug")
        expected = hmac.new(self._secret, request.body, hashlib.sha256).hexdigest().encode()
        if not hmac.compare_digest(expected, request.headers.get(SIGNATURE_HEADER, "").encode()):
            raise SignatureError("bad echo signature", channel="teams")

    async def receive(self, request: RawRequest) -> Inbound:
        try:
            raw = json.loads(request.body)
            if not raw["text"].strip():  # a text that is not a string is an adapter bug (AttributeError) on purpose
                return Inbound(answer=ANSWER)
            conversation = ConversationRef(channel="teams", account=request.account, conversation=str(raw["chat"]))
            message = InboundMessage(
                dedup_key=str(raw["id"]),
                conversation=conversation,
                sender=Sender(id=str(raw["chat"])),
                text=raw["text"],
            )
        except (ValueError, KeyError, TypeError) as err:
            raise MalformedBodyError("not an echo payload", channel="teams") from err
        return Inbound(messages=(message,), answer=ANSWER)

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        match action:
            case SendText() | SendError() | OfferChoice() | SendFile() | EditText() | StreamText():
                text = action.message if isinstance(action, SendError) else getattr(action, "text", "")
                async with (
                    aiohttp.ClientSession() as http,
                    http.post(f"{self._api}/send", json={"chat": conversation.conversation, "text": text}) as r,
                ):
                    if r.status != 200:
                        raise DeliveryError(f"echo refused: {r.status}", channel="teams", retryable=r.status >= 500)
                    return Receipt(platform_ids=(str((await r.json())["id"]),))
            case StreamDelta() | SendTyping() | SetStatus() | AckChoice():
                return Receipt(parts=0)
            case _:
                assert_never(action)

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FileData:
        raise AttachmentError("echo sends no files", channel="teams")

    def listener(self) -> Listener | None:
        return None

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def _problems(block: EchoSettings) -> list[str]:
    return [] if block.app_id else ["teams: SWITCHBOARD_TEAMS__APP_ID is not set; set it to the echo app's id"]


FACTORY: ChannelFactory[EchoSettings] = ChannelFactory(
    name="teams",
    settings=EchoSettings,
    build=lambda block, context: EchoChannel(block, context.account),
    problems=_problems,
    fake="tests.channels.echo.fake",
)
