"""What every channel's settings share: the base of a platform's block, and channels' options from the YAML file.

Each platform's own block (``SWITCHBOARD_<CHANNEL>__*``) lives in its channel's folder
(``switchboard/channels/<name>/settings.py``) and is found through the channel registry; :class:`Settings` names no
platform.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from switchboard.core.access import AccessConfig
from switchboard.core.approvals.policy import PolicyConfig
from switchboard.core.groups import GroupReplies
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
    "ChannelAccount",
    "ChannelOptions",
    "ChannelSettings",
    "secure_endpoint",
]


class ChannelSettings(BaseModel):
    """A platform channel's ``SWITCHBOARD_<CHANNEL>__*`` block."""

    model_config = ConfigDict(extra="forbid")

    @property
    def enabled(self) -> bool:
        """A channel is enabled when its credentials are present."""
        raise NotImplementedError


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
    always do). Kept for existing files: ``false`` is ``group_replies: {answer: always}``."""
    group_replies: GroupReplies | None = None
    """When the bot answers in groups, and whether it keeps what it does not answer (``switchboard.core.groups``)."""
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
    access: AccessConfig | None = None
    """Who may talk to this channel's accounts (wins over the tenant's; see ``switchboard.core.access``)."""


class ChannelAccount(BaseModel):
    """A further account of a channel: options plus the names of env variables holding its secrets."""

    model_config = ConfigDict(extra="forbid")

    agent: str | None = None
    busy_policy: BusyPolicy | None = None
    tenant: str | None = None
    require_mention: bool | None = None
    """As the channel's ``require_mention``, for this account (wins over the channel's)."""
    group_replies: GroupReplies | None = None
    """As the channel's ``group_replies``, for this account (each field set here wins over the channel's)."""
    send_rate: float | None = Field(None, ge=0)
    """As the channel's ``send_rate``, for this account (wins over the channel's)."""
    chat_send_rate: float | None = Field(None, ge=0)
    """As the channel's ``chat_send_rate``, for this account (wins over the channel's)."""
    access: AccessConfig | None = None
    """As the channel's ``access``, for this account (each field set here wins over the channel's)."""
    secrets_from_env: dict[str, str] = Field(default_factory=dict)
    """Setting name → environment variable, e.g. ``{bot_token: SUPPORT_BOT_TOKEN}``."""
    options: dict[str, str] = Field(default_factory=dict)
    """Non-secret settings (``api_base_url`` ...)."""


ChannelOptions.model_rebuild()
