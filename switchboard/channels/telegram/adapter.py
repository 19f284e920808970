"""① and ⑤ for Telegram: the webhook secret or long polling, ``Update`` → inbound events, the Bot API for sends.

Telegram signs nothing: ``setWebhook(secret_token=…)`` makes it echo a shared secret, compared here in constant time
before the body is read. Hosts without a public HTTPS URL poll instead, one poller per bot across all processes.
Reading is :mod:`~switchboard.channels.telegram.inbound`, sending :mod:`~switchboard.channels.telegram.outbound`.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal, assert_never

from pydantic import ValidationError

from switchboard.channels.base import (
    OK_JSON,
    Capabilities,
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
from switchboard.channels.telegram.api import BotApi
from switchboard.channels.telegram.files import fetch_file
from switchboard.channels.telegram.inbound import WIRE_UPDATE, UpdateReader
from switchboard.channels.telegram.outbound import MAX_BUTTON_LABEL, MAX_BUTTONS, TelegramSender, is_private
from switchboard.channels.telegram.polling import TelegramPoller
from switchboard.channels.telegram.settings import TelegramSettings
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
from switchboard.core.groups import GroupRule
from switchboard.core.messages import Attachment, ConversationRef, InboundMessage
from switchboard.errors import ConfigError, DeliveryError, MalformedBodyError, SignatureError

__all__ = ["CAPABILITIES", "GROUP_CAPABILITIES", "SECRET_HEADER", "TelegramChannel"]

logger = logging.getLogger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"  # noqa: S105 - a header name, not a secret
_CHANNEL: Literal["telegram"] = "telegram"
_ANSWER_TAP = {"method": "answerCallbackQuery"}
"""A Bot API call made by answering the webhook (Telegram runs it; no result comes back)."""

CAPABILITIES = Capabilities(
    max_text=4096,
    text_unit="utf16",
    edits=True,
    streaming="native",
    buttons=MAX_BUTTONS,
    button_label=MAX_BUTTON_LABEL,
    files=True,
    voice=True,
    typing=True,
    typing_refresh_s=4.0,
    bot_rate=Rate(30.0, 30),
    chat_rate=Rate(1.0, 3),
    edit_rate=Rate(1.0, 1),
)
"""A private chat: 4,096 UTF-16 units after entity parsing, drafts (``sendMessageDraft``), ~1 message a second."""

GROUP_CAPABILITIES = replace(CAPABILITIES, streaming="edits", chat_rate=Rate(20 / 60, 3), edit_rate=Rate(0.2, 1))
"""A group or a forum topic: no drafts (streaming by edits), ~20 messages a minute with edits counted."""


def _malformed(err: ValidationError) -> MalformedBodyError:
    first = err.errors()[0]
    if first["type"] == "json_invalid":
        return MalformedBodyError("body is not JSON", channel=_CHANNEL)
    if first["type"] in ("dict_type", "model_type", "model_attributes_type") and not first["loc"]:
        return MalformedBodyError("body must be a JSON object (a Telegram Update)", channel=_CHANNEL)
    where = ".".join(str(p) for p in first["loc"])[:200] or "body"
    return MalformedBodyError(f"not a Telegram Update: {where}: {first['msg']}", channel=_CHANNEL)


class TelegramChannel:
    """One Telegram bot account.

    Args:
        settings: The account's ``SWITCHBOARD_TELEGRAM__*`` block.
        account: The account name (``default`` for the env-configured bot).
        require_mention: Group messages reach the agent only when they address the bot (used without ``groups``).
        groups: The account's group behaviour (``group_replies``).
        agent: The agent the account routes to, and
        tenant: its tenant (``BuildContext``): drafts are built routed (empty: the ingest router fills them in).
        poll_timeout: Seconds one ``getUpdates`` long poll waits (polling transport).
        poll_backoff: ``(first, most)`` seconds between failed polls.
    """

    def __init__(
        self,
        settings: TelegramSettings,
        *,
        account: str = "default",
        require_mention: bool = True,
        groups: GroupRule | None = None,
        agent: str = "",
        tenant: str = "default",
        poll_timeout: float = 25.0,
        poll_backoff: tuple[float, float] = (1.0, 30.0),
    ) -> None:
        self._settings = settings
        self._account = account
        token = settings.bot_token.get_secret_value() if settings.bot_token else ""
        prefix = token.split(":", 1)[0]
        username = (settings.bot_username or "").lstrip("@") or None
        self._reader = UpdateReader(
            account,
            bot_id=int(prefix) if prefix.isdigit() else None,
            username=username,
            require_mention=require_mention,
            groups=groups,
            agent=agent,
            tenant=tenant,
        )
        self._api: BotApi | None = None
        self._sender = TelegramSender(self._client)
        self._poller: TelegramPoller | None = None
        if settings.transport == "polling":
            self._poller = TelegramPoller(
                self._client, self.read_update, account=account, poll_timeout=poll_timeout, backoff=poll_backoff
            )

    @property
    def name(self) -> Literal["telegram"]:
        """``telegram``."""
        return _CHANNEL

    @property
    def account(self) -> str:
        """The account name."""
        return self._account

    @property
    def capabilities(self) -> Capabilities:
        """What a private chat shows (groups: :meth:`capabilities_for`)."""
        return CAPABILITIES

    def capabilities_for(self, conversation: ConversationRef) -> Capabilities:
        """What this conversation shows: drafts and 1 message/s in private chats, edits and 20/min in groups."""
        return CAPABILITIES if is_private(conversation) else GROUP_CAPABILITIES

    @property
    def bot_username(self) -> str | None:
        """The bot's ``@username`` (without ``@``), configured or learnt with ``getMe``."""
        return self._reader.username

    @property
    def bot_id(self) -> int | None:
        """The bot's user id (the digits before ``:`` in its token, confirmed by ``getMe``)."""
        return self._reader.bot_id

    # ① inbound -----------------------------------------------------------------------------------

    async def verify(self, request: RawRequest) -> None:
        """Check ``X-Telegram-Bot-Api-Secret-Token`` against the configured secret (constant time, raw bytes).

        Raises:
            SignatureError: 401 when the header is missing, 403 when it is wrong, repeated, or no secret is set.
        """
        expected = self._settings.secret_token
        if expected is None:
            raise SignatureError(
                f"telegram account {self._account!r} refuses every webhook until a secret is configured: set "
                "SWITCHBOARD_TELEGRAM__SECRET_TOKEN and pass the same value as secret_token to setWebhook",
                channel=_CHANNEL,
                status=403,
            )
        values = header_values(request.headers, SECRET_HEADER)
        if not values:
            raise SignatureError(f"missing {SECRET_HEADER} header", channel=_CHANNEL, status=401)
        given = values[0].encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, expected.get_secret_value().encode()) or len(values) != 1:
            raise SignatureError(f"wrong {SECRET_HEADER} header", channel=_CHANNEL, status=403)

    async def receive(self, request: RawRequest) -> Inbound:
        """Normalise one ``Update`` into zero or one inbound message; Telegram expects ``{"ok":true}``.

        Raises:
            MalformedBodyError: the body is not JSON or not a Telegram ``Update``.
        """
        try:  # one pass over the bytes: pydantic-core parses and checks the shape together
            wire = WIRE_UPDATE.validate_json(request.body)
        except ValidationError as err:
            raise _malformed(err) from None
        drafts = self._reader.read(wire)
        if not drafts and (query := wire.get("callback_query")) is not None:
            # a tap no turn will answer (a game's, an inline-mode message's): answered with the webhook's answer
            answer = json.dumps({**_ANSWER_TAP, "callback_query_id": query["id"]})
            return Inbound(answer=HttpAnswer(200, answer.encode()))
        return Inbound(messages=tuple(drafts), answer=OK_JSON)

    def read_update(self, update: Any) -> list[InboundMessage]:
        """Normalise one decoded ``Update`` (from ``getUpdates``).

        Raises:
            ValidationError: it is not a Telegram ``Update``.
        """
        return self._reader.read(WIRE_UPDATE.validate_python(update))

    def listener(self) -> Listener | None:
        """The ``getUpdates`` poller when the transport is ``polling``, else ``None`` (webhook)."""
        return self._poller

    # ⑤ outbound ----------------------------------------------------------------------------------

    def _client(self) -> BotApi:
        if self._api is None:
            if self._settings.bot_token is None:
                raise DeliveryError(
                    f"telegram account {self._account!r} has no bot token: set SWITCHBOARD_TELEGRAM__BOT_TOKEN",
                    channel=_CHANNEL,
                    retryable=False,
                )
            self._api = BotApi(self._settings.bot_token.get_secret_value(), self._settings.api_base_url)
        return self._api

    async def start(self) -> None:
        """Learn the bot's id and username with ``getMe`` (once, at start-up; failures only logged).

        Without a username, group messages reach the agent only as replies to the bot.
        """
        if self._settings.bot_token is None:
            return
        try:
            me = await self._client().call("getMe", {})
            bot_id, username = me["id"], me.get("username")
        except (DeliveryError, KeyError, TypeError) as exc:
            logger.warning(
                "telegram account %s: getMe failed (%s); group mentions are %s",
                self._account,
                type(exc).__name__,
                "matched by the configured username" if self._reader.username else "not recognised, only replies",
            )
            return
        if isinstance(bot_id, int):
            self._reader.bot_id = bot_id
        self._reader.username = self._reader.username or (username if isinstance(username, str) else None)

    async def set_webhook(self, url: str) -> None:
        """Point Telegram at ``url`` with this account's secret token (``setWebhook``).

        Raises:
            ConfigError: no secret token is configured.
            DeliveryError: Telegram refused or could not be reached.
        """
        if self._settings.secret_token is None:
            raise ConfigError("set SWITCHBOARD_TELEGRAM__SECRET_TOKEN before registering a webhook", field="telegram")
        secret = self._settings.secret_token.get_secret_value()
        await self._client().call("setWebhook", {"url": url, "secret_token": secret})

    async def set_commands(self, commands: Sequence[tuple[str, str]], chat_id: str | None = None) -> None:
        """Set the bot's command menu (``setMyCommands``): for every chat, or for one private chat (``chat_id``).

        Raises:
            DeliveryError: Telegram refused or could not be reached.
        """
        scope = {"type": "chat", "chat_id": chat_id} if chat_id is not None else {"type": "default"}
        listed = [{"command": name, "description": description[:256]} for name, description in commands]
        await self._client().call("setMyCommands", {"commands": listed, "scope": scope})

    async def delete_webhook(self) -> None:
        """Stop Telegram posting to the webhook (``deleteWebhook``; waiting updates are kept for polling).

        Raises:
            DeliveryError: Telegram refused or could not be reached.
        """
        await self._client().call("deleteWebhook", {"drop_pending_updates": False})

    async def webhook_info(self) -> dict[str, Any]:
        """``getWebhookInfo``: the URL Telegram posts to (empty when polling) and its delivery state."""
        info = await self._client().call("getWebhookInfo", {})
        return info if isinstance(info, dict) else {}

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Carry out one send action in the conversation.

        Raises:
            RateLimitedError: Telegram answered 429; retry after ``retry_after`` seconds.
            DeliveryError: ``retryable`` for network trouble and 5xx, not for 4xx.
        """
        sender = self._sender
        match action:
            case SendText():
                return await sender.text(action.text, conversation, send)
            case SendTyping():
                return await sender.typing(conversation, send)
            case SetStatus() | StreamDelta() | ShowToolCall() | SettleChoices():
                return Receipt(parts=0)
            case SendError():
                return await sender.error(action, conversation, send)
            case SendFile():
                return await sender.file(action, conversation, send)
            case SendVoice():
                return await sender.voice(action, conversation, send)
            case OfferChoice():
                return await sender.choice(action, conversation, send)
            case EditText():
                return await sender.edit(action, conversation, send)
            case StreamText():
                return await sender.stream(action, conversation, send)
            case AckChoice():
                return await sender.ack(action, send)
            case _:
                assert_never(action)

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FileData:
        """Download a file the user sent (``getFile``, then the file URL), refusing more than ``limit`` bytes.

        Raises:
            AttachmentError: too large, gone, or Telegram refused or failed.
        """
        return await fetch_file(self._client(), attachment, limit)

    async def aclose(self) -> None:
        """Close the Bot API connection pool."""
        api, self._api = self._api, None
        if api is not None:
            await api.aclose()
