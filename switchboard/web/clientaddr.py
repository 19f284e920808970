"""The client address of a request: the connection's peer, or ``X-Forwarded-For`` from trusted proxies only.

Behind a reverse proxy every request arrives from the proxy's address, so per-address limits would lump all
clients together. ``X-Forwarded-For`` is believed only when the connection itself comes from a trusted proxy
(``SWITCHBOARD_TRUSTED_PROXIES``), and then only as far as the chain of trusted hops reaches: the header is
read right to left, each hop that is itself a trusted proxy is skipped, and the first untrusted hop is the
client. Anything further left was written by the client and proves nothing.
"""

from __future__ import annotations

import ipaddress

from aiohttp import web

from switchboard.settings.proxies import TrustedProxies

__all__ = ["client_address", "from_trusted_proxy"]

UNKNOWN = "unknown"
"""The address given when the transport has no peer address (a UNIX socket) and no trusted header says more."""


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[2001:db8::1]:443"
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # "192.0.2.1:5000"
        text = text.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _trusted(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, trusted: TrustedProxies) -> bool:
    return any(ip.version == net.version and ip in net for net in trusted)


def from_trusted_proxy(request: web.BaseRequest, trusted: TrustedProxies) -> bool:
    """Whether the connection itself comes from a trusted proxy (whose headers may then be believed)."""
    peer = _ip(request.remote) if request.remote else None
    return peer is not None and _trusted(peer, trusted)


def client_address(request: web.BaseRequest, trusted: TrustedProxies) -> str:
    """The address a request comes from, for per-address limits.

    The connection's peer, unless that peer is a trusted proxy: then ``X-Forwarded-For`` is walked from the
    right, skipping trusted hops, and the first untrusted hop is the client (every hop trusted: the leftmost).
    A malformed hop stops the walk at the last good address, so a garbled header can never pick an address the
    client wrote.
    """
    peer_text = request.remote
    peer = _ip(peer_text) if peer_text else None
    if peer is None:
        return peer_text or UNKNOWN
    if not trusted or not _trusted(peer, trusted):
        return str(peer)
    client = peer
    for header in reversed(request.headers.getall("X-Forwarded-For", [])):
        for hop_text in reversed(header.split(",")):
            hop = _ip(hop_text)
            if hop is None:
                return str(client)
            client = hop
            if not _trusted(hop, trusted):
                return str(client)
    return str(client)
