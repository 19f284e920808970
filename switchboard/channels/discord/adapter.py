"""① and ⑤ for Discord: the interactions endpoint, the gateway listener, and sends over REST.

Slash commands and clicks reach ``POST /webhooks/discord`` (Ed25519 over timestamp and raw body, checked before
parsing) and are answered with a deferred response once durably queued; ordinary messages come over the gateway,
held by exactly one process per bot. Sends go over REST with per-route buckets honoured before sending, ``nonce`` +
``enforce_nonce`` against duplicates, and never a mention (``docs/channels/discord.md``).
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, assert_never
from urllib.parse import urlsplit

import aiohttp
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from switchboard.channels.base import (
    Capabilities,
    Emit,
    FileData,
    HttpAnswer,
    Inbound,
    Listener,
    Rate,
    RawRequest,
    Receipt,
    SendContext,
    header_values,
)
from switchboard.channels.discord.api import DiscordRest, Upload
from switchboard.channels.discord.gateway import DiscordGateway
from switchboard.channels.discord.inbound import (
    INTERACTION_TTL_S,
    DiscordInbound,
    Interaction,
    load_interaction,
    parse_interaction,
)
from switchboard.channels.discord.outbound import Poster
from switchboard.channels.discord.settings import DiscordSettings
from switchboard.channels.parts import SentParts
from switchboard.channels.registry import BuildContext
from switchboard.channels.render.discord import MAX_CONTENT, escape_markdown, render_markdown, split_content
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
from switchboard.core.messages import Attachment, ConversationRef
from switchboard.errors import AttachmentError, DeliveryError, MalformedBodyError, SignatureError
from switchboard.types import ChannelName

__all__ = ["COMMANDS", "SIGNATURE_HEADER", "TIMESTAMP_HEADER", "DiscordChannel", "problems"]

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Signature-Ed25519"
TIMESTAMP_HEADER = "X-Signature-Timestamp"
_CHANNEL: Literal["discord"] = "discord"
_PONG = HttpAnswer(200, b'{"type":1}')
_DEFERRED = HttpAnswer(200, b'{"type":5}')
_DEFERRED_UPDATE = HttpAnswer(200, b'{"type":6}')
_NO_CHOICES = HttpAnswer(200, b'{"type":8,"data":{"choices":[]}}')
_CONFIRM = {
    "reset": b'{"type":4,"data":{"content":"Starting a new conversation.","flags":64}}',
    "stop": b'{"type":4,"data":{"content":"Stopping the current reply.","flags":64}}',
}
_CDN_HOSTS = {"cdn.discordapp.com", "media.discordapp.net"}
_MAX_UPLOAD = 10 * 2**20
"""Discord's upload limit for a bot in a server without boosts."""
_ERROR_TEXT_LIMIT = 1000

COMMANDS: list[dict[str, Any]] = [
    {
        "name": "ask",
        "description": "Ask the agent",
        "options": [{"type": 3, "name": "text", "description": "Your message", "required": True}],
        "contexts": [0, 1, 2],
    },
    {"name": "reset", "description": "Start a new conversation", "contexts": [0, 1, 2]},
    {"name": "stop", "description": "Stop the current reply", "contexts": [0, 1, 2]},
]
"""The application commands ``switchboard discord register-commands`` always registers (the gateway's other
commands are added from :func:`switchboard.core.commands.menu`)."""
ADMINISTRATOR = "8"
"""Discord's ``ADMINISTRATOR`` permission bit: a command with it as ``default_member_permissions`` is shown to server
administrators only."""


def _bot_id_from_token(token: str | None) -> str | None:
    """A bot token's first segment is the bot's user id in base64."""
    head = (token or "").split(".", 1)[0]
    try:
        decoded = base64.b64decode(head + "=" * (-len(head) % 4), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return decoded if decoded.isdigit() else None


def _verify_key(public_key: str | None) -> VerifyKey | None:
    try:
        return VerifyKey(bytes.fromhex(public_key)) if public_key else None
    except (ValueError, TypeError):
        return None


def problems(settings: DiscordSettings) -> list[str]:
    """What keeps a configured Discord account from working, and how to fix it (``switchboard check``)."""
    found: list[str] = []
    if settings.public_key is None and not (settings.bot_token is not None and settings.gateway):
        found.append(
            "SWITCHBOARD_DISCORD__PUBLIC_KEY is not set and there is no gateway connection: nothing can reach the "
            "agent (copy the PUBLIC KEY from the Developer Portal, General Information)"
        )
    elif settings.public_key is not None and _verify_key(settings.public_key) is None:
        found.append("SWITCHBOARD_DISCORD__PUBLIC_KEY must be the 64 hex characters the Developer Portal shows")
    if settings.bot_token is not None and _bot_id_from_token(settings.bot_token.get_secret_value()) is None:
        found.append(
            "SWITCHBOARD_DISCORD__BOT_TOKEN does not look like a bot token (Developer Portal, Bot, Reset Token)"
        )
    if settings.application_id is not None and not settings.application_id.isdigit():
        found.append("SWITCHBOARD_DISCORD__APPLICATION_ID must be the numeric application id")
    return found


def _header(headers: Mapping[str, str], name: str) -> str | None:
    values = header_values(headers, name)
    return values[0] if len(values) == 1 else None


class DiscordChannel:
    """One Discord application (bot) account.

    Args:
        settings: The account's ``SWITCHBOARD_DISCORD__*`` block.
        context: The account name and whether guild messages need a mention.
    """

    name: ClassVar[ChannelName] = _CHANNEL

    def __init__(self, settings: DiscordSettings, context: BuildContext | None = None) -> None:
        context = context or BuildContext()
        self._settings, self._account = settings, context.account
        self._require_mention = context.require_mention
        self._groups = context.groups
        self._key = _verify_key(settings.public_key)
        self._token = settings.bot_token.get_secret_value() if settings.bot_token else None
        self.bot_id = _bot_id_from_token(self._token)
        self.application_id = settings.application_id
        self._rest = DiscordRest(self._token, settings.api_base_url)
        self._poster = Poster(self._rest)
        self._capabilities = Capabilities(
            max_text=MAX_CONTENT,
            text_unit="utf16",
            edits=True,
            streaming="edits",
            buttons=25,
            button_label=80,
            files=True,
            voice=True,
            typing=True,
            typing_refresh_s=8.0,
            bot_rate=Rate(45.0, 50),
            chat_rate=Rate(1.0, 5),
            edit_rate=Rate(0.5, 2),
        )

    @property
    def account(self) -> str:
        """The account name."""
        return self._account

    @property
    def capabilities(self) -> Capabilities:
        """2,000 characters, edits (streaming by edits), 25 buttons of 80 characters, files, typing."""
        return self._capabilities

    # ① inbound -----------------------------------------------------------------------------------

    async def verify(self, request: RawRequest) -> None:
        """Ed25519 over ``X-Signature-Timestamp + raw body`` with the application's public key.

        Raises:
            SignatureError: 401 when a header is missing or repeated, the signature does not verify, the timestamp
                is more than 15 minutes off, or no public key is configured.
        """
        signature, stamp = _header(request.headers, SIGNATURE_HEADER), _header(request.headers, TIMESTAMP_HEADER)
        if signature is None or stamp is None:
            raise SignatureError(f"missing {SIGNATURE_HEADER} or {TIMESTAMP_HEADER} header", channel=_CHANNEL)
        if self._key is None:
            raise SignatureError(
                f"discord account {self._account!r} has no valid public key (SWITCHBOARD_DISCORD__PUBLIC_KEY)",
                channel=_CHANNEL,
            )
        try:
            raw_signature = bytes.fromhex(signature)
            if len(raw_signature) != 64 or not stamp.isascii() or not stamp.isdigit() or len(stamp) > 12:
                raise ValueError
            self._key.verify(stamp.encode() + request.body, raw_signature)
        except (ValueError, BadSignatureError):
            raise SignatureError("bad interaction signature", channel=_CHANNEL) from None
        if abs(time.time() - int(stamp)) > INTERACTION_TTL_S:
            raise SignatureError("stale interaction timestamp", channel=_CHANNEL)

    def _answer(self, interaction: Interaction) -> HttpAnswer:
        match interaction.type:
            case 2:
                name = ((interaction.data.name if interaction.data else None) or "").lower()
                return HttpAnswer(200, _CONFIRM[name]) if name in _CONFIRM else _DEFERRED
            case 3 | 5:
                return _DEFERRED_UPDATE if interaction.type == 3 else _DEFERRED
            case 4:
                return _NO_CHOICES
            case _:
                raise MalformedBodyError(f"unknown interaction type {interaction.type}", channel=_CHANNEL)

    async def receive(self, request: RawRequest) -> Inbound:
        """A verified interaction: PING → PONG, a command or click → one draft and its deferred answer.

        Raises:
            MalformedBodyError: not an interaction Discord sends.
        """
        interaction = load_interaction(request.body)
        if interaction.type == 1:
            return Inbound(answer=_PONG)
        answer = self._answer(interaction)
        draft = parse_interaction(interaction, self._account)
        return Inbound(messages=(draft,) if draft is not None else (), answer=answer)

    def listener(self) -> Listener | None:
        """The gateway connection (ordinary messages), or ``None`` without a bot token or with the gateway off."""
        if self._token is None or not self._settings.gateway:
            return None
        return _GatewayListener(self)

    # ⑤ outbound ----------------------------------------------------------------------------------

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Carry out one send action.

        Raises:
            RateLimitedError: a bucket is empty or Discord answered 429 (the send alone is retried later).
            DeliveryError: ``retryable`` for network trouble and 5xx, not for refusals.
        """
        match action:
            case SendText():
                return await self._send(split_content(render_markdown(action.text)), conversation, send)
            case SendError():
                text = escape_markdown(action.message.strip()[:_ERROR_TEXT_LIMIT]) or "Sorry, something went wrong."
                return await self._send([text], conversation, send)
            case EditText():
                parts = split_content(render_markdown(action.text)) or ["…"]
                await self._poster.edit(conversation, action.message_id, parts[0])
                return Receipt(platform_ids=(action.message_id,), detail={"action": "edit"})
            case StreamText():
                return await self._stream(action, conversation, send)
            case OfferChoice():
                return await self._offer(action, conversation, send)
            case SendFile():
                return await self._send_file(action, conversation, send)
            case SendVoice():
                return await self._send_voice(action, conversation, send)
            case SendTyping():
                channel = self._poster.channel_id(conversation)
                route, path = "/channels/{channel_id}/typing", f"/channels/{channel}/typing"
                await self._rest.request("POST", route, major=channel, path=path)
                return Receipt(parts=0, detail={"action": "typing"})
            case AckChoice():
                return Receipt(parts=0, detail={"skipped": "acknowledged by the interaction answer"})
            case SetStatus() | StreamDelta() | ShowToolCall() | SettleChoices():
                return Receipt(parts=0)
            case _:
                assert_never(action)

    async def _send(self, parts: list[str], conversation: ConversationRef, send: SendContext) -> Receipt:
        if not parts:
            return Receipt(parts=0, detail={"skipped": "empty"})
        ids = await self._poster.post_parts(conversation, parts, send)
        return Receipt(platform_ids=tuple(ids), parts=len(parts))

    async def _stream(self, action: StreamText, conversation: ConversationRef, send: SendContext) -> Receipt:
        """A stream on Discord is a message edited in place; the final text is split like any reply."""
        parts = split_content(render_markdown(action.text)) or ["…"]
        if action.handle is None:
            ids = await self._poster.post_parts(conversation, parts if action.final else parts[:1], send)
            return Receipt(platform_ids=tuple(ids), parts=len(ids), handle=ids[0])
        await self._poster.edit(conversation, action.handle, parts[0])
        if not action.final or len(parts) == 1:
            return Receipt(platform_ids=(action.handle,), handle=action.handle)
        rest = await self._poster.post_parts(conversation, parts[1:], send, key_suffix=":rest")
        return Receipt(platform_ids=(action.handle, *rest), parts=len(parts), handle=action.handle)

    async def _offer(self, action: OfferChoice, conversation: ConversationRef, send: SendContext) -> Receipt:
        """The question, then rows of at most five buttons (25 a message) under its last part."""
        seen: set[str] = set()
        buttons: list[dict[str, Any]] = []
        for option in action.options:
            if option.id in seen:
                continue  # Discord refuses a message whose custom_ids repeat
            seen.add(option.id)
            label = option.label if len(option.label) <= 80 else option.label[:79] + "…"
            buttons.append({"type": 2, "style": 2, "custom_id": option.id, "label": label})
        rows = [{"type": 1, "components": buttons[i : i + 5]} for i in range(0, len(buttons), 5)]
        groups = [rows[i : i + 5] for i in range(0, len(rows), 5)]
        parts = split_content(render_markdown(action.question)) or ["…"]
        parts += ["…"] * (len(groups) - 1)
        first = len(parts) - len(groups)
        components: list[list[dict[str, Any]]] = [[] for _ in range(first)] + groups
        ids = await self._poster.post_parts(conversation, parts, send, components=components)
        return Receipt(platform_ids=tuple(ids), parts=len(parts), detail={"buttons": str(len(buttons))})

    async def _send_file(self, action: SendFile, conversation: ConversationRef, send: SendContext) -> Receipt:
        """The file (multipart, ``payload_json``) with the caption's first part; the rest of it follows."""
        parts = split_content(render_markdown(action.caption)) if action.caption else []
        sent = SentParts(send)
        if not sent.ids:
            data = await send.read_file(action.path)
            if len(data.data) > _MAX_UPLOAD:
                raise DeliveryError(
                    f"{data.name} is {len(data.data)} bytes; Discord takes at most {_MAX_UPLOAD} from a bot",
                    channel=_CHANNEL,
                    retryable=False,
                )
            mime = data.mime_type or action.mime_type or "application/octet-stream"
            upload = Upload(data.name, data.data, mime)
            await send.pace()
            message_id = await self._poster.post(
                conversation, parts[0] if parts else "", key=send.idempotency_key, part=0, files=[upload]
            )
            await sent.record(message_id)
        ids = sent.ids
        if len(parts) > 1:
            ids = [ids[0], *await self._poster.post_parts(conversation, parts[1:], send, key_suffix=":caption", skip=1)]
        return Receipt(platform_ids=tuple(ids), parts=max(1, len(parts)), detail={"action": "file"})

    async def _send_voice(self, action: SendVoice, conversation: ConversationRef, send: SendContext) -> Receipt:
        """The audio as an ``.ogg`` attachment (Discord plays it inline), without text: the reply went out before it.

        Not a native voice message: that flag needs a waveform and a separate upload flow, for little gain.
        """
        sent = SentParts(send)
        if not sent.ids:
            upload = Upload("reply.ogg", base64.b64decode(action.audio), action.mime_type)
            await send.pace()
            message_id = await self._poster.post(conversation, "", key=send.idempotency_key, part=0, files=[upload])
            await sent.record(message_id)
        return Receipt(platform_ids=tuple(sent.ids), detail={"action": "voice"})

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FileData:
        """Download an attachment from Discord's CDN (or the configured API host), refusing more than ``limit``.

        Raises:
            AttachmentError: too large, expired or gone, or not a Discord URL.
        """
        if attachment.size is not None and attachment.size > limit:
            raise AttachmentError(
                f"{attachment.name or 'the file'} is over {limit} bytes", channel=_CHANNEL, too_large=True
            )
        url = urlsplit(attachment.ref)
        api = urlsplit(self._rest.base_url)
        own_host = url.scheme == api.scheme and url.netloc == api.netloc
        if not own_host and not (url.scheme == "https" and url.hostname in _CDN_HOSTS):
            raise AttachmentError("not a Discord attachment URL", channel=_CHANNEL)
        data = bytearray()
        try:  # CDN URLs are signed: the bot token never goes with them
            async with self._rest.session().get(attachment.ref) as resp:
                if resp.status != 200:
                    raise AttachmentError(f"Discord's CDN answered {resp.status} (expired or gone)", channel=_CHANNEL)
                async for chunk in resp.content.iter_chunked(65536):
                    data += chunk
                    if len(data) > limit:
                        raise AttachmentError(f"the file is over {limit} bytes", channel=_CHANNEL, too_large=True)
                mime = attachment.mime_type or resp.content_type
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AttachmentError(f"could not download the file ({type(exc).__name__})", channel=_CHANNEL) from None
        return FileData(name=attachment.name or "file", data=bytes(data), mime_type=mime)

    # lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Learn the bot's id (``GET /users/@me``) and, when unset, the application id; failures are logged."""
        if self._token is None:
            return
        try:
            me = await self._rest.request("GET", "/users/@me")
            self.bot_id = str(me["id"])
            if self.application_id is None:
                app = await self._rest.request("GET", "/applications/@me")
                self.application_id = str(app["id"])
        except (DeliveryError, KeyError, TypeError) as exc:
            logger.warning("discord account %s: start-up lookup failed (%s)", self._account, type(exc).__name__)

    async def register_commands(self, extra: Sequence[tuple[str, str, bool]] = ()) -> list[str]:
        """Register ``/ask``, ``/reset``, ``/stop`` and ``extra`` globally (a bulk overwrite); returns their names.

        ``extra`` is ``(name, description, admins only)`` of the gateway's other commands (``/status``, ``/help``…):
        each takes an optional ``text`` argument, and one for admins only is shown to server administrators only
        (the gateway checks the sender's role whatever Discord shows).

        Raises:
            DeliveryError: Discord refused (no application id, wrong token).
        """
        if self.application_id is None:
            await self.start()
        if self.application_id is None:
            raise DeliveryError("set SWITCHBOARD_DISCORD__APPLICATION_ID", channel=_CHANNEL, retryable=False)
        route = "/applications/{application_id}/commands"
        path = f"/applications/{self.application_id}/commands"
        known = {str(c["name"]) for c in COMMANDS}
        body = COMMANDS + [
            {
                "name": name,
                "description": description[:100],
                "options": [{"type": 3, "name": "text", "description": "Arguments", "required": False}],
                "contexts": [0, 1, 2],
                **({"default_member_permissions": ADMINISTRATOR} if admins_only else {}),
            }
            for name, description, admins_only in extra
            if name not in known
        ]
        answer = await self._rest.request("PUT", route, path=path, json_body=body)
        return [str(c.get("name")) for c in answer] if isinstance(answer, list) else []

    async def aclose(self) -> None:
        """Close the REST pool."""
        await self._rest.aclose()


class _GatewayListener:
    """Feeds gateway dispatches to the ingest router, one at a time, each durably before the next."""

    retry_s = 1.0
    """First backoff after a failed connection (doubled up to a minute)."""

    def __init__(self, channel: DiscordChannel) -> None:
        self._channel = channel
        self._inbound = DiscordInbound(
            channel.account, channel.bot_id, require_mention=channel._require_mention, groups=channel._groups
        )

    async def listen(self, emit: Emit) -> None:
        """Hold the gateway connection until cancelled."""
        channel = self._channel
        assert channel._token is not None  # listener() gives none without a token
        self._inbound.bot_id = channel.bot_id or self._inbound.bot_id
        gateway = DiscordGateway(channel._rest, channel._token, retry_s=self.retry_s)

        async def handle(event: str, data: dict[str, Any]) -> None:
            try:
                if event == "INTERACTION_CREATE":
                    await self._interaction(data, emit)
                    return
                draft = self._inbound.dispatch(event, data)
            except MalformedBodyError as exc:
                logger.warning("discord gateway: dropped a %s dispatch: %s", event, exc)
                return
            if event == "READY":
                channel.bot_id = self._inbound.bot_id
            if draft is not None:
                await emit(Inbound(messages=(draft,)))

        await gateway.run(handle)

    async def _interaction(self, data: dict[str, Any], emit: Emit) -> None:
        interaction = load_interaction(data)
        answer = self._channel._answer(interaction)
        draft = parse_interaction(interaction, self._channel.account)
        if draft is not None:
            await emit(Inbound(messages=(draft,)))
        try:
            await self._channel._poster.callback(interaction.id, interaction.token, answer.body)
        except DeliveryError as exc:  # queued all the same: the reply follows in the channel
            logger.warning("discord gateway: interaction callback failed (%s)", exc)
