"""Fake search APIs over real HTTPS, and the egress world ``web_search`` reaches them through.

Each API listens on 127.0.0.2 (made reachable with ``SWITCHBOARD_EGRESS__INTERNAL_NETWORKS``) under a certificate for
its real host name from a test CA that egress is told to trust; only the test resolver knows the names.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from switchboard.core.providers.images import ImageProvider
from switchboard.core.tools.builtin import ToolRegistry, default_registry
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.egress.ca import DeploymentCA
from switchboard.egress.forward import Forwarder
from switchboard.egress.policy import EgressPolicy
from switchboard.egress.transport import EgressTransport
from switchboard.settings import Settings, load_settings
from switchboard.types import SessionKey
from tests.egress.conftest import PUBLIC, ListSink, MapResolver, _serve
from tests.fakes.search_api import BRAVE_KEY, TAVILY_KEY, FakeSearch

HOSTS = {"brave": "api.search.brave.com", "tavily": "api.tavily.com", "searxng": "searx.test"}

YAML = """
default_agent: brave
agents:
  brave:
    profile: {{name: Brave, description: test}}
    instructions: test
    tools: [web_search, send_file, generate_image]
    search:
      provider: brave
      api_key_secret: BRAVE_KEY
      url: https://api.search.brave.com:{brave}/res/v1/web/search
      max_results: 3
    egress:
      allow: [api.search.brave.com]
      secrets:
        BRAVE_KEY: {{env: BRAVE_ENV, domains: [api.search.brave.com]}}
  tavily:
    profile: {{name: Tavily, description: test}}
    instructions: test
    tools: [web_search]
    search: {{provider: tavily, api_key_secret: TAVILY_KEY, url: "https://api.tavily.com:{tavily}/search"}}
    egress:
      allow: [api.tavily.com]
      secrets:
        TAVILY_KEY: {{env: TAVILY_ENV, domains: [api.tavily.com]}}
  searxng:
    profile: {{name: Searx, description: test}}
    instructions: test
    tools: [web_search]
    search: {{provider: searxng, url: "https://searx.test:{searxng}/search"}}
    egress:
      allow: [searx.test]
  closed:
    profile: {{name: Closed, description: test}}
    instructions: test
    tools: [web_search]
    search: {{provider: searxng, url: "https://searx.test:{searxng}/search"}}
  hosted:
    profile: {{name: Hosted, description: test}}
    instructions: test
    tools: [web_search]
"""


@dataclass
class SearchWorld:
    settings: Settings
    api: FakeSearch
    sink: ListSink
    registry: ToolRegistry
    gateway: ToolGateway
    workspace: Path

    def ctx(self, agent: str, **kw: Any) -> ToolContext:
        values: dict[str, Any] = {
            "session_key": SessionKey(f"default/{agent}/web/main/conv-1"),
            "tenant": "default",
            "run_id": "run-1",
            "actor": "web:u1",
            "workspace": self.workspace,
            "idempotency_key": "",
            "agent": agent,
        }
        values.update(kw)
        return ToolContext(**values)


def search_settings(tmp_path: Path, ports: dict[str, int], ca: DeploymentCA) -> Settings:
    config = tmp_path / "switchboard.yaml"
    config.write_text(YAML.format(**ports))
    env = {
        "SWITCHBOARD_CONFIG": str(config),
        "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
        "SWITCHBOARD_EGRESS__PORTS": ",".join(["443", *(str(port) for port in ports.values())]),
        "SWITCHBOARD_EGRESS__INTERNAL_NETWORKS": f"{PUBLIC}/32",
        "SWITCHBOARD_EGRESS__UPSTREAM_CA_FILE": str(ca.cert_path),
        "BRAVE_ENV": BRAVE_KEY,
        "TAVILY_ENV": TAVILY_KEY,
    }
    return load_settings(env)


@contextlib.asynccontextmanager
async def serve_search(tmp_path: Path) -> AsyncIterator[tuple[FakeSearch, dict[str, int], DeploymentCA]]:
    """The fake search APIs, one HTTPS server per host name sharing their state; their ports; the CA that signed."""
    ca = DeploymentCA.load_or_create(tmp_path / "upstream-ca")
    api = FakeSearch()
    runners: list[web.AppRunner] = []
    ports: dict[str, int] = {}
    for provider, host in HOSTS.items():
        cert, key = ca.issue(host)
        (tmp_path / f"{provider}.pem").write_bytes(cert + key)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(tmp_path / f"{provider}.pem")
        runner, ports[provider] = await _serve(api.app(), PUBLIC, 0, tls)
        runners.append(runner)
    try:
        yield api, ports, ca
    finally:
        for runner in runners:
            await runner.cleanup()


@pytest.fixture
async def search_apis(tmp_path: Path) -> AsyncIterator[tuple[FakeSearch, dict[str, int], DeploymentCA]]:
    async with serve_search(tmp_path) as served:
        yield served


@pytest.fixture
async def search_world(
    tmp_path: Path, search_apis: tuple[FakeSearch, dict[str, int], DeploymentCA]
) -> AsyncIterator[Callable[..., SearchWorld]]:
    api, ports, ca = search_apis
    forwarders: list[Forwarder] = []

    def build(images: ImageProvider | None = None, **gateway_kw: Any) -> SearchWorld:
        settings = search_settings(tmp_path, ports, ca)
        sink = ListSink()
        resolver = MapResolver({host: [[PUBLIC]] for host in HOSTS.values()})
        forwarder = Forwarder(EgressPolicy.from_settings(settings), settings.egress, sink, resolver=resolver)
        forwarders.append(forwarder)
        registry = default_registry(
            sandbox=None, agents=settings.file.agents, search=EgressTransport(forwarder), images=images
        )
        gateway_kw.setdefault("backoff_base_s", 0.0)
        gateway = ToolGateway(registry, workspace_root=tmp_path / "ws-root", **gateway_kw)
        return SearchWorld(settings, api, sink, registry, gateway, tmp_path / "ws-root" / "ws")

    yield build
    for forwarder in forwarders:
        await forwarder.close()
