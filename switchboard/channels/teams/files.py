"""Where a Teams conversation's Connector may be, where a Teams file may be downloaded from, and who gets the token.

Replies and inline images go only to a verified ``serviceUrl`` on the Bot Connector (:func:`on_connector`); files
only from the Connector or Microsoft's file domains, checked on every hop (:func:`file_allowed`). The bot's token goes
only to the conversation's own Connector origin (:func:`sends_token`), never to a file host or across a redirect.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from yarl import URL

from switchboard.channels.download import host_of, on_domains
from switchboard.channels.teams.settings import TEAMS_CONNECTOR_HOSTS

__all__ = ["CONNECTOR_HOSTS", "FILE_DOMAINS", "file_allowed", "on_connector", "sends_token", "service_allowed"]

FILE_DOMAINS: Final = (
    "sharepoint.com",
    "sharepoint.us",
    "sharepoint.cn",
    "onedrive.com",
    "botframework.com",
)
"""Domains Teams serves users' files from (``contoso.sharepoint.com``, ``contoso-my.sharepoint.com``, …)."""
CONNECTOR_HOSTS: Final = frozenset(TEAMS_CONNECTOR_HOSTS)
"""The Bot Connector's hosts by default (``serviceUrl``: ``https://smba.trafficmanager.net/amer/`` and the other
regions)."""


def on_connector(url: URL, hosts: Collection[str]) -> bool:
    """Whether ``url`` is on a Bot Connector host of ``hosts`` (the settings' ``connector_hosts``, see the module).

    **The Connector.** A conversation's replies and its inline images go to its verified ``serviceUrl``, with the bot's
    own bearer token. :func:`on_connector` admits only a Bot Connector host of ``SWITCHBOARD_TEAMS__CONNECTOR_HOSTS``
    (:data:`~switchboard.settings.channels.TEAMS_CONNECTOR_HOSTS` by default): a host name there means ``https`` on port
    443 without userinfo, that host exactly (its regions are paths of one host, and a wildcard on ``trafficmanager.net``
    would admit anyone's Azure Traffic Manager name); an origin there (``http://127.0.0.1:3978``, a local fake) means
    that origin exactly. A ``serviceUrl`` anywhere else — plain ``http``, loopback, link-local, the cloud metadata
    address — never gets a request, let alone the token (:func:`service_allowed`; the reply is refused for good).

    Files are :func:`file_allowed`'s; the token, :func:`sends_token`'s.
    """
    if url.user is not None or url.password is not None or not url.absolute:
        return False
    host = host_of(url)
    for entry in hosts:
        if "://" not in entry:
            if host == entry and on_domains(url, (entry,)):
                return True
            continue
        try:
            if url.origin() == URL(entry).origin():
                return True
        except ValueError:
            continue
    return False


def _parsed(service_url: str) -> URL | None:
    try:
        url = URL(service_url)
    except (ValueError, TypeError):
        return None
    return url if url.absolute else None


def service_allowed(service_url: str, hosts: Collection[str]) -> bool:
    """Whether a conversation's ``serviceUrl`` is on the Bot Connector (replies and the bot's token may go there)."""
    url = _parsed(service_url)
    return url is not None and on_connector(url, hosts)


def file_allowed(url: URL, service_url: str, hosts: Collection[str]) -> bool:
    """Whether a download may reach ``url`` (one hop) for a conversation at ``service_url``.

    **Files.** A user's file reaches the bot as a URL in the activity: a file's ``downloadUrl`` (content type
    ``application/vnd.microsoft.teams.file.download.info``, a pre-authorised SharePoint / OneDrive for Business link) or
    an inline image's ``contentUrl`` (``{serviceUrl}/v3/attachments/{id}/views/original`` on the Bot Connector, which
    wants the bot's token). :func:`file_allowed` lets a download reach — on the first hop and on every redirect — only
    the Connector (:func:`on_connector`) and ``https`` on port 443, without userinfo, on :data:`FILE_DOMAINS` (a
    domain or any subdomain: SharePoint and OneDrive for Business in the commercial, GCC High and 21Vianet clouds,
    OneDrive, the Bot Framework). Everything else is refused before any connection. The bot's token goes only to the
    conversation's own ``serviceUrl`` origin, once that is on the Connector (:func:`sends_token`), never to a file
    host, and never across a redirect to another origin.
    """
    return on_domains(url, FILE_DOMAINS) or on_connector(url, hosts)


def sends_token(url: URL, service_url: str, hosts: Collection[str]) -> bool:
    """Whether the hop ``url`` gets the bot's token: only the conversation's ``serviceUrl`` origin, on the Connector."""
    service = _parsed(service_url)
    if service is None or not on_connector(service, hosts) or not on_connector(url, hosts):
        return False
    try:
        return url.origin() == service.origin()
    except ValueError:
        return False
