"""The integration API's settings: tokens and outbound webhooks from the YAML file (``api:``), delivery from the env.

A token is stored only as its SHA-256 (made by ``switchboard api-tokens create``, which prints the token once): API
tokens are long random strings, so a fast hash is enough, as for the console's sign-in tokens. A webhook's signing
secret is never in the file: ``secret_env`` names the environment variable holding it.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "SCOPES",
    "WEBHOOK_EVENTS",
    "ApiConfig",
    "ApiToken",
    "Scope",
    "WebhookEndpoint",
    "WebhookEvent",
    "WebhookSettings",
]

Scope = Literal["messages:send", "turns:start", "conversations:read", "conversations:history"]
SCOPES: Final[tuple[Scope, ...]] = ("messages:send", "turns:start", "conversations:read", "conversations:history")
"""``conversations:history`` lets ``conversations:read`` also return the recent messages (their text)."""
WebhookEvent = Literal["message_received", "reply_sent", "approval_requested", "run_failed", "run_dead_lettered"]
WEBHOOK_EVENTS: Final[tuple[WebhookEvent, ...]] = (
    "message_received",
    "reply_sent",
    "approval_requested",
    "run_failed",
    "run_dead_lettered",
)
"""The event-log kinds a webhook may subscribe to (each delivered with its session and the event's fields)."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")


class ApiToken(BaseModel):
    """One integration token: ``{name, tenant, scopes, sha256}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Who uses it (``crm``): the principal its actions are signed as (``api:<name>``)."""
    tenant: str = Field(min_length=1)
    """The one tenant whose conversations it reaches."""
    scopes: tuple[Scope, ...] = Field(min_length=1)
    sha256: str
    """The SHA-256 (hex) of the token, from ``switchboard api-tokens create``; the token itself is never stored."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-64 letters, digits or . _ - (starting with a letter or digit)")
        return v

    @field_validator("sha256")
    @classmethod
    def _hash(cls, v: str) -> str:
        if not _SHA256.match(v):
            raise ValueError("must be 64 lower-case hex digits: make it with `switchboard api-tokens create`")
        return v


class WebhookEndpoint(BaseModel):
    """One URL a tenant's events are posted to, signed with the secret in ``secret_env``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: str = Field(min_length=1)
    url: str
    """``https://`` (or ``http://``) URL; its host must resolve to public addresses unless ``allow_networks``
    names them."""
    events: tuple[WebhookEvent, ...] = Field(min_length=1)
    secret_env: str
    """The environment variable holding the signing secret (``SWITCHBOARD_WEBHOOK_SECRET_CRM``)."""
    allow_networks: tuple[str, ...] = ()
    """CIDRs the URL may reach although private (an internal service); cloud metadata stays refused."""

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://[^/\s?#]+(/\S*)?$", v):
            raise ValueError("must be an http:// or https:// URL")
        return v

    @field_validator("secret_env")
    @classmethod
    def _env(cls, v: str) -> str:
        if not _ENV.match(v):
            raise ValueError("must be an environment variable name (upper case, digits, _)")
        return v

    @field_validator("allow_networks")
    @classmethod
    def _networks(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for network in v:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ValueError(f"{network!r} is not a CIDR (e.g. 10.0.0.0/8)") from None
        return v


class ApiConfig(BaseModel):
    """The YAML file's ``api:`` block."""

    model_config = ConfigDict(extra="forbid")

    tokens: tuple[ApiToken, ...] = ()
    webhooks: tuple[WebhookEndpoint, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> ApiConfig:
        names = [token.name for token in self.tokens]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"api token names must be unique; repeated: {', '.join(repeated)}")
        return self

    def webhook_tenants(self) -> list[str]:
        """The tenants with at least one webhook, sorted."""
        return sorted({endpoint.tenant for endpoint in self.webhooks})


class WebhookSettings(BaseModel):
    """``SWITCHBOARD_WEBHOOKS__*``: how outbound webhooks are delivered."""

    model_config = ConfigDict(extra="forbid")

    poll_s: float = Field(1.0, gt=0)
    """How often the delivery loop looks for new events and due retries."""
    timeout_s: float = Field(10.0, gt=0)
    """Each delivery attempt's time limit (a timeout is retried)."""
    max_attempts: int = Field(8, ge=1)
    """Attempts per event and URL before it is dead-lettered (``switchboard`` lists them in Redis)."""
    backoff_s: float = Field(2.0, ge=0)
    """The first retry's wait; doubled after each failure, with jitter, at most ``max_backoff_s``."""
    max_backoff_s: float = Field(600.0, ge=0)
    """The longest wait between two attempts."""
    lookback_s: float = Field(3600.0, gt=0)
    """Sessions that had a message within this long are read for new events (a run's events follow its message;
    a deferred run's may come up to ``SWITCHBOARD_QUEUE__MAX_DEFER_S`` later)."""
