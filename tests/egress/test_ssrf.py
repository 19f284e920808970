"""SSRF: private destinations are refused after resolution, through redirects and against a rebinding DNS server."""

from __future__ import annotations

import pytest

from switchboard.egress.addresses import AddressGuard
from switchboard.egress.client import EgressClient
from switchboard.egress.policy import AgentRules
from tests.egress.conftest import PUBLIC, World
from tests.egress.test_proxy import _get


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "cgnat"),
        ("169.254.169.254", "metadata"),
        ("169.254.1.1", "link_local"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("255.255.255.255", "reserved"),
        ("192.0.2.1", "reserved"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fd00::1", "unique_local"),
        ("fe80::1", "link_local"),
        ("ff02::1", "multicast"),
        ("fd00:ec2::254", "metadata"),
        ("::ffff:127.0.0.1", "loopback_mapped"),
        ("::ffff:169.254.169.254", "metadata_mapped"),
        ("64:ff9b::a00:1", "private_mapped"),
        ("2002:7f00:1::", "loopback_mapped"),
        ("::127.0.0.1", "loopback_mapped"),
    ],
)
def test_blocked_ranges(address: str, reason: str) -> None:
    assert AddressGuard().refusal(address) == reason


@pytest.mark.parametrize("address", ["93.184.215.14", "1.1.1.1", "2606:4700:4700::1111", "::ffff:1.1.1.1"])
def test_public_addresses_pass(address: str) -> None:
    assert AddressGuard().refusal(address) is None


def test_internal_networks_open_private_ranges_but_never_metadata() -> None:
    guard = AddressGuard(["10.0.0.0/8", "169.254.0.0/16"])
    assert guard.refusal("10.9.9.9") is None
    assert guard.refusal("169.254.169.254") == "metadata"
    assert guard.refusal("127.0.0.1") == "loopback"


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("loop.example.test", "loopback"),
        ("ten.example.test", "private"),
        ("meta.example.test", "metadata"),
        ("six.example.test", "loopback"),
        ("mapped.example.test", "loopback_mapped"),
        ("mixed.example.test", "loopback"),
    ],
)
async def test_names_resolving_to_blocked_addresses_are_refused(world: World, host: str, reason: str) -> None:
    status, body = await _get(world, world.url(host, "/internal"))
    assert status == 403
    assert f"egress refused: {reason}".encode() in body
    assert world.private.hits == []
    assert world.public.hits == []
    assert [(e.decision, e.reason) for e in world.sink.events] == [("refused", reason)]


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]", "169.254.169.254"])
async def test_address_literals_are_refused(world: World, host: str) -> None:
    world.forwarder.policy.agents["assistant"] = AgentRules(allow=(host.strip("[]"),), secrets={})
    status, _ = await _get(world, f"http://{host}:{world.public.port}/")
    assert status == 403
    assert world.private.hits == []


async def test_https_to_a_private_name_is_refused_inside_the_tunnel(world: World) -> None:
    status, body = await _get(world, f"https://loop.example.test:{world.tls.port}/")
    assert (status, body) == (403, b"egress refused: loopback\n")
    assert world.private.hits == []
    assert [(e.scheme, e.reason) for e in world.sink.events] == [("https", "loopback")]


async def test_redirect_to_a_private_address_is_refused_at_the_next_hop(world: World) -> None:
    target = f"http://loop.example.test:{world.private.port}/admin"
    # the proxy hands the 3xx back: the client's next request is checked like any other
    status, _ = await _get(world, world.url("api.example.test", f"/redirect?to={target}"), allow_redirects=True)
    assert status == 403
    assert world.private.hits == []
    assert [e.reason for e in world.sink.events] == [None, "loopback"]
    # the in-process client follows redirects itself, hop by hop, with the same check
    client = EgressClient(world.forwarder, world.grant)
    response = await client.request("GET", world.url("api.example.test", f"/redirect?to={target}"))
    assert (response.status, response.refused) == (403, "loopback")
    assert world.private.hits == []


async def test_dns_rebinding_cannot_reach_the_private_address(make_world) -> None:  # type: ignore[no-untyped-def]
    world: World = await make_world({"rebind.example.test": [[PUBLIC], ["127.0.0.1"]]})
    statuses = []
    for _ in range(6):
        status, _ = await _get(world, world.url("rebind.example.test", "/data"))
        statuses.append(status)
    assert statuses == [200, 403] * 3  # the upstream closes each connection: every request resolves again
    assert world.private.hits == []
    assert len(world.public.hits) == 3
    # exactly one lookup per connection: nothing resolves the name a second time between check and connect
    assert world.resolver.lookups == ["rebind.example.test"] * 6
