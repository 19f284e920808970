"""Teams' settings block, ``SWITCHBOARD_TEAMS__*`` (and every YAML account of the channel)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from pydantic import SecretStr, field_validator
from pydantic_settings import NoDecode

from switchboard.settings.channels import ChannelSettings, secure_endpoint

__all__ = ["TEAMS_CONNECTOR_HOSTS", "TeamsSettings"]


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
