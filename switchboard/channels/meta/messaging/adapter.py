"""The adapter Messenger and Instagram share: both are the Messenger Platform, one webhook URL for every account.

The signature or handshake is checked on the raw bytes before anything is parsed; a delivery becomes drafts naming
their accounts, receipts become delivery reports, never messages for the agent. An account's id comes from its
settings or ``GET /me`` at start-up; until known, an id no configured account claims is taken as its own (the app
secret vouches for the delivery). Users' files are fetched lazily from Meta's CDN only, size-capped, without the token.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, assert_never

from pydantic import ValidationError

from switchboard.channels.base import (
    OK_JSON,
    Capabilities,
    FileData,
    Inbound,
    Listener,
    RawRequest,
    Receipt,
    SendContext,
)
from switchboard.channels.meta.graph import GraphApi
from switchboard.channels.meta.messaging.inbound import MessagingReader, WireDelivery, wire_error
from switchboard.channels.meta.messaging.outbound import MessagingSender
from switchboard.channels.meta.webhook import (
    AccountMap,
    handshake_answer,
    load_delivery,
    verify_request,
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
    StreamDelta,
    StreamText,
)
from switchboard.core.messages import Attachment, ConversationRef
from switchboard.errors import AttachmentError, DeliveryError

__all__ = ["MessagingAccount", "MessagingAdapter"]

logger = logging.getLogger(__name__)

_OBJECT = {"messenger": "page", "instagram": "instagram"}


@dataclass(frozen=True, slots=True)
class MessagingAccount:
    """One account's settings, whichever channel's block they came from (secrets kept out of ``repr``)."""

    channel: Literal["messenger", "instagram"]
    account: str
    token: str | None = field(repr=False)
    app_secret: bytes | None = field(repr=False)
    verify_token: bytes | None = field(repr=False)
    graph_base_url: str
    platform_id: str | None
    """The Page id / Instagram account id (``None``: looked up at start-up)."""
    human_agent: bool
    agent: str = ""
    tenant: str = "default"


def _same_app(one: MessagingAccount, other: MessagingAccount) -> bool:
    return (
        one.app_secret is not None
        and other.app_secret is not None
        and hmac.compare_digest(one.app_secret, other.app_secret)
    )


class MessagingAdapter:
    """One Messenger Page or Instagram account (the channel modules build it with their capabilities).

    Args:
        config: The account's settings.
        siblings: Every account of the channel by name (``BuildContext.accounts``): the ones of the same app (same
            app secret) are routed to from this account's webhook URL by their ids, looked up at start-up where
            not configured.
        capabilities: What the channel shows.
    """

    def __init__(
        self, config: MessagingAccount, siblings: Mapping[str, MessagingAccount], capabilities: Capabilities
    ) -> None:
        self._config = config
        self._accounts = AccountMap.build(
            siblings, lambda a: a.platform_id, lambda a: a.app_secret, own=(config.account, config)
        )
        self._unresolved = [
            other
            for name, other in siblings.items()
            if name != config.account and other.platform_id is None and other.token and _same_app(config, other)
        ]
        self._foreign_ids = frozenset(
            other.platform_id
            for other in siblings.values()
            if other.platform_id and other.platform_id not in self._accounts.by_id
        )
        """Ids other apps' accounts claim: never this account's, even while its own id is unknown."""
        self._own_id = config.platform_id
        self._capabilities = capabilities
        self._api = GraphApi(config.token or "", config.graph_base_url, channel=config.channel, account=config.account)
        self._reader = MessagingReader(
            config.channel, self._account_of, home=config.account, agent=config.agent, tenant=config.tenant
        )
        self._sender = MessagingSender(
            self._api,
            channel=config.channel,
            account=config.account,
            limit=capabilities.max_text,
            unit="bytes" if capabilities.text_unit == "bytes" else "chars",
            human_agent=config.human_agent,
            uploads=capabilities.files,
        )

    @property
    def name(self) -> Literal["messenger", "instagram"]:
        """The channel."""
        return self._config.channel

    @property
    def account(self) -> str:
        """The account name."""
        return self._config.account

    @property
    def capabilities(self) -> Capabilities:
        """What the channel shows (declared by the channel module)."""
        return self._capabilities

    def _account_of(self, platform_id: str) -> str:
        found = self._accounts.by_id.get(platform_id)
        if found is not None:
            return found
        if self._own_id is None and platform_id not in self._foreign_ids:
            return self._config.account  # not configured, not looked up yet: the app secret vouches for the delivery
        return self._accounts.account_for(platform_id)

    # ① inbound -----------------------------------------------------------------------------------

    async def verify(self, request: RawRequest) -> None:
        """The handshake's verify token (``GET``) or the body's ``X-Hub-Signature-256`` (``POST``), constant time.

        Raises:
            SignatureError: 403 for a wrong handshake or no secret configured; 401 for a bad signature.
        """
        config = self._config
        verify_request(request, app_secret=config.app_secret, verify_token=config.verify_token, channel=config.channel)

    async def receive(self, request: RawRequest) -> Inbound:
        """The handshake's challenge, or every message of a delivery and its receipts (as delivery reports).

        Raises:
            MalformedBodyError: not a delivery of this channel's ``object``.
        """
        channel = self._config.channel
        if request.method == "GET":
            return handshake_answer(request, channel)
        payload = load_delivery(request.body, _OBJECT[channel], channel)
        try:
            delivery = WireDelivery.model_validate(payload)
        except ValidationError as err:
            raise wire_error(err, channel) from None
        parsed = self._reader.read_delivery(delivery)
        return Inbound(parsed.messages, OK_JSON, parsed.statuses)

    # ⑤ outbound ----------------------------------------------------------------------------------

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Carry out one send action for the conversation's user.

        Raises:
            RateLimitedError: the Graph API throttled the account (retried after a jittered back-off).
            DeliveryError: ``retryable`` for network trouble and 5xx; not for auth, recipient, window refusals.
        """
        if not self._config.token:
            raise DeliveryError(
                f"{self.name} account {self.account!r} has no access token", channel=self.name, retryable=False
            )
        sender = self._sender
        match action:
            case SendText():
                return await sender.text(action.text, conversation, send)
            case SendError():
                return await sender.error(action.message, conversation, send)
            case SendTyping():
                return await sender.typing(conversation, send)
            case OfferChoice():
                return await sender.choice(action, conversation, send)
            case SendFile():
                return await sender.file(action, conversation, send)
            case StreamText():
                return Receipt(parts=0, detail={"streaming": "unavailable", "reason": f"{self.name} has no streams"})
            case EditText():
                raise DeliveryError(f"{self.name} cannot edit a sent message", channel=self.name, retryable=False)
            case SetStatus() | StreamDelta():
                return Receipt(parts=0)
            case AckChoice():
                return Receipt(parts=0, detail={"ack": "http"})  # a tap needs no acknowledgement
            case _:
                assert_never(action)

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FileData:
        """Download a file the user sent from Meta's CDN (``payload.url``), refusing more than ``limit``.

        Raises:
            AttachmentError: too large, expired, not on Meta's CDN, or unreachable.
        """
        if attachment.size is not None and attachment.size > limit:
            raise AttachmentError(f"the file is over {limit} bytes", channel=self.name, too_large=True)
        got = await self._api.download(attachment.ref, limit, authorized=False)  # signed URLs: no token
        name = attachment.name or got.url.name or "file"
        return FileData(name=name[:200], data=got.data, mime_type=attachment.mime_type or got.content_type)

    def listener(self) -> Listener | None:
        """None: Meta delivers by webhook only."""
        return None

    async def start(self) -> None:
        """Look up with ``GET /me`` the Page / Instagram account ids not configured: this account's and its siblings'.

        Failures are logged: until its id is known, an id no other account claims is taken as this account's own.
        """
        config = self._config
        if self._own_id is None and config.token:
            found = await self._look_up(self._api, config.account)
            if found is not None:
                self._own_id = found
                self._accounts = AccountMap({**self._accounts.by_id, found: config.account})
        for other in self._unresolved:
            api = GraphApi(other.token or "", other.graph_base_url, channel=config.channel, account=other.account)
            try:
                found = await self._look_up(api, other.account)
            finally:
                await api.aclose()
            if found is not None and found not in self._accounts.by_id:
                self._accounts = AccountMap({**self._accounts.by_id, found: other.account})

    async def _look_up(self, api: GraphApi, account: str) -> str | None:
        try:
            me = await api.get(self.id_query(api.base_url))
        except DeliveryError as exc:
            logger.warning("%s account %s: GET /me failed (%s)", self.name, account, type(exc).__name__)
            return None
        found = self.id_in(me)
        if found is None:
            logger.warning("%s account %s: GET /me named no id for its webhooks", self.name, account)
        return found

    def id_query(self, graph_base_url: str) -> str:
        """The ``GET`` that names the id the account's webhooks carry in ``entry[].id`` (the Page's: ``me``)."""
        return "me?fields=id"

    def id_in(self, answer: dict[str, Any]) -> str | None:
        """That id, read from the answer to :meth:`id_query`."""
        found = answer.get("id")
        return found if isinstance(found, str) and found else None

    async def aclose(self) -> None:
        """Close the Graph API connection pool."""
        await self._api.aclose()
