"""A knowledge set-up as a worker builds it: the YAML file beside its sources, a page server reached through egress,
the SQLite memory store, the indexer and the tool gateway over the knowledge tools."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docx
import pytest
from aiohttp import web

from switchboard.cli.knowledge import knowledge_agents, knowledge_indexer
from switchboard.cli.worker import provider_config
from switchboard.core.knowledge.index import IndexReport, KnowledgeIndexer
from switchboard.core.knowledge.tools import knowledge_tools
from switchboard.core.memory.embeddings import Embedder
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.core.model import ModelAdapter
from switchboard.core.providers import ModelFactory
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.calls import ToolOutcome
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.egress.forward import Forwarder
from switchboard.egress.policy import EgressPolicy
from switchboard.settings import Settings, load_settings
from switchboard.types import SessionKey
from tests.egress.conftest import PUBLIC, ListSink, MapResolver, _serve

PAGE_HOST = "docs.example.test"

PAGE = """<html><head><title>ignored</title><script>var x = "hidden script";</script></head>
<body><h1>Shipping policy</h1><p>Parcels leave the warehouse within two days.</p>
<p>International shipping takes ten days to arrive.</p></body></html>"""


def write_docx(path: Path, heading: str, paragraphs: list[str]) -> None:
    """A real DOCX: a heading and paragraphs."""
    document = docx.Document()
    document.add_heading(heading, level=1)
    for text in paragraphs:
        document.add_paragraph(text)
    document.save(str(path))


class CountingModels:
    """The worker's model factory, counting the summaries asked of it (each ``get`` is one source summarised)."""

    def __init__(self, inner: ModelFactory) -> None:
        self.inner = inner
        self.asked = 0

    def get(self, spec: str) -> ModelAdapter:
        self.asked += 1
        return self.inner.get(spec)


@dataclass
class World:
    """Configuration folder, settings, store, indexer, gateway and the page server's state."""

    root: Path
    settings: Settings
    store: SQLiteMemoryStore
    models: CountingModels
    forwarder: Forwarder
    sink: ListSink
    port: int
    pages: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    gateway: ToolGateway | None = None
    embedder: Embedder | None = None

    def indexer(self) -> KnowledgeIndexer:
        return knowledge_indexer(self.settings, self.store, self.models, self.forwarder, self.embedder)

    def reload(self, yaml: str) -> None:
        """A changed YAML file, as a worker reads it at start."""
        (self.root / "switchboard.yaml").write_text(yaml.replace("{port}", str(self.port)))
        self.settings = load_settings(_env(self.root, self.port))
        self.forwarder.policy = EgressPolicy.from_settings(self.settings)  # egress follows the file, as on a restart
        registry = ToolRegistry(knowledge_tools(self.store, lambda: self.settings.file.agents, self.embedder))
        self.gateway = ToolGateway(registry, workspace_root=self.root)

    async def index(self, agent: str) -> IndexReport:
        [found] = knowledge_agents(self.settings, agent).values()
        assert found.knowledge is not None
        return await self.indexer().index(agent, found.knowledge, found.model or self.settings.default_model)

    async def call(self, name: str, args: dict[str, Any], *, agent: str, tenant: str = "default") -> ToolOutcome:
        assert self.gateway is not None
        ctx = ToolContext(
            session_key=SessionKey(f"{tenant}/{agent}/web/default/c1"),
            tenant=tenant,
            run_id="run-1",
            actor="web:ann",
            workspace=self.root,
            idempotency_key="",
            agent=agent,
        )
        return await self.gateway.call(name, args, ctx)


def _env(root: Path, port: int) -> dict[str, str]:
    return {
        "SWITCHBOARD_CONFIG": str(root / "switchboard.yaml"),
        "SWITCHBOARD_DATA_DIR": str(root / "data"),
        "SWITCHBOARD_EGRESS__PORTS": f"80,443,{port}",
        "SWITCHBOARD_EGRESS__INTERNAL_NETWORKS": f"{PUBLIC}/32",
        "SWITCHBOARD_DOCUMENTS__MAX_BYTES": "200000",
    }


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    """An empty configuration folder, a page server on a test host name, and egress to it."""
    pages: dict[str, tuple[str, bytes]] = {}

    async def page(request: web.Request) -> web.Response:
        found = pages.get(request.path)
        if found is None:
            return web.Response(status=404, text="no such page")
        return web.Response(body=found[1], content_type=found[0])

    app = web.Application()
    app.router.add_get("/{tail:.*}", page)
    runner, port = await _serve(app, PUBLIC, 0)
    root = tmp_path / "config"
    root.mkdir()
    (root / "switchboard.yaml").write_text("{}\n")
    settings = load_settings(_env(root, port))
    sink = ListSink()
    resolver = MapResolver({PAGE_HOST: [[PUBLIC]]})
    store = SQLiteMemoryStore(tmp_path / "memory")
    models = CountingModels(ModelFactory(provider_config(settings)))
    forwarder = Forwarder(EgressPolicy.from_settings(settings), settings.egress, sink, resolver=resolver)
    found = World(root, settings, store, models, forwarder, sink, port, pages)
    try:
        yield found
    finally:
        await found.forwarder.close()
        store.close()
        await runner.cleanup()
