"""``SWITCHBOARD_TRUSTED_PROXIES``: the reverse proxies whose ``X-Forwarded-For`` is believed.

How a request's client address is read from it: :mod:`switchboard.web.clientaddr`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import TypeAlias

__all__ = ["TrustedProxies", "parse_trusted_proxies"]

TrustedProxies: TypeAlias = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
"""Networks whose ``X-Forwarded-For`` is believed."""


def parse_trusted_proxies(value: str | Iterable[str]) -> TrustedProxies:
    """Parse comma-separated addresses or CIDRs (``10.0.0.0/8, ::1``) into networks.

    Raises:
        ValueError: naming the entry that is neither an address nor a network.
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for item in items:
        text = item.strip()
        if not text:
            continue
        try:
            networks.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise ValueError(f"{text!r} is not an IP address or CIDR network (e.g. 10.0.0.0/8, ::1)") from None
    return tuple(networks)
