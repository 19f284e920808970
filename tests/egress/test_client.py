"""The in-process seam: a tool's requests pass the same policy as a sandbox's, hop by hop."""

from __future__ import annotations

from switchboard.egress.client import EgressClient
from switchboard.egress.placeholders import placeholder
from tests.egress.conftest import SECRET_VALUE, World, decoded


async def test_tool_requests_follow_the_same_policy(world: World) -> None:
    client = EgressClient(world.forwarder, world.grant)
    ok = await client.request(
        "GET", world.url("api.example.test", "/tool", tls=True), headers={"Authorization": placeholder("GITHUB_TOKEN")}
    )
    assert (ok.status, ok.refused, decoded(ok.body)["path"]) == (200, None, "/tool")
    assert world.tls.hits[0]["headers"]["Authorization"] == SECRET_VALUE
    refused = await client.request("GET", world.url("blocked.test"))
    assert (refused.status, refused.refused) == (403, "domain_not_allowed")
    assert [e.decision for e in world.sink.events] == ["allowed", "refused"]


async def test_redirects_are_rechecked_and_drop_credentials(world: World) -> None:
    client = EgressClient(world.forwarder, world.grant)
    target = world.url("other.example.test", "/landing")
    response = await client.request(
        "POST",
        world.url("api.example.test", f"/redirect?to={target}", tls=True),
        headers={"Authorization": placeholder("GITHUB_TOKEN")},
        body=b"{}",
    )
    assert (response.status, response.url) == (200, target)
    (first,), (second,) = world.tls.hits, world.public.hits
    assert first["headers"]["Authorization"] == SECRET_VALUE
    assert "Authorization" not in second["headers"]
    assert second["method"] == "GET"
    assert [e.host for e in world.sink.events] == ["api.example.test", "other.example.test"]


async def test_only_http_and_https_go_out(world: World) -> None:
    client = EgressClient(world.forwarder, world.grant)
    for url in (f"ftp://api.example.test:{world.public.port}/f", f"ws://api.example.test:{world.public.port}/w"):
        response = await client.request("GET", url)
        assert (response.status, response.refused) == (400, "bad_request")
    assert world.public.hits == []
