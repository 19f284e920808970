"""Where a Teams file may be downloaded from, and which hop gets the bot's token.

A user's file reaches the bot as a URL in the activity: a file's ``downloadUrl`` (content type
``application/vnd.microsoft.teams.file.download.info``, a pre-authorised SharePoint / OneDrive for Business link) or
an inline image's ``contentUrl`` (``{serviceUrl}/v3/attachments/{id}/views/original`` on the Bot Connector, which
wants the bot's token). :func:`file_allowed` lets a download reach — on the first hop and on every redirect — only:

- the conversation's verified ``serviceUrl`` origin (scheme, host and port; ``http`` only when
  :func:`~switchboard.channelsettings.secure_endpoint` allows it: the local fakes);
- ``https`` on port 443, without userinfo, on :data:`FILE_DOMAINS` (a domain or any subdomain: SharePoint and
  OneDrive for Business in the commercial, GCC High and 21Vianet clouds, OneDrive, the Bot Framework) or on
  :data:`CONNECTOR_HOSTS` (the Bot Connector's hosts, exactly: its regions are paths of one host, and a wildcard on
  ``trafficmanager.net`` would admit anyone's Azure Traffic Manager name).

Everything else — IP literals, internal names, loopback, link-local, other ports, ``http`` — is refused before any
connection. The bot's token goes only to the verified ``serviceUrl`` origin (:func:`sends_token`), never to a file
host, and never across a redirect to another origin.
"""

from __future__ import annotations

from typing import Final

from yarl import URL

from switchboard.channels._download import host_of, on_domains
from switchboard.channelsettings import secure_endpoint

__all__ = ["CONNECTOR_HOSTS", "FILE_DOMAINS", "file_allowed", "sends_token"]

FILE_DOMAINS: Final = (
    "sharepoint.com",
    "sharepoint.us",
    "sharepoint.cn",
    "onedrive.com",
    "botframework.com",
)
"""Domains Teams serves users' files from (``contoso.sharepoint.com``, ``contoso-my.sharepoint.com``, …)."""
CONNECTOR_HOSTS: Final = frozenset(
    {
        "smba.trafficmanager.net",
        "smba.infra.gcc.teams.microsoft.com",
        "smba.infra.gov.teams.microsoft.us",
        "smba.infra.dod.teams.microsoft.us",
    }
)
"""The Bot Connector's hosts (``serviceUrl``: ``https://smba.trafficmanager.net/amer/`` and the other regions)."""


def _service_origin(service_url: str) -> URL | None:
    """The verified ``serviceUrl``'s origin, or ``None`` when it is not a secure absolute URL without userinfo."""
    if not secure_endpoint(service_url):
        return None
    try:
        service = URL(service_url)
        if service.user is not None or service.password is not None:
            return None
        return service.origin()
    except ValueError:
        return None


def _on_service(url: URL, service_url: str) -> bool:
    origin = _service_origin(service_url)
    if origin is None or url.user is not None or url.password is not None or not url.absolute:
        return False
    try:
        return url.origin() == origin
    except ValueError:
        return False


def file_allowed(url: URL, service_url: str) -> bool:
    """Whether a download may reach ``url`` (one hop) for a conversation at ``service_url`` (see the module)."""
    if _on_service(url, service_url):
        return True
    if on_domains(url, FILE_DOMAINS):
        return True
    return host_of(url) in CONNECTOR_HOSTS and on_domains(url, (host_of(url),))  # exactly, https on 443


def sends_token(url: URL, service_url: str) -> bool:
    """Whether the hop ``url`` gets the bot's token: only the conversation's verified ``serviceUrl`` origin."""
    return _on_service(url, service_url)
