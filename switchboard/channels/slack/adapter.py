"""① and ⑤ for Slack: the Events API and interactivity over HTTP or Socket Mode, sends through the Web API.

The v0 signature is checked in constant time on the raw bytes, timestamp within five minutes, before anything is
parsed (slack-sdk's ``SignatureVerifier`` is not used: hostile bytes would make it raise, not answer 401). With an
app-level token the account receives over Socket Mode instead, one connection per account across every process.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Callable
from typing import ClassVar, Literal
from urllib.parse import parse_qs

from pydantic import ValidationError

from switchboard.channels.base import (
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
    perform_action,
)
from switchboard.channels.slack.api import SlackApi
from switchboard.channels.slack.inbound import (
    SlackIdentity,
    WireCallback,
    WireCommand,
    WireInteraction,
    parse_command,
    parse_event_callback,
    parse_interaction,
    wire_error,
)
from switchboard.channels.slack.outbound import MAX_BUTTONS, SlackSender
from switchboard.channels.slack.settings import SlackSettings
from switchboard.channels.slack.socket import SlackSocketListener
from switchboard.core.actions import Action
from switchboard.core.groups import GroupRule
from switchboard.core.messages import Attachment, ConversationRef
from switchboard.errors import DeliveryError, MalformedBodyError, SignatureError

__all__ = ["SIGNATURE_HEADER", "TIMESTAMP_HEADER", "SlackChannel", "problems"]

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Slack-Signature"
TIMESTAMP_HEADER = "X-Slack-Request-Timestamp"
_CHANNEL: Literal["slack"] = "slack"
_WINDOW_S = 300
EMPTY_200 = HttpAnswer(200, b"", None)
"""Slack's expected answer: an empty 200."""
_CONFIRM = {
    "reset": HttpAnswer(200, b'{"response_type":"ephemeral","text":"Starting a new conversation."}'),
    "stop": HttpAnswer(200, b'{"response_type":"ephemeral","text":"Stopping the current reply."}'),
}
"""Slash commands the gateway itself carries out, confirmed to their user alone in the ack (as on Discord)."""


def _is_ssl_check(request: RawRequest) -> bool:
    """Slack's certificate probe (``ssl_check=1``): carries nothing, needs nothing, answered with an empty 200."""
    if not request.body.startswith(b"ssl_check=1") or len(request.body) > 512:
        return False
    try:
        fields = parse_qs(request.body.decode("ascii"), strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        return False
    return fields.get("ssl_check") == ["1"] and set(fields) <= {"ssl_check", "token"}


class SlackChannel:
    """One Slack app installation (a bot token, and a signing secret or an app token).

    Args:
        settings: The account's ``SWITCHBOARD_SLACK__*`` block.
        account: The account name (``default`` for the env-configured one).
        require_mention: Channel messages reach the agent only when they mention the bot (used without ``groups``).
        groups: The account's group behaviour (``group_replies``).
        agent: The agent the account routes to, and
        tenant: its tenant (``BuildContext``): drafts are built routed (empty: the ingest router fills them in).
        clock: Seconds since the epoch (tests pass a fixed one).
    """

    name: ClassVar[Literal["slack"]] = "slack"

    def __init__(
        self,
        settings: SlackSettings,
        *,
        account: str = "default",
        require_mention: bool = True,
        groups: GroupRule | None = None,
        agent: str = "",
        tenant: str = "default",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._account = account
        self._clock = clock
        self.identity = SlackIdentity(
            account, require_mention=require_mention, groups=groups, agent=agent, tenant=tenant
        )
        token = settings.bot_token.get_secret_value() if settings.bot_token else ""
        self._api = SlackApi(token, settings.api_base_url)
        self._sender = SlackSender(self._api, account)
        self._secret = settings.signing_secret.get_secret_value().encode() if settings.signing_secret else None
        self._mac = hmac.new(self._secret, digestmod=hashlib.sha256) if self._secret is not None else None
        """The signing secret's HMAC state, copied per request (no key set-up or digest lookup per request)."""

    @property
    def account(self) -> str:
        """The account name."""
        return self._account

    @property
    def capabilities(self) -> Capabilities:
        """Messages (mrkdwn) up to 4,000 characters, edits, native streaming (else edits), buttons, files, status."""
        return Capabilities(
            max_text=4000,
            text_unit="chars",
            edits=True,
            streaming="native" if self._sender.native_streaming else "edits",
            buttons=MAX_BUTTONS,
            button_label=75,
            files=True,
            typing=True,
            typing_refresh_s=60.0,
            bot_rate=Rate(10.0, 20),
            chat_rate=Rate(1.0, 3),
            edit_rate=Rate(0.5, 1),
        )

    # ① inbound -----------------------------------------------------------------------------------

    async def verify(self, request: RawRequest) -> None:
        """Check the v0 signature over ``v0:{timestamp}:{raw body}`` (constant time) and the 5-minute window.

        Raises:
            SignatureError: 401 for a missing, repeated, stale or wrong signature; 403 when no secret is set.
        """
        if _is_ssl_check(request):
            return
        if self._secret is None:
            raise SignatureError(
                f"slack account {self._account!r} refuses every request until a signing secret is configured: set "
                "SWITCHBOARD_SLACK__SIGNING_SECRET (Basic Information → App Credentials → Signing Secret)",
                channel=_CHANNEL,
                status=403,
            )
        stamps, signatures = (
            header_values(request.headers, TIMESTAMP_HEADER),
            header_values(request.headers, SIGNATURE_HEADER),
        )
        if not stamps or not signatures:
            raise SignatureError(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header", channel=_CHANNEL)
        stamp = stamps[0]
        if len(stamps) != 1 or len(signatures) != 1 or not (stamp.isascii() and stamp.isdigit() and len(stamp) < 16):
            raise SignatureError(f"malformed {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header", channel=_CHANNEL)
        if abs(self._clock() - int(stamp)) > _WINDOW_S:
            raise SignatureError(
                "request timestamp outside the 5-minute window (replay or clock skew)", channel=_CHANNEL
            )
        mac = self._mac.copy() if self._mac is not None else hmac.new(self._secret, digestmod=hashlib.sha256)
        mac.update(b"v0:" + stamp.encode() + b":")
        mac.update(request.body)  # not concatenated to the prefix: no copy of the body
        expected = b"v0=" + mac.hexdigest().encode()
        if not hmac.compare_digest(signatures[0].encode("utf-8", "surrogateescape"), expected):
            raise SignatureError(f"wrong {SIGNATURE_HEADER}", channel=_CHANNEL)

    async def receive(self, request: RawRequest) -> Inbound:
        """An Events API callback, an interactivity payload, a URL verification or an SSL check → :class:`Inbound`.

        Raises:
            MalformedBodyError: the body is not a Slack payload.
        """
        content_type = next(iter(header_values(request.headers, "Content-Type")), "").split(";", 1)[0].strip().lower()
        if content_type == "application/x-www-form-urlencoded":
            return self._form(request.body)
        try:
            callback = WireCallback.model_validate_json(request.body)
        except ValidationError as err:
            raise wire_error(err, "Events API body") from None
        return self.receive_callback(callback)

    def receive_callback(self, callback: WireCallback) -> Inbound:
        """One Events API body (over HTTP, or a Socket Mode ``events_api`` envelope's payload)."""
        if callback.type == "url_verification":
            if not callback.challenge:
                raise MalformedBodyError("url_verification without a challenge", channel=_CHANNEL)
            return Inbound((), HttpAnswer(200, callback.challenge.encode(), "text/plain"))
        if callback.type != "event_callback":
            return Inbound((), EMPTY_200)  # app_rate_limited and future types: nothing for the agent
        self.identity.learn(callback)
        draft = parse_event_callback(self.identity, callback)
        return Inbound((draft,) if draft is not None else (), EMPTY_200)

    def receive_interaction(self, payload: WireInteraction) -> Inbound:
        """One interactivity payload (a button click → a choice)."""
        draft = parse_interaction(self.identity, payload)
        return Inbound((draft,) if draft is not None else (), EMPTY_200)

    def receive_command(self, command: WireCommand) -> Inbound:
        """One slash command → its draft, acked with an empty 200 (the answer follows in the channel)."""
        answer = _CONFIRM.get(command.command[1:].lower(), EMPTY_200)
        return Inbound((parse_command(self.identity, command),), answer)

    def _form(self, body: bytes) -> Inbound:
        try:
            fields = parse_qs(body.decode("utf-8"), max_num_fields=64)
        except (UnicodeDecodeError, ValueError):
            raise MalformedBodyError("form body is not UTF-8 key=value pairs", channel=_CHANNEL) from None
        if repeated := sorted(name for name, values in fields.items() if len(values) > 1):
            # which value is meant would depend on the reader: Slack never repeats a field
            raise MalformedBodyError(f"form field given more than once: {', '.join(repeated)}", channel=_CHANNEL)
        payload = fields.get("payload")
        if payload:
            try:
                interaction = WireInteraction.model_validate_json(payload[0])
            except ValidationError as err:
                raise wire_error(err, "interactivity payload") from None
            return self.receive_interaction(interaction)
        if "command" in fields:
            try:
                command = WireCommand.model_validate({name: values[0] for name, values in fields.items()})
            except ValidationError as err:
                raise wire_error(err, "slash command") from None
            return self.receive_command(command)
        if fields.get("ssl_check") == ["1"]:
            return Inbound((), EMPTY_200)
        raise MalformedBodyError("form body without a payload", channel=_CHANNEL)

    # ⑤ outbound ----------------------------------------------------------------------------------

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Carry out one send action in the conversation (its thread, for channel conversations).

        Raises:
            RateLimitedError: Slack answered 429; retry after ``retry_after`` seconds.
            DeliveryError: ``retryable`` for network trouble and 5xx, not for refusals.
        """
        if self._settings.bot_token is None:
            raise DeliveryError(
                f"slack account {self._account!r} has no bot token: set SWITCHBOARD_SLACK__BOT_TOKEN",
                channel=_CHANNEL,
                retryable=False,
            )
        return await perform_action(self._sender, action, conversation, send)

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FileData:
        """Download a file the user shared (``url_private``, with the bot token), refusing more than ``limit``.

        Raises:
            AttachmentError: too large, gone, not on a Slack host, or Slack refused.
        """
        return await self._sender.fetch(attachment, limit)

    def listener(self) -> Listener | None:
        """The Socket Mode connection when an app-level token is configured."""
        if self._settings.app_token is None:
            return None
        return SlackSocketListener(self, self._settings.app_token.get_secret_value(), self._api)

    async def start(self) -> None:
        """Learn the bot's user id and bot id with ``auth.test`` (failures only logged)."""
        if self._settings.bot_token is None:
            return
        try:
            answer = await self._api.call("auth.test", {})
        except DeliveryError as exc:
            logger.warning(
                "slack account %s: auth.test failed (%s); the bot user id comes from the first event",
                self._account,
                type(exc).__name__,
            )
            return
        user, bot = answer.get("user_id"), answer.get("bot_id")
        self.identity.bot_user_id = user if isinstance(user, str) else self.identity.bot_user_id
        self.identity.bot_id = bot if isinstance(bot, str) else self.identity.bot_id

    async def aclose(self) -> None:
        """Close the Web API connection pool."""
        await self._api.aclose()


def problems(settings: SlackSettings) -> list[str]:
    """What keeps an account from working, and how to fix it (``switchboard check``)."""
    found = []
    if settings.bot_token is None:
        found.append("no bot token: set SWITCHBOARD_SLACK__BOT_TOKEN (OAuth & Permissions → Bot User OAuth Token)")
    elif not settings.bot_token.get_secret_value().startswith("xoxb-"):
        found.append("SWITCHBOARD_SLACK__BOT_TOKEN is not a bot token (it starts with xoxb-)")
    if settings.signing_secret is None and settings.app_token is None:
        found.append(
            "no way to receive: set SWITCHBOARD_SLACK__SIGNING_SECRET (Events API over HTTP) or "
            "SWITCHBOARD_SLACK__APP_TOKEN (Socket Mode, no public URL needed)"
        )
    if settings.app_token is not None and not settings.app_token.get_secret_value().startswith("xapp-"):
        found.append("SWITCHBOARD_SLACK__APP_TOKEN is not an app-level token (it starts with xapp-)")
    if not settings.api_base_url.endswith("/"):
        found.append("SWITCHBOARD_SLACK__API_BASE_URL must end with / (like https://slack.com/api/)")
    return found
