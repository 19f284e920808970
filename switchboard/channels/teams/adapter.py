"""The Teams adapter itself (:class:`TeamsChannel`): token checks, activities in, proactive messages out.

Imported only when a Teams account is built (:mod:`switchboard.channels.teams.factory` holds the factory), so processes
without Teams never load the Agents SDK. See :mod:`switchboard.channels.teams.factory` for how Teams is served.
"""

from __future__ import annotations

import logging
from typing import ClassVar, Final, Literal

import aiohttp
from yarl import URL

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
    json_object,
    perform_action,
)
from switchboard.channels.download import download
from switchboard.channels.render.teams import MAX_TEXT
from switchboard.channels.teams.api import BotToken, ConnectorApi
from switchboard.channels.teams.auth import BotFrameworkKeys, TokenValidator
from switchboard.channels.teams.files import file_allowed, sends_token
from switchboard.channels.teams.inbound import TeamsIdentity, parse_activity, read_activity
from switchboard.channels.teams.outbound import MAX_BUTTONS, MAX_LABEL, TeamsSender
from switchboard.channels.teams.settings import TeamsSettings
from switchboard.core.actions import Action
from switchboard.core.groups import GroupRule
from switchboard.core.messages import Attachment, ConversationRef
from switchboard.errors import AttachmentError, DeliveryError, MalformedBodyError, SignatureError

__all__ = ["ACCEPTED", "CAPABILITIES", "TeamsChannel"]

logger = logging.getLogger(__name__)

_CHANNEL: Literal["teams"] = "teams"
ACCEPTED: Final = HttpAnswer(202, b"", None)
"""The answer to an activity once it is queued (the reply follows as a proactive message)."""
_INVOKE_OK: Final = HttpAnswer(200, b"{}")
CAPABILITIES: Final = Capabilities(
    max_text=MAX_TEXT,
    text_unit="utf16",
    edits=True,
    streaming="edits",
    buttons=MAX_BUTTONS,
    button_label=MAX_LABEL,
    files=False,
    typing=True,
    typing_refresh_s=3.0,
    bot_rate=Rate(30.0, 30),
    chat_rate=Rate(1.0, 3),
    edit_rate=Rate(0.5, 1),
)
"""Teams' limits: per bot per conversation 7 operations a second and 60 in 30 s; 50 a second per app and tenant."""
_FETCH_TIMEOUT: Final = aiohttp.ClientTimeout(total=60, connect=5, sock_read=30)


def _peek(body: bytes) -> tuple[str | None, str | None]:
    """``(serviceUrl, channelId)`` of a body, if it is a JSON object naming them (read once the token verified)."""
    raw = json_object(body)
    if raw is None:
        return None, None
    service_url, channel_id = raw.get("serviceUrl"), raw.get("channelId")
    return (
        service_url if isinstance(service_url, str) else None,
        channel_id if isinstance(channel_id, str) else None,
    )


class TeamsChannel:
    """One Teams bot (an Azure Bot resource's app registration).

    Args:
        settings: The account's ``SWITCHBOARD_TEAMS__*`` block.
        account: The account name (``default`` for the env-configured one).
        require_mention: Group chats and channels reach the agent only when the bot is mentioned (without ``groups``).
        groups: The account's group behaviour (``group_replies``).
        agent: The agent the account routes to, and
        tenant: its tenant (``BuildContext``).
        key_refresh_cooldown_s: Least time between key fetches caused by an unknown ``kid``.
    """

    name: ClassVar[Literal["teams"]] = "teams"

    def __init__(
        self,
        settings: TeamsSettings,
        *,
        account: str = "default",
        require_mention: bool = True,
        groups: GroupRule | None = None,
        agent: str = "",
        tenant: str = "default",
        key_refresh_cooldown_s: float = 300.0,
    ) -> None:
        self._settings = settings
        self._account = account
        self.identity = TeamsIdentity(
            account, require_mention=require_mention, groups=groups, agent=agent, tenant=tenant
        )
        password = settings.app_password.get_secret_value() if settings.app_password else ""
        self.token = BotToken(
            settings.login_base_url, settings.tenant_id, settings.app_id or "", password, lambda: self.api.http()
        )
        self.api = ConnectorApi(self.token, settings.connector_hosts)
        self.keys = BotFrameworkKeys(
            settings.openid_metadata_url, self.api.http, refresh_cooldown_s=key_refresh_cooldown_s
        )
        self.validator = TokenValidator(settings.app_id or "", self.keys)
        self._sender = TeamsSender(self.api)

    @property
    def account(self) -> str:
        """The account name."""
        return self._account

    @property
    def capabilities(self) -> Capabilities:
        """Markdown messages up to 16,000 UTF-16 units, edits (streaming by edits), card buttons, typing."""
        return CAPABILITIES

    # ① inbound -----------------------------------------------------------------------------------

    async def verify(self, request: RawRequest) -> None:
        """Check the Bot Connector's bearer token for this activity (see the module's docstring).

        Raises:
            SignatureError: 401 for a missing or bad token, or one issued for another ``serviceUrl``.
            MalformedBodyError: an authentic token on a body that is not an activity.
            ConnectionError: the signing keys could not be fetched (503: the Connector retries).
        """
        if not self.validator.app_id:
            raise SignatureError(
                f"teams account {self._account!r} refuses every activity until SWITCHBOARD_TEAMS__APP_ID is set",
                channel=_CHANNEL,
                status=403,
            )
        token = await self.validator.authenticate(request.headers)  # before the body costs a parse
        service_url, channel_id = _peek(request.body)
        token.check(service_url, channel_id)
        if service_url is None or channel_id is None:
            raise MalformedBodyError("not a Bot Framework activity (no serviceUrl or channelId)", channel=_CHANNEL)

    async def receive(self, request: RawRequest) -> Inbound:
        """A verified activity → at most one draft, answered 202 (200 with ``{}`` for an invoke).

        Raises:
            MalformedBodyError: the body is not an activity.
        """
        activity = read_activity(request.body)
        draft = parse_activity(self.identity, activity)
        answer = _INVOKE_OK if activity.type == "invoke" else ACCEPTED
        return Inbound((draft,) if draft is not None else (), answer)

    # ⑤ outbound ----------------------------------------------------------------------------------

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Carry out one send action in the conversation, at its verified ``serviceUrl``.

        Raises:
            RateLimitedError: the Connector answered 429.
            DeliveryError: ``retryable`` for network trouble, 412 and 5xx, not for refusals.
        """
        if self._settings.app_password is None:
            raise DeliveryError(
                f"teams account {self._account!r} has no app password: set SWITCHBOARD_TEAMS__APP_PASSWORD",
                channel=_CHANNEL,
                retryable=False,
            )
        return await perform_action(self._sender, action, conversation, send)

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FileData:
        """Download a file the user sent, refusing more than ``limit`` bytes.

        Only the hosts Teams serves files from are reached — SharePoint / OneDrive, the Bot Connector's hosts
        (``connector_hosts``, :func:`~switchboard.channels.teams.files.file_allowed`) — on the
        first hop and on every redirect, followed by hand. A file's ``downloadUrl`` is pre-authorised (no token is
        sent); an inline image on the conversation's Connector origin is fetched with the bot's token, which is
        never sent to any other origin, nor to a ``serviceUrl`` off the Connector.

        Raises:
            AttachmentError: too large, gone, on a host Teams does not serve files from, or unreachable.
        """
        if attachment.size is not None and attachment.size > limit:
            raise AttachmentError(f"the file is over the {limit}-byte limit", channel=_CHANNEL, too_large=True)
        service_url = conversation.extra.get("service_url", "")
        hosts = self._settings.connector_hosts
        token: dict[str, str] = {}

        def allowed(url: URL) -> bool:
            return file_allowed(url, service_url, hosts)

        def headers_for(url: URL) -> dict[str, str]:
            return token if sends_token(url, service_url, hosts) else {}

        try:
            first = URL(attachment.ref)
        except ValueError:
            first = URL()
        if first.absolute and sends_token(first, service_url, hosts):
            try:
                token["Authorization"] = f"Bearer {await self.token.get()}"
            except DeliveryError as exc:
                raise AttachmentError(f"no bot token for the download: {exc}", channel=_CHANNEL) from None
        got = await download(
            self.api.http(),
            attachment.ref,
            limit,
            allowed=allowed,
            headers_for=headers_for,
            channel=_CHANNEL,
            client_timeout=_FETCH_TIMEOUT,
        )
        name = attachment.name or got.url.name or "file"
        return FileData(name=name, data=got.data, mime_type=attachment.mime_type or got.content_type)

    def listener(self) -> Listener | None:
        """Teams delivers by webhook only."""
        return None

    async def start(self) -> None:
        """Nothing to look up: the bot's id comes with every activity (``recipient``)."""

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.api.aclose()
