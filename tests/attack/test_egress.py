"""A hostile sandbox against the egress proxy: SSRF through URL parser tricks, smuggling, placeholder games, echoes.

Built on the egress suite's local world (``tests/egress/conftest.py``): "public" test names resolve to 127.0.0.2,
a "private" server listens on 127.0.0.1 at the same port, so any bypass shows up as a hit there. Tests marked
``xfail(strict=True)`` pin a defect described in the attack notes of issue #10: they fail today and the mark goes
with the fix.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from switchboard.egress.ca import DeploymentCA
from switchboard.egress.placeholders import placeholder
from tests.egress.conftest import PUBLIC, SECRET_VALUE, World, _serve, make_world, world
from tests.egress.test_proxy import _get

__all__ = ["make_world", "world"]  # the egress suite's fixtures, used here by name

TOKEN = placeholder("GITHUB_TOKEN")


def _auth(world: World) -> str:
    return base64.b64encode(f"{world.grant.token}:".encode()).decode()


async def _raw(world: World, data: bytes) -> bytes:
    """Send raw bytes to the proxy; everything it answers until it closes (or 5 s of silence)."""
    reader, writer = await asyncio.open_connection(world.proxy.host, world.proxy.port)
    writer.write(data)
    await writer.drain()
    answer = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 5):
            answer += chunk
    except (TimeoutError, ConnectionError):
        pass
    writer.close()
    return answer


async def test_a_secret_is_never_sent_over_plain_http(world: World) -> None:
    status, _ = await _get(world, world.url("api.example.test", "/user"), headers={"Authorization": f"Bearer {TOKEN}"})
    seen = [hit["headers"].get("Authorization", "") for hit in world.public.hits]
    assert not any(SECRET_VALUE in value for value in seen), "the real value crossed the network unencrypted"
    assert status == 403


async def test_an_encoded_echo_of_a_secret_never_reaches_the_sandbox(
    make_world: Callable[..., Any], tmp_path: Path
) -> None:
    ca = DeploymentCA.load_or_create(tmp_path / "echo-ca")
    cert, key = ca.issue("api.example.test")
    (tmp_path / "echo.pem").write_bytes(cert + key)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "echo.pem")

    async def echo(request: web.Request) -> web.Response:  # an API that reflects the credential it was sent
        seen = request.headers.get("Authorization", "").encode()
        return web.json_response({"b64": base64.b64encode(seen).decode(), "upper": seen.decode().upper()})

    app = web.Application()
    app.router.add_get("/whoami", echo)
    runner, port = await _serve(app, PUBLIC, 0, tls)
    try:
        world = await make_world(
            trust_upstream=False,
            SWITCHBOARD_EGRESS__PORTS=f"443,{port}",
            SWITCHBOARD_EGRESS__UPSTREAM_CA_FILE=str(ca.cert_path),
        )
        status, body = await _get(
            world, f"https://api.example.test:{port}/whoami", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert status == 200, body
        import json

        shown = json.loads(body)
        assert SECRET_VALUE.encode() not in base64.b64decode(shown["b64"])
        assert SECRET_VALUE.upper() not in shown["upper"]
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    "url",
    [
        "http://2130706433:{port}/",
        "http://0x7f000001:{port}/",
        "http://0x7f.1:{port}/",
        "http://017700000001:{port}/",
        "http://127.1:{port}/",
        "http://0:{port}/",
        "http://[::1]:{port}/",
        "http://[::ffff:7f00:1]:{port}/",
        "http://[fe80::1%25lo]:{port}/",
        "http://api.example.test@127.0.0.1:{port}/",
        "http://127.0.0.1:{port}#@api.example.test/",
        "http://127.0.0.1:{port}\\@api.example.test/",
        "http://api.example.test.127.0.0.1.nip.io:{port}/",
        "http://169.254.169.254:{port}/latest/meta-data/",
        "http://loop.example.test:{port}/",
        "http://LOOP.EXAMPLE.TEST.:{port}/",
    ],
)
async def test_address_tricks_never_reach_a_private_address(world: World, url: str) -> None:
    target = url.format(port=world.public.port)
    answer = await _raw(
        world,
        f"GET {target} HTTP/1.1\r\nHost: api.example.test\r\n"
        f"Proxy-Authorization: Basic {_auth(world)}\r\n\r\n".encode(),
    )
    assert world.private.hits == []
    assert not answer.startswith(b"HTTP/1.1 200"), (target, answer[:200])


@pytest.mark.parametrize(
    "target",
    ["127.0.0.1:{port}", "[::1]:{port}", "2130706433:{port}", "0x7f.1:{port}", "[fe80::1%lo]:{port}"],
)
async def test_connect_to_a_private_target_is_refused(world: World, target: str) -> None:
    where = target.format(port=world.public.port)
    answer = await _raw(
        world,
        f"CONNECT {where} HTTP/1.1\r\nHost: {where}\r\nProxy-Authorization: Basic {_auth(world)}\r\n\r\n".encode(),
    )
    assert answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 403")), answer[:200]
    assert world.private.hits == []


@pytest.mark.parametrize(
    "raw",
    [
        # a second request hidden behind a first one's framing: parsed, and checked, as its own request
        "POST http://api.example.test:{port}/a HTTP/1.1\r\nHost: a\r\n{auth}Content-Length: 0\r\n\r\n"
        "GET http://loop.example.test:{port}/b HTTP/1.1\r\nHost: a\r\n{auth}\r\n",
        "POST http://api.example.test:{port}/a HTTP/1.1\r\nHost: a\r\n{auth}Content-Length: 5\r\n"
        "Content-Length: 60\r\n\r\nhelloGET http://loop.example.test:{port}/ HTTP/1.1\r\n{auth}\r\n",
        "POST http://api.example.test:{port}/a HTTP/1.1\r\nHost: a\r\n{auth}"
        "Transfer-Encoding: chunked, identity\r\n\r\n"
        "0\r\n\r\nGET http://loop.example.test:{port}/ HTTP/1.1\r\n{auth}\r\n",
        # obs-fold hiding a placeholder: the folded value is checked like any other (other.example.test is unbound)
        "GET http://other.example.test:{port}/a HTTP/1.1\r\nHost: a\r\n{auth}"
        "X-Fold: a\r\n  Authorization: {token}\r\n\r\n",
        "GET http://api.example.test:{port}/a HTTP/1.1\nHost: a\n{auth_lf}\n"
        "GET http://loop.example.test:{port}/ HTTP/1.1\n"
        "{auth_lf}\n",
        "GET http://api.example.test:{port}/a HTTP/1.1\r\nHost: a\r\n{auth}X-Big: " + "x" * 70000 + "\r\n\r\n",
    ],
)
async def test_smuggling_and_malformed_framing_never_reach_a_private_address(world: World, raw: str) -> None:
    auth = f"Proxy-Authorization: Basic {_auth(world)}\r\n"
    data = raw.format(port=world.public.port, auth=auth, auth_lf=auth.replace("\r\n", "\n"), token=TOKEN).encode()
    await _raw(world, data)
    assert world.private.hits == []
    assert all(SECRET_VALUE not in str(dict(hit["headers"])) for hit in world.public.hits)


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "{{SECRET:GITHUB_TOKEN}}"},  # case games are refused, never sent on as text
        {"Authorization": "{{ secret:github_token }}"},
        {"X-A": "{{secret:", "X-B": "GITHUB_TOKEN}}"},  # split across headers
        {"Authorization": base64.b64encode(TOKEN.encode()).decode()},  # encoded: not a placeholder, not a secret
        {"Proxy-Authorization": f"Basic {TOKEN}"},
        {"Authorization": "%7B%7Bsecret:GITHUB_TOKEN%7D%7D"},
    ],
)
async def test_placeholder_games_to_an_unbound_host_never_carry_the_value(
    world: World, headers: dict[str, str]
) -> None:
    await _get(world, world.url("other.example.test", "/p"), headers=headers)  # allowlisted, not bound
    assert all(SECRET_VALUE not in str(dict(hit["headers"])) for hit in world.public.hits)
    assert world.private.hits == []


async def test_a_redirect_to_another_scheme_or_a_private_address_is_not_followed(world: World) -> None:
    for to in ("file:///etc/passwd", "gopher://127.0.0.1:70/x", f"http://127.0.0.1:{world.public.port}/x"):
        status, _ = await _get(world, world.url("api.example.test", f"/redirect?to={to}"), allow_redirects=False)
        assert status == 302
    assert world.private.hits == []
