"""The adapter Messenger and Instagram share: both are the Messenger Platform, one webhook URL for every account.

The signature or handshake is checked on the raw bytes before anything is parsed; a delivery becomes drafts naming
their accounts, receipts become delivery reports, never messages for the agent. An account's id comes from its
settings or ``GET /me`` at start-up; until known, an id no configured account claims is taken as its own (the app
secret vouches for the delivery). Users' files are fetched lazily from Meta's CDN only, size-capped, without the token.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from pydantic import SecretStr, ValidationError

from switchboard.channels.base import (
    OK_JSON,
    Capabilities,
    FileData,
    Inbound,
    Listener,
    Rate,
    RawRequest,
    Receipt,
    SendContext,
    perform_action,
)
from switchboard.channels.meta.graph import GraphApi
from switchboard.channels.meta.messaging.inbound import MessagingReader, WireDelivery, wire_error
from switchboard.channels.meta.messaging.outbound import MAX_QUICK_REPLIES, QUICK_REPLY_TITLE, MessagingSender
from switchboard.channels.meta.webhook import (
    AccountMap,
    handshake_answer,
    load_delivery,
    secret_bytes,
    verify_request,
)
from switchboard.channels.registry import BuildContext
from switchboard.core.actions import Action
from switchboard.core.messages import Attachment, ConversationRef
from switchboard.errors import AttachmentError, DeliveryError
from switchboard.settings.channels import ChannelSettings, secure_endpoint

__all__ = [
    "MessagingAccount",
    "MessagingAdapter",
    "MessagingBlock",
    "account_configs",
    "block_problems",
    "platform_account",
    "platform_capabilities",
]

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


class MessagingBlock(Protocol):
    """What a Messenger and an Instagram settings block share."""

    @property
    def app_secret(self) -> SecretStr | None:
        """The Meta app's secret (signs every webhook delivery)."""

    @property
    def verify_token(self) -> SecretStr | None:
        """The string typed in the App Dashboard (the subscription handshake)."""

    @property
    def graph_base_url(self) -> str:
        """The Graph API's base URL."""

    @property
    def human_agent(self) -> bool:
        """Outside the 24-hour window, send replies tagged ``HUMAN_AGENT``."""


B = TypeVar("B", bound=ChannelSettings)


def platform_capabilities(max_text: int, text_unit: Literal["chars", "bytes"], *, files: bool) -> Capabilities:
    """The Messenger Platform's: no edits (final reply only), quick replies, typing, 300 Send API calls a second."""
    return Capabilities(
        max_text=max_text,
        text_unit=text_unit,
        edits=False,
        streaming="none",
        buttons=MAX_QUICK_REPLIES,
        button_label=QUICK_REPLY_TITLE,
        files=files,
        typing=True,
        typing_refresh_s=15.0,
        bot_rate=Rate(300.0, 100),
        chat_rate=Rate(1.0, 5),
    )


def platform_account(
    channel: Literal["messenger", "instagram"],
    settings: MessagingBlock,
    context: BuildContext,
    *,
    token: SecretStr | None,
    platform_id: str | None,
) -> MessagingAccount:
    """What the shared adapter needs of one account's block (``token`` and ``platform_id``: the channel's names)."""
    return MessagingAccount(
        channel=channel,
        account=context.account,
        token=token.get_secret_value() if token else None,
        app_secret=secret_bytes(settings.app_secret),
        verify_token=secret_bytes(settings.verify_token),
        graph_base_url=settings.graph_base_url,
        platform_id=platform_id or None,
        human_agent=settings.human_agent,
        agent=context.agent,
        tenant=context.tenant,
    )


def account_configs(
    settings: B, context: BuildContext | None, config: Callable[[B, BuildContext], MessagingAccount]
) -> tuple[MessagingAccount, dict[str, MessagingAccount]]:
    """One account's config, and every account's of its channel by name (the adapter's ``siblings``)."""
    context = context or BuildContext()
    kind: type[B] = type(settings)
    siblings = {
        name: config(block, BuildContext(account=name))
        for name, block in context.accounts.items()
        if isinstance(block, kind)
    }
    return config(settings, context), siblings


def block_problems(
    settings: MessagingBlock,
    env: str,
    platform_id: tuple[str | None, str],
    *,
    app_key: str,
    verify: str,
    https: str,
) -> list[str]:
    """What keeps an account of either channel from working, and how to fix it (``switchboard check``).

    Args:
        settings: The account's block.
        env: The block's variable prefix (``SWITCHBOARD_MESSENGER``).
        platform_id: The block's Page / account id, and what to say when it is not numeric.
        app_key: Where the app secret is found.
        verify: Where the verify token is typed.
        https: An example of a Graph base URL.
    """
    found = []
    if settings.app_secret is None:
        found.append(
            f"no app secret: set {env}__APP_SECRET ({app_key}); every webhook delivery is refused until it is set"
        )
    if settings.verify_token is None:
        found.append(
            f"no verify token: set {env}__VERIFY_TOKEN to the string typed in {verify}; the subscription handshake "
            "is refused until it is set"
        )
    if not secure_endpoint(settings.graph_base_url):
        found.append(f"{env}__GRAPH_BASE_URL must be https ({https})")
    configured, numeric = platform_id
    if configured and not configured.isdigit():
        found.append(numeric)
    return found


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
        return await perform_action(self._sender, action, conversation, send)

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
