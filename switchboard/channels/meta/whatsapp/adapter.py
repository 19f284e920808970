"""① and ⑤ for WhatsApp (Cloud API): Meta's signed webhooks in, Graph API sends out.

The handshake and signature checks are the shared Meta ones, on the raw bytes before parsing. One app's webhook URL
serves every number: each message goes to the account configured with its ``phone_number_id``, and a delivery is
accepted whole or not at all (Meta retries, duplicates dropped on the ``wamid``). WhatsApp has no edits: replies are
sent final only.
"""

from __future__ import annotations

import re
from typing import ClassVar, Final, Literal, assert_never

from switchboard.channels.base import (
    Capabilities,
    FileData,
    Inbound,
    Listener,
    Rate,
    RawRequest,
    Receipt,
    SendContext,
)
from switchboard.channels.meta.graph import GraphApi, GraphError
from switchboard.channels.meta.webhook import (
    AccountMap,
    handshake_answer,
    load_delivery,
    secret_bytes,
    verify_request,
)
from switchboard.channels.meta.whatsapp.inbound import WhatsAppIdentity, parse_delivery
from switchboard.channels.meta.whatsapp.outbound import MAX_LIST_ROWS, WhatsAppSender
from switchboard.channels.meta.whatsapp.settings import WhatsAppSettings
from switchboard.channels.registry import BuildContext
from switchboard.channels.render.whatsapp import MAX_TEXT
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
from switchboard.errors import AttachmentError, DeliveryError
from switchboard.settings.channels import secure_endpoint

__all__ = ["CAPABILITIES", "OBJECT", "WhatsAppChannel", "parse_template", "problems"]

_CHANNEL: Final = "whatsapp"
OBJECT: Final = "whatsapp_business_account"
"""The ``object`` of every WhatsApp webhook delivery."""
_TEMPLATE: Final = re.compile(r"([a-z0-9_]{1,512}):([A-Za-z_]{2,10})")

CAPABILITIES: Final = Capabilities(
    max_text=MAX_TEXT,
    text_unit="chars",
    edits=False,
    streaming="none",
    buttons=MAX_LIST_ROWS,
    button_label=24,
    files=True,
    voice=True,
    typing=True,
    typing_refresh_s=20.0,
    bot_rate=Rate(80.0, 80),
    chat_rate=Rate(1 / 6, 10),
)
"""No edits (final replies only); buttons or a list for up to 10 options; 80 messages/s per number; about one
message every 6 s to one user, with short bursts."""


def parse_template(value: str | None) -> tuple[str, str] | None:
    """``name:language`` → ``(name, language)``; ``None`` when unset or not in that form."""
    if not value:
        return None
    match = _TEMPLATE.fullmatch(value.strip())
    return (match.group(1), match.group(2)) if match else None


class WhatsAppChannel:
    """One WhatsApp business number (a phone number id, a system-user token, the app's secret and verify token).

    Args:
        settings: The account's ``SWITCHBOARD_WHATSAPP__*`` block.
        context: The account name, its route and every enabled WhatsApp account (for the number → account map).
    """

    name: ClassVar[Literal["whatsapp"]] = "whatsapp"

    def __init__(self, settings: WhatsAppSettings, context: BuildContext | None = None) -> None:
        context = context or BuildContext()
        self._settings = settings
        self._account = context.account
        self._secret = secret_bytes(settings.app_secret)
        self._verify_token = secret_bytes(settings.verify_token)
        accounts = AccountMap.build(
            {k: v for k, v in context.accounts.items() if isinstance(v, WhatsAppSettings)},
            lambda s: s.phone_number_id,
            lambda s: secret_bytes(s.app_secret),
            own=(context.account, settings),
        )
        self.identity = WhatsAppIdentity(context.account, accounts, agent=context.agent, tenant=context.tenant)
        token = settings.access_token.get_secret_value() if settings.access_token else ""
        self.api = GraphApi(token, settings.graph_base_url, channel=_CHANNEL, account=context.account)
        self._sender = WhatsAppSender(
            self.api, settings.phone_number_id or "", context.account, parse_template(settings.window_template)
        )

    @property
    def account(self) -> str:
        """The account name."""
        return self._account

    @property
    def capabilities(self) -> Capabilities:
        """See :data:`CAPABILITIES`."""
        return CAPABILITIES

    # ① inbound -----------------------------------------------------------------------------------

    async def verify(self, request: RawRequest) -> None:
        """The handshake's verify token (``GET``) or the body's ``X-Hub-Signature-256`` (``POST``), constant time.

        Raises:
            SignatureError: 403 for a wrong handshake or no secret configured, 401 for a bad signature.
        """
        verify_request(request, app_secret=self._secret, verify_token=self._verify_token, channel=_CHANNEL)

    async def receive(self, request: RawRequest) -> Inbound:
        """The handshake's challenge, or every message of a delivery and the statuses of our sends (as reports).

        Raises:
            MalformedBodyError: not a WhatsApp delivery.
        """
        if request.method == "GET":
            return handshake_answer(request, _CHANNEL)
        payload = load_delivery(request.body, OBJECT, _CHANNEL)
        return parse_delivery(self.identity, payload)

    # ⑤ outbound ----------------------------------------------------------------------------------

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Carry out one send action to the conversation's user.

        Raises:
            RateLimitedError: throttled by WhatsApp (jittered back-off).
            DeliveryError: ``retryable`` for network trouble and 5xx; not for refusals, auth errors, unreachable
                recipients or a closed window without a template.
        """
        if self._settings.access_token is None or not self._sender.phone_number_id:
            raise DeliveryError(
                f"whatsapp account {self._account!r} cannot send: set its access token and phone number id",
                channel=_CHANNEL,
                retryable=False,
            )
        sender = self._sender
        match action:
            case SendText():
                return await sender.text(action.text, conversation, send)
            case SendError():
                return await sender.text(f"⚠️ {action.message}", conversation, send)
            case StreamText():
                return await sender.text(action.text, conversation, send) if action.final else Receipt(parts=0)
            case EditText():
                raise DeliveryError("whatsapp cannot edit a sent message", channel=_CHANNEL, retryable=False)
            case SendTyping():
                return await sender.typing(conversation)
            case OfferChoice():
                return await sender.choice(action, conversation, send)
            case SendFile():
                return await sender.file(action, conversation, send)
            case SendVoice():
                return await sender.voice(action, conversation, send)
            case SetStatus() | StreamDelta() | AckChoice() | ShowToolCall() | SettleChoices():
                return Receipt(parts=0)  # a click is acknowledged by the webhook's 200
            case _:
                assert_never(action)

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FileData:
        """Download a file the user sent: ``GET /{media-id}`` for its URL, then that URL.

        Only Meta's media hosts are reached (every redirect checked), and the token only where they want it.

        Raises:
            AttachmentError: too large, expired (media ids last about 30 days), or refused.
        """
        try:
            info = await self.api.get(attachment.ref)
        except GraphError as err:
            raise AttachmentError(f"whatsapp media lookup failed (code {err.code})", channel=_CHANNEL) from None
        except DeliveryError:
            raise AttachmentError("whatsapp media lookup throttled; try again later", channel=_CHANNEL) from None
        url, size = info.get("url"), info.get("file_size")
        if not isinstance(url, str) or not url:
            raise AttachmentError("whatsapp media lookup returned no download URL", channel=_CHANNEL)
        if isinstance(size, int) and size > limit:
            raise AttachmentError(f"whatsapp media is over {limit} bytes", channel=_CHANNEL, too_large=True)
        got = await self.api.download(url, limit, authorized=True)
        mime = info.get("mime_type") if isinstance(info.get("mime_type"), str) else None
        name = attachment.name or f"{attachment.kind}-{attachment.ref[:32]}"
        return FileData(name, got.data, attachment.mime_type or mime or got.content_type)

    def listener(self) -> Listener | None:
        """WhatsApp only delivers by webhook."""
        return None

    async def start(self) -> None:
        """Nothing to look up: the number id is configured."""

    async def aclose(self) -> None:
        """Close the Graph API pool."""
        await self.api.aclose()


def problems(settings: WhatsAppSettings) -> list[str]:
    """What keeps an account from working, and how to fix it (``switchboard check``)."""
    found = []
    if settings.phone_number_id is None:
        found.append(
            "no phone number id: set SWITCHBOARD_WHATSAPP__PHONE_NUMBER_ID (WhatsApp → API Setup → Phone number ID; "
            "for a further account: options.phone_number_id)"
        )
    if settings.app_secret is None:
        found.append(
            "no app secret: set SWITCHBOARD_WHATSAPP__APP_SECRET (App settings → Basic → App secret); every webhook "
            "is refused until it is set"
        )
    if settings.verify_token is None:
        found.append(
            "no verify token: set SWITCHBOARD_WHATSAPP__VERIFY_TOKEN to the value typed in WhatsApp → Configuration → "
            "Webhook → Verify token"
        )
    if settings.window_template and parse_template(settings.window_template) is None:
        found.append("SWITCHBOARD_WHATSAPP__WINDOW_TEMPLATE must be name:language (e.g. hello_world:en_US)")
    if not secure_endpoint(settings.graph_base_url):
        found.append("SWITCHBOARD_WHATSAPP__GRAPH_BASE_URL must be https (like https://graph.facebook.com/v23.0)")
    return found
