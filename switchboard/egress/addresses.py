"""Which destination addresses egress may connect to, checked after DNS resolution, on the address connected to.

Every name is resolved once, by :class:`GuardedResolver`; every address of the answer is checked; the connection
goes to one of exactly those addresses. There is no second lookup that a rebinding DNS server could answer
differently, and a redirect is a new request that is checked again.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from typing import Final

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

__all__ = ["METADATA_ADDRESSES", "AddressGuard", "AddressRefusedError", "GuardedResolver"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_ADDRESSES: Final = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})
"""Cloud instance metadata (AWS, GCP, Azure, …): refused even inside ``internal_networks``."""

_BLOCKED: Final[tuple[tuple[IPNetwork, str], ...]] = tuple(
    (ipaddress.ip_network(net), reason)
    for net, reason in (
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "cgnat"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link_local"),
        ("172.16.0.0/12", "private"),
        ("192.168.0.0/16", "private"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("fc00::/7", "unique_local"),
        ("fe80::/10", "link_local"),
        ("fec0::/10", "site_local"),
        ("ff00::/8", "multicast"),
    )
)


class AddressRefusedError(OSError):
    """A destination resolved to an address egress may not connect to (an ``OSError``, so aiohttp passes it on)."""

    def __init__(self, host: str, reason: str) -> None:
        super().__init__(f"{host}: destination address refused ({reason})")
        self.host = host
        self.reason = reason
        """``loopback``, ``private``, ``metadata``, … (a code, never the address itself)."""


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, 6to4, NAT64, compatible), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    packed = int(address)
    if address in ipaddress.ip_network("64:ff9b::/96") or (packed >> 32 == 0 and packed > 1):
        return ipaddress.IPv4Address(packed & 0xFFFFFFFF)
    return None


class AddressGuard:
    """Decides whether one address may be connected to."""

    def __init__(self, internal_networks: Iterable[str] = ()) -> None:
        """Build the guard.

        Args:
            internal_networks: CIDRs that are reachable although private (an operator's internal service; the
                metadata addresses stay refused).
        """
        self.internal: tuple[IPNetwork, ...] = tuple(ipaddress.ip_network(n, strict=False) for n in internal_networks)

    def refusal(self, address: str | IPAddress) -> str | None:
        """Why ``address`` is refused (a reason code), or ``None`` when it may be connected to."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0] if isinstance(address, str) else address)
        except ValueError:
            return "not_an_address"
        if isinstance(ip, ipaddress.IPv6Address):
            inner = _embedded_ipv4(ip)
            if inner is not None:
                reason = self.refusal(inner)
                return None if reason is None else f"{reason}_mapped"
        if ip in METADATA_ADDRESSES:
            return "metadata"
        if any(ip in net for net in self.internal):
            return None
        for net, reason in _BLOCKED:
            if ip.version == net.version and ip in net:
                return reason
        if not ip.is_global:
            return "reserved"
        return None

    def check(self, host: str, addresses: Sequence[str]) -> None:
        """Refuse the whole answer when any address of it is refused (a name that mixes both is not trusted).

        Raises:
            AddressRefusedError: with the first refused address's reason.
        """
        if not addresses:
            raise AddressRefusedError(host, "no_address")
        for address in addresses:
            reason = self.refusal(address)
            if reason is not None:
                raise AddressRefusedError(host, reason)


class GuardedResolver(AbstractResolver):
    """An aiohttp resolver that returns only checked addresses: the connector connects to exactly these."""

    def __init__(self, guard: AddressGuard, base: AbstractResolver | None = None) -> None:
        """Wrap ``base`` (the system resolver by default; tests pass one that maps test names to loopback)."""
        self.guard = guard
        self.base = base

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """Resolve ``host`` once and check every address of the answer.

        Raises:
            AddressRefusedError: when any address is refused.
        """
        if self.base is None:
            self.base = ThreadedResolver()
        name = host.rstrip(".")
        answer = await self.base.resolve(name, port, family)
        self.guard.check(name, [entry["host"] for entry in answer])
        return answer

    async def close(self) -> None:
        """Close the wrapped resolver."""
        if self.base is not None:
            await self.base.close()
