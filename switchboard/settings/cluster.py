"""``redis+cluster://`` URLs: the Redis Cluster nodes to discover the cluster from, and the credentials they share.

The syntax is ``redis+cluster://[[user]:password@]host:port[,host:port...][/0]`` (``rediss+cluster`` for TLS to every
node). Any one node that answers is enough: the client asks it for the slot map and connects to every primary. A
cluster has one database, so the path is empty or ``/0``. A plain ``redis://`` URL naming one node of a cluster works
too (:func:`switchboard.queue.connection.is_cluster_node` finds out at start-up).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

__all__ = ["CLUSTER_SCHEMES", "ClusterURL", "is_cluster_url", "parse_cluster_url"]

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://", "valkey+cluster://", "valkeys+cluster://")
_EXAMPLE = "e.g. redis+cluster://:password@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379"


@dataclass(frozen=True, slots=True)
class ClusterURL:
    """A parsed ``redis+cluster://`` URL."""

    nodes: tuple[tuple[str, int], ...]
    """The seed nodes' hosts and ports (the client discovers the rest from the first that answers)."""
    username: str | None = None
    password: str | None = None
    tls: bool = False


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names Redis Cluster seed nodes (``redis+cluster://``) rather than one server."""
    return url.startswith(CLUSTER_SCHEMES)


def parse_cluster_url(url: str) -> ClusterURL:
    """Parse a ``redis+cluster://`` URL.

    Raises:
        ValueError: the URL is not one (its message says what is wrong and shows the syntax; never the password).
    """
    if not is_cluster_url(url):
        raise ValueError(f"a Redis Cluster URL starts with redis+cluster:// ({_EXAMPLE})")
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    if not hosts.strip():
        raise ValueError(f"name at least one cluster node as host:port ({_EXAMPLE})")
    nodes: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, colon, port = item.strip().rpartition(":")
        host = host.strip("[]")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"each cluster node must be host:port with a port in 1-65535 ({_EXAMPLE})")
        nodes.append((host, int(port)))
    path = [p for p in parts.path.split("/") if p]
    if path not in ([], ["0"]):
        raise ValueError(f"a Redis Cluster has only database 0: the path must be empty or /0 ({_EXAMPLE})")
    if parts.query:
        raise ValueError(f"a Redis Cluster URL takes no ?options ({_EXAMPLE})")
    return ClusterURL(
        nodes=tuple(nodes), username=username, password=password, tls=url.startswith(("rediss+", "valkeys+"))
    )
