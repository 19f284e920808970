"""Channel settings: each platform's secrets from the environment, and channels' options from the YAML file.

Re-exported by :mod:`switchboard.settings`, which composes them into :class:`~switchboard.settings.Settings`.
"""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from switchboard.core.approvals.policy import PolicyConfig
from switchboard.types import BusyPolicy

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def secure_endpoint(url: str) -> bool:
    """Whether a platform base URL is ``https://``, or ``http://`` to this host (the local fakes, a test proxy)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return False
    if not host:
        return False
    return parts.scheme == "https" or (parts.scheme == "http" and host in _LOOPBACK_HOSTS)


__all__ = [
    "TEAMS_CONNECTOR_HOSTS",
    "ChannelAccount",
    "ChannelOptions",
    "ChannelSettings",
    "DiscordSettings",
    "InstagramSettings",
    "MessengerSettings",
    "SlackSettings",
    "TeamsSettings",
    "TelegramSettings",
    "WhatsAppSettings",
    "secure_endpoint",
]


class ChannelSettings(BaseModel):
    """A platform channel's ``SWITCHBOARD_<CHANNEL>__*`` block."""

    model_config = ConfigDict(extra="forbid")

    @property
    def enabled(self) -> bool:
        """A channel is enabled when its credentials are present."""
        raise NotImplementedError


class TelegramSettings(ChannelSettings):
    """``SWITCHBOARD_TELEGRAM__*``."""

    bot_token: SecretStr | None = None
    secret_token: SecretStr | None = None
    """Value Telegram echoes in ``X-Telegram-Bot-Api-Secret-Token``; 1–256 of ``A-Z a-z 0-9 _ -``."""
    api_base_url: str = "https://api.telegram.org"
    """Bot API root: the part before ``/bot<token>/<method>``."""
    bot_username: str | None = None
    """The bot's @username, used to notice mentions in groups (looked up with ``getMe`` when unset)."""
    transport: Literal["webhook", "polling"] = "webhook"
    """``webhook`` (Telegram posts to ``/webhooks/telegram``) or ``polling`` (``getUpdates``, for hosts without a
    public HTTPS URL; one poller per bot across every process)."""

    @field_validator("secret_token")
    @classmethod
    def _secret_charset(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            raw = v.get_secret_value()
            if not (1 <= len(raw) <= 256) or not all(c.isascii() and (c.isalnum() or c in "_-") for c in raw):
                raise ValueError("must be 1-256 characters of A-Z a-z 0-9 _ - (Telegram's rule for secret_token)")
        return v

    @property
    def enabled(self) -> bool:  # noqa: D102
        return self.bot_token is not None


class SlackSettings(ChannelSettings):
    """``SWITCHBOARD_SLACK__*``."""

    bot_token: SecretStr | None = None
    signing_secret: SecretStr | None = None
    """Verifies the Events API's HTTP requests (``X-Slack-Signature``)."""
    app_token: SecretStr | None = None
    """App-level token (``xapp-…``): Socket Mode instead of the HTTP endpoint (one connection holder across
    processes)."""
    api_base_url: str = "https://slack.com/api/"

    @property
    def enabled(self) -> bool:
        """A bot token, and a way to receive: the signing secret (HTTP) or an app token (Socket Mode)."""
        return self.bot_token is not None and (self.signing_secret is not None or self.app_token is not None)


class DiscordSettings(ChannelSettings):
    """``SWITCHBOARD_DISCORD__*``."""

    bot_token: SecretStr | None = None
    public_key: str | None = None
    """The application's Ed25519 public key (hex), which verifies requests to the interactions endpoint."""
    application_id: str | None = None
    """Looked up with ``GET /applications/@me`` when unset."""
    api_base_url: str = "https://discord.com/api/v10"
    gateway: bool = True
    """Hold a gateway connection for ordinary messages (``false``: slash commands and buttons only)."""

    @property
    def enabled(self) -> bool:  # noqa: D102
        return self.bot_token is not None or self.public_key is not None


TEAMS_CONNECTOR_HOSTS = (
    "smba.trafficmanager.net",
    "smba.infra.gcc.teams.microsoft.com",
    "smba.infra.gov.teams.microsoft.us",
    "smba.infra.dod.teams.microsoft.us",
)
"""The Bot Connector's hosts in the commercial, GCC, GCC High and DoD clouds (``serviceUrl``:
``https://smba.trafficmanager.net/amer/`` and the other regions, which are paths of one host)."""


def _connector_host(entry: str) -> str:
    """A host name (``https`` on 443), or an origin ``scheme://host[:port]`` that :func:`secure_endpoint` accepts."""
    entry = entry.strip()
    if "://" not in entry:
        host = entry.lower().rstrip(".")
        if not host or any(c in host for c in "/:@?#[] "):
            raise ValueError(f"{entry[:80]!r} is no host name (give a name, or an origin such as https://host:8443)")
        return host
    parts = urlsplit(entry)
    if not secure_endpoint(entry) or parts.username or parts.password or parts.path.strip("/") or parts.query:
        raise ValueError(
            f"{entry[:80]!r} is no https:// origin (an origin names scheme, host and port only; http only to this host)"
        )
    return f"{parts.scheme}://{parts.netloc.lower()}"


class TeamsSettings(ChannelSettings):
    """``SWITCHBOARD_TEAMS__*``."""

    app_id: str | None = None
    app_password: SecretStr | None = None
    tenant_id: str | None = None
    openid_metadata_url: str = "https://login.botframework.com/v1/.well-known/openidconfiguration"
    login_base_url: str = "https://login.microsoftonline.com"
    connector_hosts: Annotated[tuple[str, ...], NoDecode] = TEAMS_CONNECTOR_HOSTS
    """Comma-separated Bot Connector hosts a conversation's ``serviceUrl`` may be on: replies (with the bot's token)
    and inline images go there only. A host name means ``https`` on port 443; an origin (``https://host:8443``, or
    ``http://127.0.0.1:3978`` for a local fake) means exactly that origin."""

    @field_validator("connector_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, v: object) -> object:
        return tuple(part for part in v.split(",") if part.strip()) if isinstance(v, str) else v

    @field_validator("connector_hosts")
    @classmethod
    def _hosts(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("name at least one Bot Connector host (default: the public and government clouds')")
        return tuple(_connector_host(entry) for entry in v)

    @property
    def enabled(self) -> bool:  # noqa: D102
        return self.app_id is not None


class _MetaChannel(ChannelSettings):
    access_token: SecretStr | None = None
    app_secret: SecretStr | None = None
    verify_token: SecretStr | None = None
    graph_base_url: str = "https://graph.facebook.com/v23.0"

    @property
    def enabled(self) -> bool:
        return self.access_token is not None


class WhatsAppSettings(_MetaChannel):
    """``SWITCHBOARD_WHATSAPP__*``."""

    phone_number_id: str | None = None
    window_template: str | None = None
    """Approved template sent instead of a reply outside the 24-hour window, as ``name:language``
    (``hello_world:en_US``); unset: such a reply is not sent and a ``window_closed`` failure is recorded."""


class InstagramSettings(_MetaChannel):
    """``SWITCHBOARD_INSTAGRAM__*``."""

    account_id: str | None = None
    """The Instagram professional account id (``entry[].id`` of its webhooks); looked up with ``GET /me`` when
    unset (needed in the YAML for every further account: one app URL serves them all)."""
    human_agent: bool = False
    """Outside the 24-hour window, send replies tagged ``HUMAN_AGENT`` (7 days; only where a person answers)."""


class MessengerSettings(ChannelSettings):
    """``SWITCHBOARD_MESSENGER__*``."""

    page_access_token: SecretStr | None = None
    app_secret: SecretStr | None = None
    verify_token: SecretStr | None = None
    graph_base_url: str = "https://graph.facebook.com/v23.0"
    page_id: str | None = None
    """The Facebook Page id (``entry[].id`` of its webhooks); looked up with ``GET /me`` when unset (needed in the
    YAML for every further account: one app URL serves them all)."""
    human_agent: bool = False
    """Outside the 24-hour window, send replies tagged ``HUMAN_AGENT`` (7 days; only where a person answers)."""

    @property
    def enabled(self) -> bool:  # noqa: D102
        return self.page_access_token is not None


class ChannelOptions(BaseModel):
    """Non-secret options of a channel or one of its accounts, from the YAML file."""

    model_config = ConfigDict(extra="forbid")

    agent: str | None = None
    agents: list[str] = Field(default_factory=list)
    """Web chat only: the agents a new session may name (``{"agent": …}``); empty means only ``agent``."""
    busy_policy: BusyPolicy | None = None
    tenant: str | None = None
    require_mention: bool | None = None
    """Group and channel messages reach the agent only when they mention the bot (default: yes; direct messages
    always do)."""
    send_rate: float | None = Field(None, ge=0)
    """Sends a second the gateway allows the whole account, shared by every worker (default: the platform's
    documented limit, e.g. Telegram's 30; ``0``: not paced by the gateway — a fake, or a self-hosted API without
    limits; the platform's own 429s are honoured either way)."""
    chat_send_rate: float | None = Field(None, ge=0)
    """Sends a second into one conversation (default: the platform's limit; ``0``: not paced)."""
    accounts: dict[str, ChannelAccount] = Field(default_factory=dict)
    """Further accounts, served at ``/webhooks/{channel}/{account}``."""
    policy: PolicyConfig | None = None
    """Rules, mode, approvals and grants for this channel's turns (see ``switchboard.core.approvals.policy``)."""
    admins: list[str] = Field(default_factory=list)
    """Principals (``telegram:42``) who decide approvals when a policy names ``admins`` among its approvers."""


class ChannelAccount(BaseModel):
    """A further account of a channel: options plus the names of env variables holding its secrets."""

    model_config = ConfigDict(extra="forbid")

    agent: str | None = None
    busy_policy: BusyPolicy | None = None
    tenant: str | None = None
    require_mention: bool | None = None
    """As the channel's ``require_mention``, for this account (wins over the channel's)."""
    send_rate: float | None = Field(None, ge=0)
    """As the channel's ``send_rate``, for this account (wins over the channel's)."""
    chat_send_rate: float | None = Field(None, ge=0)
    """As the channel's ``chat_send_rate``, for this account (wins over the channel's)."""
    secrets_from_env: dict[str, str] = Field(default_factory=dict)
    """Setting name → environment variable, e.g. ``{bot_token: SUPPORT_BOT_TOKEN}``."""
    options: dict[str, str] = Field(default_factory=dict)
    """Non-secret settings (``api_base_url`` ...)."""


ChannelOptions.model_rebuild()
