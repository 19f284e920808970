"""``redis+sentinel://`` URLs: the Sentinels to ask, the service they watch, and the database to use.

The syntax is ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]`` (``rediss+sentinel``
for TLS to the data nodes); ``?sentinel_password=...`` when the Sentinels require a password of their own. The
password before ``@`` is the data nodes' (the primary's and its replicas'), as in a ``redis://`` URL.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["SENTINEL_SCHEMES", "SentinelURL", "is_sentinel_url", "parse_sentinel_url"]

SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://", "valkey+sentinel://", "valkeys+sentinel://")
_EXAMPLE = "e.g. redis+sentinel://:password@10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/mymaster/0"


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """A parsed ``redis+sentinel://`` URL."""

    sentinels: tuple[tuple[str, int], ...]
    """Every Sentinel's host and port (any one that answers is enough)."""
    service: str
    """The name the Sentinels monitor the primary under (``sentinel monitor <name> ...``)."""
    db: int = 0
    username: str | None = None
    password: str | None = None
    """The data nodes' password (never the Sentinels')."""
    sentinel_password: str | None = None
    tls: bool = False


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` names Sentinels rather than one server."""
    return url.startswith(SENTINEL_SCHEMES)


def parse_sentinel_url(url: str) -> SentinelURL:
    """Parse a ``redis+sentinel://`` URL.

    Raises:
        ValueError: the URL is not one (its message says what is wrong and shows the syntax; never the password).
    """
    if not is_sentinel_url(url):
        raise ValueError(f"a Sentinel URL starts with redis+sentinel:// ({_EXAMPLE})")
    parts = urlsplit(url)
    netloc = parts.netloc
    userinfo, _, hosts = netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, colon, port = item.strip().rpartition(":")
        host = host.strip("[]")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"each Sentinel must be host:port with a port in 1-65535 ({_EXAMPLE})")
        sentinels.append((host, int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ValueError(f"the path must be /service_name or /service_name/db ({_EXAMPLE})")
    db = 0
    if len(path) == 2:
        if not path[1].isdigit():
            raise ValueError(f"the database must be a number ({_EXAMPLE})")
        db = int(path[1])
    query = parse_qs(parts.query)
    unknown = set(query) - {"sentinel_password"}
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(sorted(unknown))}: only sentinel_password is understood ({_EXAMPLE})"
        )
    sentinel_password = query["sentinel_password"][-1] if "sentinel_password" in query else None
    return SentinelURL(
        sentinels=tuple(sentinels),
        service=unquote(path[0]),
        db=db,
        username=username,
        password=password,
        sentinel_password=sentinel_password,
        tls=url.startswith(("rediss+", "valkeys+")),
    )
