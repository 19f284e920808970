"""Egress from a bubblewrap sandbox: only through the proxy's unix socket, by way of the bridge inside."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from switchboard.sandbox.runner import Sandbox
from switchboard.sandbox.seccomp import program


@pytest.fixture
async def proxy_socket(tmp_path: Path) -> AsyncIterator[tuple[Path, list[str]]]:
    """A stand-in egress proxy: an HTTP server on a unix socket that answers every request with its target."""
    seen: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(str(request.url) if request.url.host else request.path_qs)
        return web.Response(text=f"proxied {request.method} {request.path_qs} host={request.host}")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    path = tmp_path / "egress.sock"
    await web.UnixSite(runner, str(path)).start()
    yield path, seen
    await runner.cleanup()


def with_proxy(sandbox: Sandbox, path: Path) -> Sandbox:
    return dataclasses.replace(sandbox, proxy_socket=path, seccomp=program(inet=True), _slots={})


async def test_http_through_the_bridge_reaches_the_proxy(
    bwrap: Sandbox, workspace: Path, proxy_socket: tuple[Path, list[str]]
) -> None:
    path, seen = proxy_socket
    fetch = (
        "import urllib.request; print(urllib.request.urlopen('http://api.example.test/v1/items?q=1').read().decode())"
    )
    done = await with_proxy(bwrap, path).run(f'python3 -c "{fetch}"', workspace, timeout_s=10.0, max_output=2000)
    assert done.stdout == "proxied GET /v1/items?q=1 host=api.example.test\n", done.stderr
    assert len(seen) == 1
    assert (
        "HTTP_PROXY=http://127.0.0.1:3128"
        in (await with_proxy(bwrap, path).run("env", workspace, timeout_s=10.0, max_output=2000)).stdout
    )


async def test_with_the_bridge_the_host_is_still_unreachable(
    bwrap: Sandbox, workspace: Path, proxy_socket: tuple[Path, list[str]]
) -> None:
    path, _ = proxy_socket
    probe = "import socket; socket.create_connection(('10.0.2.2', 80), timeout=2); print('CONNECTED')"
    done = await with_proxy(bwrap, path).run(f'python3 -c "{probe}"', workspace, timeout_s=10.0, max_output=2000)
    assert "CONNECTED" not in done.stdout and "unreachable" in done.stderr


async def test_without_the_option_no_proxy_is_set(bwrap: Sandbox, workspace: Path) -> None:
    done = await bwrap.run("env", workspace, timeout_s=10.0, max_output=2000)
    assert "PROXY" not in done.stdout.upper() and done.exit_code == 0


async def test_curl_goes_through_the_proxy(
    bwrap: Sandbox, workspace: Path, proxy_socket: tuple[Path, list[str]]
) -> None:
    path, seen = proxy_socket
    done = await with_proxy(bwrap, path).run(
        "curl -sS http://files.example.test/report.csv", workspace, timeout_s=10.0, max_output=2000
    )
    assert done.stdout == "proxied GET /report.csv host=files.example.test", done.stderr
    assert len(seen) == 1
