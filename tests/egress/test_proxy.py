"""The proxy as a sandbox sees it: allowlists, grants, methods, sizes, HTTPS through the deployment CA, unix socket."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess

import aiohttp
import pytest

from tests.egress.conftest import World, decoded


async def _get(
    world: World, url: str, *, method: str = "GET", token: str | None = None, **kw: object
) -> tuple[int, bytes]:
    proxy = f"http://{world.grant.token if token is None else token}:@{world.proxy.host}:{world.proxy.port}"
    async with aiohttp.ClientSession() as http:
        ssl_ctx = world.client_tls() if url.startswith("https") else None
        async with http.request(method, url, proxy=proxy, ssl=ssl_ctx, **kw) as resp:  # type: ignore[arg-type]
            return resp.status, await resp.read()


async def test_allowlisted_host_passes_and_is_recorded(world: World) -> None:
    status, body = await _get(world, world.url("api.example.test", "/v1/items?token=abc"))
    assert status == 200
    assert decoded(body)["path"] == "/v1/items?token=abc"
    assert len(world.public.hits) == 1
    (event,) = world.sink.events
    assert (event.decision, event.agent, event.host, event.method, event.status) == (
        "allowed",
        "assistant",
        "api.example.test",
        "GET",
        200,
    )
    assert event.session == world.grant.session
    assert event.path == "/v1/items"  # never the query string
    assert event.bytes_in == len(body)


async def test_host_outside_the_allowlist_is_refused(world: World) -> None:
    status, body = await _get(world, world.url("blocked.test"))
    assert status == 403
    assert b"domain_not_allowed" in body
    assert world.public.hits == []
    assert [(e.decision, e.reason) for e in world.sink.events] == [("refused", "domain_not_allowed")]


async def test_wildcard_does_not_cover_the_bare_domain_or_lookalikes(world: World) -> None:
    for host in ("example.test", "evilexample.test", "api.example.test.evil.test"):
        status, _ = await _get(world, f"http://{host}:{world.public.port}/")
        assert status == 403, host
    assert world.public.hits == []


async def test_an_agent_without_egress_rules_reaches_nothing(world: World) -> None:
    grant = world.forwarder.policy.grant("other", "s2")
    status, _ = await _get(world, world.url("api.example.test"), token=grant.token)
    assert status == 403
    assert world.public.hits == []


async def test_requests_without_a_live_grant_get_407(world: World) -> None:
    status, _ = await _get(world, world.url("api.example.test"), token="not-a-grant")
    assert status == 407
    world.forwarder.policy.revoke(world.grant)
    status, _ = await _get(world, world.url("api.example.test"))
    assert status == 407
    assert world.public.hits == []
    assert {e.reason for e in world.sink.events} == {"no_grant"}


async def test_port_outside_the_allowed_ports_is_refused(world: World) -> None:
    status, body = await _get(world, "http://api.example.test:25/")
    assert (status, b"port_not_allowed" in body) == (403, True)


async def test_method_outside_the_list_is_refused(world: World) -> None:
    status, _ = await _get(world, world.url("api.example.test"), method="TRACE")
    assert status == 405
    assert world.public.hits == []


async def test_oversized_request_body_is_refused_unsent(world: World) -> None:
    status, _ = await _get(world, world.url("api.example.test", "/upload"), method="POST", data=b"x" * 5000)
    assert status == 413
    status, _ = await _get(world, world.url("api.example.test", "/upload"), method="POST", data=b"x" * 4000)
    assert status == 200
    assert [len(hit["body"]) for hit in world.public.hits] == [4000]
    assert [e.reason for e in world.sink.events] == ["request_too_large", None]


async def test_chunked_oversized_body_is_refused(world: World) -> None:
    async def chunks():  # type: ignore[no-untyped-def]
        for _ in range(10):
            yield b"y" * 1000

    status, _ = await _get(world, world.url("api.example.test", "/upload"), method="POST", data=chunks())
    assert status == 413
    assert world.public.hits == []


async def test_oversized_response_is_refused(world: World) -> None:
    status, body = await _get(world, world.url("api.example.test", "/big?n=9000"))
    assert (status, b"response_too_large" in body) == (502, True)
    status, body = await _get(world, world.url("api.example.test", "/big?n=8000"))
    assert (status, len(body)) == (200, 8000)


async def test_https_through_the_deployment_ca(world: World) -> None:
    status, body = await _get(world, world.url("api.example.test", "/secure", tls=True))
    assert status == 200
    assert decoded(body)["path"] == "/secure"
    (event,) = world.sink.events
    assert (event.scheme, event.host, event.decision) == ("https", "api.example.test", "allowed")


async def test_https_to_a_host_outside_the_allowlist_is_refused_at_connect(world: World) -> None:
    with pytest.raises(aiohttp.ClientHttpProxyError) as err:
        await _get(world, world.url("blocked.test", "/", tls=True))
    assert err.value.status == 403
    assert world.tls.hits == []


async def test_a_host_header_inside_a_tunnel_cannot_change_the_destination(world: World) -> None:
    status, body = await _get(
        world, world.url("api.example.test", "/x", tls=True), headers={"Host": f"blocked.test:{world.tls.port}"}
    )
    assert status == 200
    assert decoded(body)["host"] == f"api.example.test:{world.tls.port}"
    assert [e.host for e in world.sink.events] == ["api.example.test"]


async def test_upstream_certificate_is_verified(make_world) -> None:  # type: ignore[no-untyped-def]
    world = await make_world(trust_upstream=False)
    status, body = await _get(world, world.url("api.example.test", "/", tls=True))
    assert (status, b"upstream_tls" in body) == (502, True)
    assert world.tls.hits == []


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_with_the_sandbox_environment(world: World) -> None:
    env = {"PATH": "/usr/bin:/bin", **world.proxy.environment(world.grant)}
    proc = await asyncio.create_subprocess_exec(
        "curl",
        "-sS",
        "--max-time",
        "20",
        world.url("api.example.test", "/from-curl", tls=True),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err
    assert json.loads(out)["path"] == "/from-curl"


async def test_the_unix_socket_serves_the_same_policy(world: World) -> None:
    reader, writer = await asyncio.open_unix_connection(str(world.socket_path))
    auth = base64.b64encode(f"{world.grant.token}:".encode()).decode()
    for host in ("api.example.test", "blocked.test"):
        writer.write(
            f"GET http://{host}:{world.public.port}/via-socket HTTP/1.1\r\nHost: {host}\r\n"
            f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(
            next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        )
        await reader.readexactly(length)
        assert head.startswith(b"HTTP/1.1 200" if host == "api.example.test" else b"HTTP/1.1 403"), head
    writer.close()
    assert [hit["path"] for hit in world.public.hits] == ["/via-socket"]


async def test_malformed_requests_get_400_not_a_crash(world: World, caplog: pytest.LogCaptureFixture) -> None:
    reader, writer = await asyncio.open_connection(world.proxy.host, world.proxy.port)
    writer.write(b"GET /relative HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 400")
    writer.close()
    reader, writer = await asyncio.open_connection(world.proxy.host, world.proxy.port)
    writer.write(b"POST http://api.example.test/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n")
    await writer.drain()
    first = await reader.read(100)
    assert first == b"" or first.startswith(b"HTTP/1.1 400")  # h11 refuses ambiguous framing
    writer.close()
    for raw in (
        b"GET http://[bad/ HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET http://a b.example.test/ HTTP/1.1\r\n\r\n",
        b"CONNECT [zz]:443 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"CONNECT no-port HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x00\x01\x02\r\n\r\n",
    ):
        reader, writer = await asyncio.open_connection(world.proxy.host, world.proxy.port)
        writer.write(raw)
        await writer.drain()
        answer = await reader.read(100)
        assert answer == b"" or answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 407")), (raw, answer)
        writer.close()
    assert world.public.hits == []
    assert "failed" not in caplog.text  # each ended as a handled refusal, not an unexpected error


async def test_expect_100_continue_is_answered_before_the_body(world: World) -> None:
    reader, writer = await asyncio.open_connection(world.proxy.host, world.proxy.port)
    auth = base64.b64encode(f"{world.grant.token}:".encode()).decode()
    writer.write(
        f"POST http://api.example.test:{world.public.port}/up HTTP/1.1\r\nHost: api.example.test\r\n"
        f"Proxy-Authorization: Basic {auth}\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n".encode()
    )
    await writer.drain()
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 100")
    writer.write(b"hello")
    await writer.drain()
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    writer.close()
    assert [hit["body"] for hit in world.public.hits] == [b"hello"]


async def test_revoking_a_grant_stops_its_open_tunnel(world: World) -> None:
    proxy = f"http://{world.grant.token}:@{world.proxy.host}:{world.proxy.port}"
    url = world.url("api.example.test", "/t", tls=True)
    tls = world.client_tls()  # one context: the second request reuses the tunnel (the context is in the pool key)
    async with aiohttp.ClientSession() as http:
        async with http.get(url, proxy=proxy, ssl=tls) as resp:
            assert resp.status == 200
            await resp.read()
        world.forwarder.policy.revoke(world.grant)
        async with http.get(url, proxy=proxy, ssl=tls) as resp:
            assert resp.status == 407  # answered inside the open tunnel, not at a new CONNECT
    assert len(world.tls.hits) == 1
