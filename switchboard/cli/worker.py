"""The worker process: the agent runtime, channel adapters and the session worker, wired from settings."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING

from switchboard.channels.registry import ChannelSet, build_channels, send_rates
from switchboard.cli.sandbox import shell_options, startup_choice
from switchboard.control.memory import ConfiguredStore, close_store, memory_store, open_store
from switchboard.core.agent.attachments import AttachmentSupport
from switchboard.core.agent.runtime import Runtime
from switchboard.core.approvals.suspend import snapshot_key
from switchboard.core.memory.config import build_embedder
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.providers.transcription import OpenAITranscriber
from switchboard.core.tables.connections import TableConnections
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.builtin.documents import DocumentLimits
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.tools.threads import ThreadShare
from switchboard.core.workspaces.disk import Quotas, Workspaces
from switchboard.core.workspaces.s3 import build_workspace_store
from switchboard.errors import ConfigError
from switchboard.outbound.webstream import WebStreamPublisher
from switchboard.queue.connection import as_redis, async_client
from switchboard.queue.uploads import UploadStore
from switchboard.settings import Settings
from switchboard.skills.store import SkillLibrary, SkillStore
from switchboard.worker.files import attachment_support
from switchboard.worker.worker import run_worker as run_session_worker

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from switchboard.core.memory.store import MemoryStore
    from switchboard.core.memory.tools import ConnectedProjects
    from switchboard.core.providers.images import ImageProvider
    from switchboard.core.tools.builtin.shell import EgressGate
    from switchboard.core.tools.mcp.client import McpClients
    from switchboard.core.workspaces.store import WorkspaceStore
    from switchboard.egress.forward import Forwarder
    from switchboard.egress.gate import SandboxEgress
    from switchboard.egress.transport import EgressTransport
    from switchboard.queue.retention import RetentionPlan

__all__ = [
    "build_runtime",
    "image_provider",
    "memory_tenants",
    "provider_config",
    "retention_plan",
    "retention_reaches_memory",
    "run_worker",
]

logger = logging.getLogger(__name__)


def provider_config(settings: Settings) -> ProviderConfig:
    """Provider credentials and endpoints, read once from the settings."""
    return ProviderConfig(
        openai_api_key=settings.openai_api_key.get_secret_value() if settings.openai_api_key else None,
        openai_base_url=settings.openai_base_url,
        openai_wire_api=settings.openai_wire_api,
        anthropic_api_key=settings.anthropic_api_key.get_secret_value() if settings.anthropic_api_key else None,
        anthropic_base_url=settings.anthropic_base_url,
        offline_delay_ms=settings.offline.delay_ms,
    )


def build_runtime(
    settings: Settings,
    models: ModelFactory,
    attachments: AttachmentSupport | None = None,
    egress: EgressGate | None = None,
    rest: EgressTransport | None = None,
    mcp: McpClients | None = None,
    tables: TableConnections | None = None,
    images: ImageProvider | None = None,
    memory: MemoryStore | None = None,
    connected: ConnectedProjects | None = None,
) -> Runtime:
    """The shared agent runtime over the configured models and tools.

    ``attachments``: how users' files arrive; ``egress``: the worker's egress proxy for shell commands; ``rest``: the
    way out of declared REST tools and search APIs (``None``: their calls fail, saying the process has no egress);
    ``mcp``: the worker's MCP sessions, whose servers' accepted tools are registered as ``<server>__<tool>``;
    ``tables``: the agents' connected tables (default: bound here; the caller that passes them closes their pools);
    ``images``: who draws for ``generate_image`` (``None``: its calls fail, saying so); ``memory``: where facts and
    knowledge live (default: the store the ``memory:`` block configures); ``connected``: the agents' projects
    (default: the YAML file's alone; the worker adds the operators' connections).
    """
    from switchboard.core.knowledge.tools import knowledge_tools
    from switchboard.egress.transport import register_rest_tools

    docs, spaces = settings.documents, settings.workspaces
    store = memory if memory is not None else memory_store(settings)
    embedder = build_embedder(settings.file.memory.embeddings)
    tools = default_registry(
        documents=DocumentLimits(docs.max_bytes, docs.memory_mb, docs.timeout_s, docs.max_output_chars),
        sandbox=startup_choice(settings).sandbox,
        shell=shell_options(settings.sandbox),
        skills=SkillLibrary(SkillStore(settings.data_path / "skills")),
        egress=egress,
        tables=tables if tables is not None else TableConnections(settings.file.agents),
        agents=settings.file.agents,
        search=rest,
        images=images,
        memory=(store, connected or settings.file.connected_projects),
        embedder=embedder,
    )
    for tool in knowledge_tools(store, lambda: settings.file.agents, embedder):
        tools.register(tool)
    try:
        register_rest_tools(tools, settings, rest)
    except ValueError as err:
        raise ConfigError(str(err), field="rest_tools") from None
    if mcp is not None:  # the SDK (and its HTTP stack) loads only when some server is configured
        from switchboard.cli.mcp import pin_store
        from switchboard.core.tools.mcp.tools import mcp_tools

        for tool in mcp_tools(mcp.servers, pin_store(settings), mcp):
            tools.register(tool)
    root = settings.workspace_path
    quotas = Quotas(spaces.session_quota_mb * 2**20, spaces.tenant_quota_mb * 2**20, spaces.total_quota_mb * 2**20)
    workspaces = Workspaces(root, quotas)
    gateway = ToolGateway(
        tools,
        workspace_root=root,
        workspaces=workspaces,
        threads=ThreadShare(spaces.tool_threads, spaces.threads_per_session),
        store=build_workspace_store(settings.workspace_path, settings.workspaces, workspaces),
    )
    return Runtime(
        models=models,
        tools=tools,
        workspace_root=root,
        prices=settings.file.prices,
        default_model=settings.default_model,
        gateway=gateway,
        attachments=attachments,
        parallel_reads=settings.tools.parallel_reads,
        snapshot_key=snapshot_key(
            settings.approval_key.get_secret_value() if settings.approval_key else None, settings.data_path
        ),
    )


def memory_tenants(settings: Settings) -> list[str]:
    """The tenants whose memory a command walks: those of the projects, of the agents (knowledge) and of the rules."""
    found = {project.tenant for project in settings.file.projects.values()}
    found |= {settings.file.agent_tenant(name) or "default" for name in settings.file.agents}
    return sorted(found | set(settings.file.retention.tenants))


def retention_reaches_memory(settings: Settings) -> bool:
    """Whether some retention rule bounds memory or knowledge (only then is the memory store needed)."""
    config = settings.file.retention
    return any(
        getattr(rules, kind) is not None
        for rules in (config.defaults, *config.tenants.values())
        for kind in ("memory", "knowledge")
    )


def retention_plan(
    settings: Settings, workspace_store: WorkspaceStore | None = None, memory: ConfiguredStore | None = None
) -> RetentionPlan:
    """The YAML file's retention rules over this deployment's stores.

    The memory store (``memory``, else the configured one) is used only for a memory or knowledge rule; the tenants of
    the projects are looked at even when Redis holds nothing of them.
    """
    from switchboard.core.workspaces.store import LocalWorkspaces
    from switchboard.queue.retention import RetentionPlan

    return RetentionPlan(
        settings.file.retention,
        workspaces=workspace_store or LocalWorkspaces(settings.workspace_path),
        memory=(memory or memory_store(settings)) if retention_reaches_memory(settings) else None,
        tenants=tuple(memory_tenants(settings)),
    )


def image_provider(settings: Settings) -> ImageProvider | None:
    """OpenAI's Images API when some agent lists ``generate_image`` (the SDK loads only then)."""
    if not any("generate_image" in agent.tools for agent in settings.file.agents.values()):
        return None
    from switchboard.core.providers.images import OpenAIImages

    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    return OpenAIImages(api_key=key, base_url=settings.openai_base_url)


def _rest_forwarder(settings: Settings, redis: aioredis.Redis, egress: SandboxEgress | None) -> Forwarder | None:
    """The egress forwarder REST tools, search APIs and knowledge URLs go through: the sandbox proxy's, else its own.

    None without declarations, searches, knowledge URLs and a YAML file to add them to (declarations are reloaded
    while it runs).
    """
    agents = settings.file.agents.values()
    searches = any("web_search" in agent.tools and agent.search.provider != "hosted" for agent in agents)
    pages = any(s.url is not None for agent in agents if agent.knowledge for s in agent.knowledge.sources)
    declared = settings.file.rest_tools or any(agent.rest_tools for agent in agents) or searches or pages
    if not declared and not settings.config.is_file():
        return None
    if egress is not None and egress.proxy is not None:
        return egress.proxy.forwarder
    from switchboard.egress import forward
    from switchboard.egress.events import RedisEgressSink
    from switchboard.egress.policy import EgressPolicy

    sink = RedisEgressSink(redis, maxlen=settings.queue.events_maxlen)
    return forward.Forwarder(EgressPolicy.from_settings(settings), settings.egress, sink)


async def run_worker(settings: Settings, stop: asyncio.Event) -> None:
    """Run one worker process until ``stop`` is set.

    When some agent has an egress allowlist and commands run under bubblewrap, the worker runs its own egress
    proxy (:mod:`switchboard.egress.gate`), closed when the worker stops.
    """
    from switchboard.cli.knowledge import keep_knowledge_indexed
    from switchboard.egress.addresses import AddressGuard
    from switchboard.egress.gate import start_sandbox_egress
    from switchboard.egress.sockets import guarded_http_client
    from switchboard.egress.transport import EgressTransport
    from switchboard.worker.declarations import RestDeclarations
    from switchboard.worker.projects import LiveConnections

    assert settings.redis_url is not None
    store = memory_store(settings)
    await open_store(store)  # first, holding nothing yet: a PostgreSQL server without pgvector stops the worker here
    redis = as_redis(async_client(settings.redis_url))
    publisher = WebStreamPublisher(redis, max_bytes=settings.limits.web_history_kib * 1024)
    uploads = UploadStore(redis, timeout_s=30.0)  # the web chat's files (up to the attachment cap each)
    channels = ChannelSet(
        build_channels(settings, publish=publisher.publish, read_upload=uploads.read), send_rates(settings)
    )
    models = ModelFactory(provider_config(settings))
    attachments = attachment_support(settings, channels)
    egress = await start_sandbox_egress(settings, redis, startup_choice(settings).sandbox)
    forwarder = _rest_forwarder(settings, redis, egress)
    mcp: McpClients | None = None
    if settings.file.mcp_servers:
        from switchboard.cli.mcp import mcp_secrets, sandbox_host
        from switchboard.core.tools.mcp.client import McpClients

        guard = AddressGuard(settings.egress.internal_networks)
        mcp = McpClients(
            settings.file.mcp_servers,
            http_client=functools.partial(guarded_http_client, guard),
            host=sandbox_host(settings, egress),
            secrets=mcp_secrets(settings),
        )
    rest = EgressTransport(forwarder) if forwarder else None
    tables = TableConnections(settings.file.agents)
    images = image_provider(settings)
    connected = LiveConnections(settings.file, redis)
    runtime = build_runtime(settings, models, attachments, egress, rest, mcp, tables, images, store, connected)
    declarations = RestDeclarations(runtime.registry, settings, rest)
    indexing = asyncio.create_task(keep_knowledge_indexed(settings, store, models, forwarder, stop))
    await channels.start()
    try:
        await run_session_worker(
            settings,
            connected.wrap(declarations.wrap(runtime.run_turn)),
            channels,
            None,
            stop,
            workspace_store=runtime.gateway.store,
            retention=(
                retention_plan(settings, runtime.gateway.store, store) if settings.file.retention.active else None
            ),
        )
    finally:
        indexing.cancel()
        await asyncio.gather(indexing, return_exceptions=True)
        await tables.close()  # the PostgreSQL pools
        if mcp is not None:
            await mcp.aclose()
        if images is not None:
            await images.aclose()
        if egress is not None:
            await egress.close()
        if forwarder is not None and (egress is None or egress.proxy is None):
            await forwarder.close()
        await runtime.gateway.store.aclose()
        await close_store(store)
        await channels.aclose()
        await models.aclose()
        if isinstance(attachments.transcriber, OpenAITranscriber):
            await attachments.transcriber.aclose()
        await redis.aclose()
