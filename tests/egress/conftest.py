"""A local world for the egress proxy: test names mapped to loopback servers, and the real settings contract.

"Public" servers listen on 127.0.0.2 (made reachable with ``SWITCHBOARD_EGRESS__INTERNAL_NETWORKS=127.0.0.2/32``);
a "private" server listens on 127.0.0.1 at the same port, so a name that resolves to 127.0.0.1 would reach it if
the address check failed. Only the test resolver knows these names; the production resolver is the system's.
"""

from __future__ import annotations

import gzip
import itertools
import json
import socket
import ssl
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from switchboard.egress.ca import DeploymentCA
from switchboard.egress.events import EgressRequested
from switchboard.egress.forward import Forwarder
from switchboard.egress.policy import Grant
from switchboard.egress.proxy import EgressProxy, build_proxy
from switchboard.settings import Settings, load_settings

SECRET_VALUE = "ghp_REAL-secret-value-0123456789"
SHARED_VALUE = "shared-REAL-value-9876543210"
PUBLIC = "127.0.0.2"

YAML = """
agents:
  assistant:
    profile: {name: Assistant, description: test}
    instructions: test
    egress:
      allow: [api.example.test, "*.example.test"]
      secrets:
        GITHUB_TOKEN: {env: GH_TOKEN, domains: [api.example.test]}
  other:
    profile: {name: Other, description: test}
    instructions: test
"""


class MapResolver(AbstractResolver):
    """Test names → addresses (a list, or a cycle of lists: a rebinding DNS server); counts lookups."""

    def __init__(self, names: dict[str, list[list[str]]]) -> None:
        self.answers = {name: itertools.cycle(answers) for name, answers in names.items()}
        self.lookups: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.lookups.append(host)
        if host not in self.answers:
            raise OSError(f"no such test name {host}")
        return [
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": socket.AF_INET6 if ":" in address else socket.AF_INET,
                "proto": 0,
                "flags": 0,
            }
            for address in next(self.answers[host])
        ]

    async def close(self) -> None:
        return None


class ListSink:
    """Keeps every egress fact (the production sink writes them to Redis)."""

    def __init__(self) -> None:
        self.events: list[EgressRequested] = []

    async def record(self, event: EgressRequested) -> None:
        self.events.append(event)


def _encode(data: bytes, coding: str) -> bytes:
    """``data`` in one content coding (``br`` and ``zstd``: bytes that only claim it, as no codec is installed)."""
    match coding:
        case "gzip" | "x-gzip":
            return gzip.compress(data)
        case "deflate":
            return zlib.compress(data)
        case _:
            return data


@dataclass
class Upstream:
    """A recording HTTP(S) server."""

    hits: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0
    stored: str = ""

    def app(self) -> web.Application:
        async def any_path(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            self.hits.append(
                {"path": request.path_qs, "method": request.method, "headers": request.headers.copy(), "body": body}
            )
            if request.path == "/redirect":
                raise web.HTTPFound(request.query["to"])
            if request.path == "/big":
                return web.Response(body=b"x" * int(request.query["n"]))
            if request.path == "/store":  # a destination that keeps a header, and shows it to any later request
                self.stored = request.headers.get("Authorization", "")
                return web.Response(text="stored")
            if request.path == "/recall":
                return web.Response(text=f"you stored: {self.stored}", headers={"X-Stored": self.stored})
            if request.path == "/encoded-echo":  # echoes credentials in the encoding asked by ``enc``, whatever
                text = f"seen: {request.headers.get('Authorization', '')}".encode()  # the request accepts
                text += b"0" * int(request.query.get("pad", "0"))
                codings = [c.strip() for c in request.query["enc"].split(",")]
                for coding in codings:
                    text = _encode(text, coding)
                if request.query.get("truncated"):
                    text = text[: len(text) // 2]
                resp = web.Response(body=text, headers={"Content-Encoding": request.query["enc"]})
                if request.query.get("chunked"):
                    resp.enable_chunked_encoding()
                return resp
            if request.path == "/echo-auth":  # a destination that echoes credentials back
                return web.Response(
                    text=request.headers.get("Authorization", ""),
                    headers={"X-Seen": request.headers.get("Authorization", "")},
                )
            resp = web.json_response(
                {"path": request.path_qs, "method": request.method, "host": request.host, "bytes": len(body)}
            )
            resp.force_close()  # one connection per request, so every request resolves its name again
            return resp

        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", any_path)
        return app


@dataclass
class World:
    settings: Settings
    proxy: EgressProxy
    forwarder: Forwarder
    sink: ListSink
    resolver: MapResolver
    public: Upstream
    tls: Upstream
    private: Upstream
    upstream_ca: DeploymentCA
    socket_path: Path
    grant: Grant

    def url(self, host: str, path: str = "/", *, tls: bool = False) -> str:
        port = self.tls.port if tls else self.public.port
        return f"{'https' if tls else 'http'}://{host}:{port}{path}"

    @property
    def proxy_url(self) -> str:
        return f"http://{self.proxy.host}:{self.proxy.port}"

    def client_tls(self) -> ssl.SSLContext:
        """What a sandbox has: trust in the deployment CA only."""
        return ssl.create_default_context(cafile=str(self.proxy.ca.cert_path))


async def _serve(
    app: web.Application, host: str, port: int, tls: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    server = site._server
    assert server is not None
    return runner, server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


@pytest.fixture
async def make_world(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    runners: list[web.AppRunner] = []
    proxies: list[EgressProxy] = []

    async def build(
        names: dict[str, list[list[str]]] | None = None, *, trust_upstream: bool = True, **env_extra: str
    ) -> World:
        private, public, tls = Upstream(), Upstream(), Upstream()
        runner, private.port = await _serve(private.app(), "127.0.0.1", 0)
        runners.append(runner)
        runner, public.port = await _serve(public.app(), PUBLIC, private.port)
        runners.append(runner)
        upstream_ca = DeploymentCA.load_or_create(tmp_path / "upstream-ca")
        cert, key = upstream_ca.issue("api.example.test")
        (tmp_path / "upstream.pem").write_bytes(cert + key)
        server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_tls.load_cert_chain(tmp_path / "upstream.pem")
        runner, tls.port = await _serve(tls.app(), PUBLIC, 0, server_tls)
        runners.append(runner)
        config = tmp_path / "switchboard.yaml"
        config.write_text(YAML)
        env = {
            "SWITCHBOARD_CONFIG": str(config),
            "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
            "SWITCHBOARD_EGRESS__PORTS": f"80,443,{public.port},{tls.port}",
            "SWITCHBOARD_EGRESS__INTERNAL_NETWORKS": f"{PUBLIC}/32",
            "SWITCHBOARD_EGRESS__MAX_REQUEST_BYTES": "4096",
            "SWITCHBOARD_EGRESS__MAX_RESPONSE_BYTES": "8192",
            "SWITCHBOARD_EGRESS__SECRETS__SHARED__VALUE": SHARED_VALUE,
            "SWITCHBOARD_EGRESS__SECRETS__SHARED__DOMAINS": "other.example.test",
            "GH_TOKEN": SECRET_VALUE,
            **env_extra,
        }
        if trust_upstream:
            env["SWITCHBOARD_EGRESS__UPSTREAM_CA_FILE"] = str(upstream_ca.cert_path)
        settings = load_settings(env)
        resolver = MapResolver(
            names
            or {
                "api.example.test": [[PUBLIC]],
                "other.example.test": [[PUBLIC]],
                "plain.example.test": [[PUBLIC]],
                "blocked.test": [[PUBLIC]],
                "loop.example.test": [["127.0.0.1"]],
                "ten.example.test": [["10.0.0.1"]],
                "meta.example.test": [["169.254.169.254"]],
                "six.example.test": [["::1"]],
                "mapped.example.test": [["::ffff:127.0.0.1"]],
                "mixed.example.test": [[PUBLIC, "127.0.0.1"]],
            }
        )
        sink = ListSink()
        proxy = build_proxy(settings, sink, resolver=resolver)
        forwarder, policy = proxy.forwarder, proxy.forwarder.policy
        assert proxy.socket_path is not None
        socket_path = proxy.socket_path
        await proxy.start()
        proxies.append(proxy)
        grant = policy.grant("assistant", "default/assistant/web/main/conv-1")
        return World(settings, proxy, forwarder, sink, resolver, public, tls, private, upstream_ca, socket_path, grant)

    yield build
    for proxy in proxies:
        await proxy.close()
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def world(make_world: Callable[..., Any]) -> AsyncIterator[World]:
    yield await make_world()


def decoded(body: bytes) -> Any:
    return json.loads(body)
