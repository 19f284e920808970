"""Settings: secrets and deployment from the environment, agents and channel options from YAML.

Environment variables use the prefix ``SWITCHBOARD_`` and the nested delimiter ``__``
(``SWITCHBOARD_TELEGRAM__BOT_TOKEN``); provider keys keep the names the official SDKs use
(``OPENAI_API_KEY``). Read once at the entry point (:func:`load_settings`) and passed down.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from switchboard.core.agent.config import Agent
from switchboard.core.approvals.policy import TenantConfig
from switchboard.core.budgets import BudgetRule, IdentityConfig
from switchboard.core.commands import COMMAND_NAME_PATTERN, CommandRule
from switchboard.core.connectors import expand_connectors
from switchboard.core.memory.config import MemoryConfig
from switchboard.core.memory.facts import ProjectConfig, check_name
from switchboard.core.retention import RetentionConfig
from switchboard.core.routing import RoutingRule
from switchboard.core.schedules import ScheduleSpec
from switchboard.core.tools.mcp.config import SERVER_NAME_PATTERN, McpServer
from switchboard.core.tools.rest.declaration import RestToolSpec
from switchboard.core.workspaces.config import WorkspaceS3Settings, WorkspaceSettings
from switchboard.errors import ConfigError
from switchboard.settings.api import ApiConfig, WebhookSettings
from switchboard.settings.channels import ChannelAccount, ChannelOptions, ChannelSettings
from switchboard.settings.cluster import is_cluster_url, parse_cluster_url
from switchboard.settings.computer import (
    EgressSecret,
    EgressSettings,
    SandboxSettings,
)
from switchboard.settings.console import ConsoleConfig, ConsoleSettings
from switchboard.settings.evals import EvalSettings
from switchboard.settings.mcpserve import McpServeSettings
from switchboard.settings.proxies import TrustedProxies, parse_trusted_proxies
from switchboard.settings.sentinel import is_sentinel_url, parse_sentinel_url

__all__ = [
    "AttachmentSettings",
    "ChannelAccount",
    "ChannelOptions",
    "ChannelSettings",
    "DocumentSettings",
    "EgressSecret",
    "EgressSettings",
    "FileConfig",
    "HttpSettings",
    "LimitsSettings",
    "QueueSettings",
    "SandboxSettings",
    "Settings",
    "ToolSettings",
    "TranscriptionSettings",
    "WorkspaceS3Settings",
    "WorkspaceSettings",
    "load_settings",
]


class QueueSettings(BaseModel):
    """``SWITCHBOARD_QUEUE__*``: the session queue's timings (seconds unless named ``_ms``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = "switchboard"
    """The one RQ queue every worker listens on."""
    lease_ms: int = Field(15_000, ge=500)
    """Session lease TTL; a worker heartbeats it every third of this."""
    reaper_interval_s: float = Field(2.0, gt=0)
    """How often the reaper sweeps for stranded sessions."""
    max_attempts: int = Field(3, ge=1)
    """Attempts per message before it is dead-lettered."""
    retry_backoff_s: float = Field(0.5, ge=0)
    """Wait before retrying a failed attempt (doubled each attempt)."""
    concurrency: int = Field(64, ge=1)
    """Session drains one worker process runs at once."""
    fair_turns: int = Field(1, ge=0)
    """Turns a session runs in a row while other sessions wait for a slot; then it yields the slot and goes to
    the back of the queue, keeping its own order (0: never yield)."""
    fair_slice_s: float = Field(0.0, ge=0)
    """Also yield (between turns) once a session has held its slot this long while others wait (0: off)."""
    worker_heartbeat_ms: int = Field(1000, ge=50)
    """How often a worker proves it is alive (at most a third of ``lease_ms``); one silent for three of these is
    dead and its sessions are taken over at once (the lease still fences it, should it come back)."""
    dedup_ttl_s: int = Field(8 * 24 * 3600, ge=24 * 3600)
    """How long platform event ids are remembered (≥ 24 h; WhatsApp retries for up to 7 days)."""
    ingest_timeout_s: float = Field(2.0, gt=0)
    """Answer 503 when Redis has not confirmed an ingest within this time."""
    ack_replicas: int = Field(0, ge=0)
    """Replicas that must have a message before it is answered 2xx (``WAIT``); fewer within ``ack_timeout_ms`` is
    answered 503 with ``Retry-After`` (0: answer once the primary has it, one command less per message)."""
    ack_timeout_ms: int = Field(500, ge=1)
    """How long ``ack_replicas`` waits for the replicas before answering 503."""
    max_body_bytes: int = Field(1024 * 1024, ge=1024)
    """Webhook bodies over this are refused with 413 before any parsing."""
    events_maxlen: int = Field(2_000, ge=100)
    """Approximate cap of each session's event log."""
    history_maxlen: int = Field(200, ge=10)
    """Conversation entries kept per session."""
    send_max_attempts: int = Field(5, ge=1)
    """Attempts at delivering a finished turn's reply before the send is dead-lettered (the model is not re-run)."""
    send_backoff_s: float = Field(1.0, ge=0)
    """Wait before re-trying a reply the platform failed to take (doubled each attempt; a 429's wait wins)."""
    stream_after_s: float = Field(0.5, ge=0)
    """A reply starts streaming into its message (a native stream, or a preview edited as it grows) once it has
    been written for this long; one finished sooner is sent once, whole (0: stream from its first piece)."""
    delta_every_s: float = Field(0.05, ge=0)
    """The web chat's streamed pieces of a reply are sent at most this often, those written in between together
    (0: each as it is written)."""
    max_defer_s: float = Field(3600.0, ge=0)
    """Longest wait a model provider's ``retry-after`` may defer a turn by (a longer one fails the message), and
    longest platform ``retry_after`` a reply's send waits out (a longer one dead-letters the send)."""
    schedule_poll_s: float = Field(1.0, gt=0, le=86_400)
    """How often each worker looks for due scheduled jobs (an occurrence runs at most about this late)."""
    schedules_per_session: int = Field(20, ge=0)
    """Most scheduled jobs one session may hold (what an agent's own ``schedule_*`` calls can create; 0: no cap)."""


class HttpSettings(BaseModel):
    """``SWITCHBOARD_HTTP__*``: how long the web tier waits on a client, and how many connections it holds."""

    model_config = ConfigDict(extra="forbid")

    header_timeout_s: float = Field(10.0, gt=0)
    """A request's line and headers must arrive within this of the connection opening or going idle."""
    body_timeout_s: float = Field(30.0, gt=0)
    """A request's body must have arrived within this of its headers."""
    keepalive_timeout_s: float = Field(75.0, gt=0)
    """An idle keep-alive connection is closed after this."""
    max_connections: int = Field(10_000, ge=1)
    """Open connections; past it the oldest idle one is closed (or, with none idle, the new one)."""


class ToolSettings(BaseModel):
    """``SWITCHBOARD_TOOLS__*``: how the agent runtime runs the tool calls of one model step."""

    model_config = ConfigDict(extra="forbid")

    parallel_reads: int = Field(4, ge=1, le=64)
    """Read-only calls of one step that run at the same time (a write between them waits for them and runs
    alone); 1 runs every call one after another."""


class DocumentSettings(BaseModel):
    """``SWITCHBOARD_DOCUMENTS__*``: bounds of ``read_document`` (each parse runs in a limited child process)."""

    model_config = ConfigDict(extra="forbid")

    max_bytes: int = Field(25 * 2**20, ge=1024)
    """Largest document read at all."""
    memory_mb: int = Field(512, ge=128)
    """Address space of the parsing child; a document that needs more is refused."""
    timeout_s: float = Field(20.0, gt=0)
    """Deadline of one parse; the child is killed when it passes."""
    max_output_chars: int = Field(100_000, ge=1000)
    """Longest text one read returns."""


class AttachmentSettings(BaseModel):
    """``SWITCHBOARD_ATTACHMENTS__*``: the files users send, fetched into the session workspace before a turn."""

    model_config = ConfigDict(extra="forbid")

    max_bytes: int = Field(20 * 2**20, ge=1024)
    """Largest file fetched; a bigger one reaches the model as a note (\"too large\"), never as a failed turn."""
    max_count: int = Field(10, ge=0)
    """Most files fetched per turn (the rest become a note)."""


class TranscriptionSettings(BaseModel):
    """``SWITCHBOARD_TRANSCRIPTION__*``: voice notes to text through OpenAI's audio API (at ``OPENAI_BASE_URL``)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    """Transcription model (``gpt-4o-mini-transcribe``, ``whisper-1``); unset: that default when
    ``OPENAI_API_KEY`` is set, else off; ``off``: never transcribe."""


class OfflineSettings(BaseModel):
    """``SWITCHBOARD_OFFLINE__*``: the deterministic offline model."""

    model_config = ConfigDict(extra="forbid")

    delay_ms: int = Field(0, ge=0)
    """Per-answer delay, so the offline model can stand in for a slow model in load tests."""


class LimitsSettings(BaseModel):
    """``SWITCHBOARD_LIMITS__*``: abuse limits, counted in Redis and shared by every process; ``0`` = no limit.

    Over a limit the web chat answers 429 with ``Retry-After`` and writes nothing; a platform webhook still
    answers 2xx (the platform would only retry) and the drop is recorded as an event and a metric.
    """

    model_config = ConfigDict(extra="forbid")

    sessions_per_address_per_hour: int = Field(60, ge=0)
    """Web chat sessions one client address may create per hour."""
    messages_per_session_per_minute: int = Field(30, ge=0)
    """Messages one session accepts per minute (every sender together)."""
    messages_per_sender_per_minute: int = Field(60, ge=0)
    """Messages one sender (platform user, web chat session) may send per minute, across sessions."""
    inbox_depth: int = Field(100, ge=0)
    """Messages waiting in one session's inbox; with the 32 KiB text cap this bounds a session's queued bytes."""
    streams_per_session: int = Field(5, ge=0)
    """Open event streams (SSE) per web chat session."""
    streams_per_address: int = Field(20, ge=0)
    """Open event streams (SSE) per client address."""
    idle_session_ttl_s: int = Field(30 * 24 * 3600, ge=0)
    """A web chat session's retained conversation (inbox, history, events, web stream, state) is deleted this long
    after its last activity (a message in, a turn started or ended), like its token; ``0`` keeps it forever."""
    web_history_kib: int = Field(4096, ge=0)
    """Most a web chat session's retained web stream (what a reload replays) may hold, besides its cap of about
    1,000 entries; the oldest entries go first (``0``: only the entry cap)."""


class FileConfig(BaseModel):
    """The YAML file: agents, channels' non-secret options, defaults."""

    model_config = ConfigDict(extra="forbid")

    tenant: str = "default"
    default_agent: str = "assistant"
    agents: dict[str, Agent] = Field(default_factory=dict)
    mcp_servers: dict[Annotated[str, StringConstraints(pattern=SERVER_NAME_PATTERN)], McpServer] = Field(
        default_factory=dict
    )
    """MCP servers agents may connect (``docs/mcp.md``): ``{name: {transport: stdio, command: [...]}}`` or
    ``{name: {transport: http, url: ...}}``."""
    channels: dict[str, ChannelOptions] = Field(default_factory=dict)
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)
    """Per-tenant blocks: ``tenants.<name>.policy`` (rules, mode, approvals, grants;
    ``switchboard.core.approvals.policy``)."""
    prices: dict[str, dict[str, Annotated[float, Field(ge=0, allow_inf_nan=False)]]] = Field(default_factory=dict)
    """Credits per 1,000 tokens by model: ``{"openai:gpt-4.1-mini": {"input": 0.4, "output": 1.6}}``; a speech
    model's per 1,000 characters spoken: ``{"openai:gpt-4o-mini-tts": {"characters": 15}}``."""
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)
    """The operator console's operators (``console.operators``)."""
    api: ApiConfig = Field(default_factory=ApiConfig)
    """The integration API's tokens and outbound webhooks (``api.tokens``, ``api.webhooks``)."""
    budgets: tuple[BudgetRule, ...] = ()
    """Credits per tenant, agent or user per day or month (``docs/budgets.md``); none: nothing is counted."""
    identity: IdentityConfig = Field(default_factory=IdentityConfig)
    """Linking one person's accounts across channels (``docs/identity.md``)."""
    rest_tools: list[RestToolSpec] = Field(default_factory=list)
    """REST operations any agent may list in its ``tools`` (``docs/rest-tools.md``); an agent's own go under
    ``agents.<name>.rest_tools``."""
    projects: dict[str, ProjectConfig] = Field(default_factory=dict)
    """Memory projects by name, each of one tenant (``docs/memory.md``); agents connect with
    ``agents.<name>.projects``."""
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    """How long each kind of data is kept, by default and per tenant (``docs/operations/retention.md``); no rule:
    kept as it is."""
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    """Where projects' facts are stored and how they are embedded (``docs/memory.md``); default: SQLite files and
    the local embedder."""
    connectors: dict[str, dict[str, Any] | None] = Field(default_factory=dict)
    """Connector packs' settings by pack (``docs/connectors.md``): ``{tracker: {repo: acme/shop, token:
    TRACKER_TOKEN}}``; agents switch packs on with ``agents.<name>.connectors``."""

    @model_validator(mode="after")
    def _rest_names(self) -> FileConfig:
        owners: dict[str, str] = {}
        declared = [("rest_tools", spec.name) for spec in self.rest_tools] + [
            (f"agents.{name}.rest_tools", spec.name) for name, agent in self.agents.items() for spec in agent.rest_tools
        ]
        for where, tool in declared:
            if tool in owners:
                raise ValueError(f"{where}: the REST tool {tool!r} is also declared in {owners[tool]}; rename one")
            owners[tool] = where
        for name, agent in self.agents.items():
            for tool in agent.tools:
                owner = owners.get(tool, "rest_tools")
                if owner != "rest_tools" and owner != f"agents.{name}.rest_tools":
                    raise ValueError(f"agents.{name}.tools lists {tool!r}, a REST tool of another agent ({owner})")
        return self

    @model_validator(mode="after")
    def _projects_defined(self) -> FileConfig:
        for name in self.projects:
            check_name(name, "project")
        defined = ", ".join(sorted(self.projects)) or "none"
        for name, agent in self.agents.items():
            for project in agent.projects:
                if project not in self.projects:
                    raise ValueError(
                        f"agents.{name}.projects names {project!r}, which is not defined under projects "
                        f"(defined: {defined})"
                    )
        return self

    def connected_projects(self, agent: str, tenant: str) -> list[str]:
        """The projects ``agent`` is connected to that belong to ``tenant`` (none for an unknown agent)."""
        found = self.agents.get(agent)
        if found is None:
            return []
        return [name for name in found.projects if name in self.projects and self.projects[name].tenant == tenant]

    @model_validator(mode="after")
    def _one_budget_per_counter(self) -> FileConfig:
        seen: dict[tuple[str | None, ...], int] = {}
        for index, rule in enumerate(self.budgets):
            key = (rule.scope, rule.period, rule.tenant, rule.agent, rule.user)
            if key in seen:
                raise ValueError(
                    f"budgets[{index}] counts the same thing as budgets[{seen[key]}] "
                    f"({rule.scope}, {rule.period}): merge them into one rule"
                )
            seen[key] = index
        return self

    routing: list[RoutingRule] = Field(default_factory=list)
    """Bindings of messages to agents, first match wins (``docs/routing.md``); none: each account's agent."""
    commands: dict[Annotated[str, StringConstraints(pattern=COMMAND_NAME_PATTERN)], CommandRule] = Field(
        default_factory=dict
    )
    """Who may use each chat command, and the descriptions of your own (``docs/commands.md``)."""

    schedules: list[ScheduleSpec] = Field(default_factory=list)
    """Operators' scheduled jobs (``docs/schedules.md``): each worker keeps Redis in step with this list at start."""

    @model_validator(mode="after")
    def _unique_schedules(self) -> FileConfig:
        seen: set[str] = set()
        for index, job in enumerate(self.schedules):
            if job.id in seen:
                raise ValueError(f"schedules[{index}]: the id {job.id!r} is used twice; give each job its own id")
            seen.add(job.id)
        return self

    def hidden_commands(self) -> frozenset[str]:
        """Built-in commands left out of menus and ``/help``: nothing here serves them.

        ``/link`` without self-service identity linking, ``/voice`` when no agent speaks.
        """
        hidden = set() if self.identity.self_link else {"link"}
        if all(agent.voice.mode == "off" for agent in self.agents.values()):
            hidden.add("voice")
        return frozenset(hidden)

    _agent_tenants: dict[str, str] = PrivateAttr(default_factory=dict)

    def agent_tenant(self, name: str) -> str | None:
        """The tenant an accepted agent (``agents.d/<tenant>/``) belongs to; ``None`` for the YAML file's agents."""
        return self._agent_tenants.get(name)

    def agent(self, name: str | None) -> Agent:
        """The named agent, or the default one."""
        key = name or self.default_agent
        try:
            return self.agents[key]
        except KeyError:
            known = ", ".join(sorted(self.agents)) or "none"
            raise ConfigError(f"unknown agent {key!r} (defined: {known})", field=f"agents.{key}") from None


def _check_agents_named(cfg: FileConfig, path: Path) -> None:
    """Every agent ``routing`` and ``handoff`` blocks name is defined, and every MCP server agents name.

    Raises:
        ConfigError: one names an agent that is not.
    """
    defined = ", ".join(sorted(cfg.agents))
    for index, rule in enumerate(cfg.routing):
        if rule.agent not in cfg.agents:
            raise ConfigError(
                f"{path}: routing[{index}] sends messages to agent {rule.agent!r}, which is not defined under agents "
                f"(defined: {defined})",
                field=f"routing.{index}.agent",
            )
    for name, agent in cfg.agents.items():
        for index, entry in enumerate(agent.mcp):
            if entry.server not in cfg.mcp_servers:
                servers = ", ".join(sorted(cfg.mcp_servers)) or "none"
                raise ConfigError(
                    f"{path}: agents.{name}.mcp[{index}] names the MCP server {entry.server!r}, which is not defined "
                    f"under mcp_servers (defined: {servers})",
                    field=f"agents.{name}.mcp.{index}.server",
                )
        if "handoff" in agent.tools and agent.handoff is None:
            raise ConfigError(
                f"{path}: agents.{name} has the handoff tool but no handoff block: add "
                "`handoff: {to: [<agent>, ...]}` naming whom it may hand conversations to",
                field=f"agents.{name}.handoff",
            )
        for target in agent.handoff.to if agent.handoff is not None else ():
            if target not in cfg.agents or target == name:
                why = "itself" if target == name else "an agent that is not defined"
                raise ConfigError(
                    f"{path}: agents.{name}.handoff.to names {target!r}, {why} (defined: {defined})",
                    field=f"agents.{name}.handoff.to",
                )


def _default_agents() -> dict[str, Agent]:
    from switchboard.core.agent.config import AgentProfile

    return {
        "assistant": Agent(
            name="assistant",
            profile=AgentProfile(name="Assistant", description="A helpful assistant."),
            instructions="You are a helpful assistant. Answer briefly and clearly.",
        )
    }


class Settings(BaseSettings):
    """Secrets and deployment settings, from the environment (and an optional ``.env`` file)."""

    model_config = SettingsConfigDict(
        env_prefix="SWITCHBOARD_",
        env_nested_delimiter="__",
        env_file=None,
        extra="ignore",
        nested_model_default_partial_update=True,
        hide_input_in_errors=True,  # a bad value can hold a secret (a password in a URL, a token)
    )

    redis_url: str | None = None
    """Redis (or Valkey) to use; unset under ``switchboard run`` starts the embedded server."""
    data_dir: Path = Path(".switchboard")
    """Embedded server data, session workspaces, local indexes (relative to the working directory)."""
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    model: str | None = None
    """Default model, ``provider:name``; unset picks a provider from the keys present, else ``offline``."""
    config: Path = Path("config/switchboard.yaml")
    """The YAML file (``SWITCHBOARD_CONFIG``)."""
    openai_api: Literal["responses", "chat"] | None = None
    """OpenAI wire API; default ``responses`` against OpenAI itself, ``chat`` for other base URLs."""
    log_level: str = "INFO"
    uvloop: bool = True
    """Run on uvloop when it is installed (``SWITCHBOARD_UVLOOP=0`` keeps asyncio's own loop)."""

    openai_api_key: SecretStr | None = Field(None, validation_alias=AliasChoices("OPENAI_API_KEY"))
    openai_base_url: str | None = Field(None, validation_alias=AliasChoices("OPENAI_BASE_URL"))
    anthropic_api_key: SecretStr | None = Field(None, validation_alias=AliasChoices("ANTHROPIC_API_KEY"))
    anthropic_base_url: str | None = Field(None, validation_alias=AliasChoices("ANTHROPIC_BASE_URL"))
    approval_key: SecretStr | None = None
    """Signs CodeAct programs paused for an approval (HMAC-SHA256); unset: a key generated once into
    ``<data dir>/approval-snapshot.key``. Every worker of a deployment needs the same key."""

    queue: QueueSettings = Field(default_factory=QueueSettings)
    offline: OfflineSettings = Field(default_factory=OfflineSettings)
    documents: DocumentSettings = Field(default_factory=DocumentSettings)
    tools: ToolSettings = Field(default_factory=ToolSettings)
    workspaces: WorkspaceSettings = Field(default_factory=WorkspaceSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    attachments: AttachmentSettings = Field(default_factory=AttachmentSettings)
    transcription: TranscriptionSettings = Field(default_factory=TranscriptionSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    egress: EgressSettings = Field(default_factory=EgressSettings)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)
    evals: EvalSettings = Field(default_factory=EvalSettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)
    mcp_serve: McpServeSettings = Field(default_factory=McpServeSettings)
    trusted_proxies: Annotated[TrustedProxies, NoDecode] = ()
    """Comma-separated addresses/CIDRs whose ``X-Forwarded-For`` is believed for the client address."""

    file: FileConfig = Field(default_factory=FileConfig, exclude=True)
    """The parsed YAML file (filled by :func:`load_settings`)."""
    _environ: dict[str, str] = PrivateAttr(default_factory=dict)
    _channel_blocks: dict[str, ChannelSettings] = PrivateAttr(default_factory=dict)

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, v: str | None) -> str | None:
        if v and is_sentinel_url(v):
            parse_sentinel_url(v)  # a clear error now rather than at the first connection
        elif v and is_cluster_url(v):
            parse_cluster_url(v)
        elif v and not v.startswith(("redis://", "rediss://", "unix://", "valkey://", "valkeys://")):
            raise ValueError(
                "must start with redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// "
                "(e.g. redis://localhost:6379/0)"
            )
        return v

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _proxies(cls, v: object) -> object:
        return parse_trusted_proxies(v) if isinstance(v, str) else v

    @property
    def default_model(self) -> str:
        """The model used when an agent names none (docs/ARCHITECTURE.md §10)."""
        if self.model:
            return self.model
        if self.openai_api_key is not None:
            return "openai:gpt-4.1-mini"
        if self.anthropic_api_key is not None:
            return "anthropic:claude-sonnet-4-5"
        return "offline"

    @property
    def openai_wire_api(self) -> Literal["responses", "chat"]:
        """``responses`` against OpenAI itself, ``chat`` when ``OPENAI_BASE_URL`` points elsewhere."""
        if self.openai_api:
            return self.openai_api
        base = self.openai_base_url or ""
        return "responses" if not base or "api.openai.com" in base else "chat"

    def channel_block(self, name: str) -> ChannelSettings | None:
        """A channel's env block set by :meth:`set_channel_block`, else ``None``.

        Channels' blocks are no fields here: the channel registry reads ``SWITCHBOARD_<CHANNEL>__*`` from
        :attr:`environ` with the block class of the channel's folder (``registry.env_block``).
        """
        return self._channel_blocks.get(name)

    def set_channel_block(self, name: str, block: ChannelSettings) -> None:
        """Replace a channel's env block (``switchboard run`` points a channel without credentials at its fake)."""
        self._channel_blocks[name] = block

    @property
    def environ(self) -> Mapping[str, str]:
        """The environment :func:`load_settings` read (empty for settings built otherwise)."""
        return self._environ

    @property
    def data_path(self) -> Path:
        """``data_dir`` resolved against the working directory."""
        return (Path.cwd() / self.data_dir).resolve()

    @property
    def workspace_path(self) -> Path:
        """Where session workspaces (or their working copies) live: ``workspaces.root``, else under the data dir."""
        root = self.workspaces.root
        return (Path.cwd() / root).resolve() if root is not None else self.data_path / "workspaces"


def _format_validation(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for item in err.errors():
        loc = [str(p) for p in item["loc"]]
        if source == "the environment":
            name = ("SWITCHBOARD_" + "__".join(loc)).upper()
            if loc and loc[0].endswith(("_api_key", "_base_url")) and loc[0].startswith(("openai", "anthropic")):
                name = loc[0].upper()
        else:
            name = ".".join(loc)
        lines.append(f"  {name}: {item['msg']}")
    return "\n".join(lines)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def load_settings(env: dict[str, str] | None = None, *, require_file: bool = False) -> Settings:
    """Read the environment and the YAML file once, validate both, and return the settings.

    Raises:
        ConfigError: with a message naming every bad field and how to fix it.
    """
    env_map = dict(os.environ if env is None else env)
    saved = dict(os.environ)
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env_map)
        settings = Settings()
    except ValidationError as err:
        raise ConfigError(_format_validation(err, "the environment")) from None
    except SettingsError as err:  # a block's own variable (SWITCHBOARD_LIMITS=…) that is not a JSON object
        block = str(err).partition('field "')[2].partition('"')[0].upper() or "<BLOCK>"
        suspects = [k for k, v in sorted(env_map.items()) if k.upper().startswith(f"SWITCHBOARD_{block}__") and
                    not _is_json(v)]  # fmt: skip
        if suspects:  # a list or mapping field of the block, written as plain text
            raise ConfigError(
                f"{' or '.join(suspects)} is not valid JSON: write lists and mappings as JSON "
                '(["acme"], {"support": 0.2})'
            ) from None
        raise ConfigError(f"SWITCHBOARD_{block} is not a JSON object: set SWITCHBOARD_{block}__<FIELD>") from None
    finally:
        if env is not None:
            os.environ.clear()
            os.environ.update(saved)
    settings._environ = env_map  # channels read their blocks from it (registry.env_block)
    settings.file = load_file(
        settings.config, required=require_file or "SWITCHBOARD_CONFIG" in env_map, secrets=settings.egress.secrets
    )
    return settings


def _add_accepted(cfg: FileConfig, path: Path) -> None:
    """Add the accepted agents beside the YAML file (``agents.d/<tenant>/<name>.yaml``) to ``cfg``.

    Raises:
        ConfigError: one is invalid, or has the name of an agent of the file.
    """
    from switchboard.settings.accepted import read_accepted

    for name, (tenant, agent) in read_accepted(path).items():
        if name in cfg.agents:
            raise ConfigError(
                f"{path.parent}/agents.d/{tenant}/{name}.yaml: agent {name!r} is also defined in {path}; remove one",
                field=f"agents.{name}",
            )
        cfg.agents[name] = agent
        cfg._agent_tenants[name] = tenant


def load_file(path: Path, *, required: bool = False, secrets: Collection[str] | None = None) -> FileConfig:
    """Parse and validate the YAML file; a missing optional file gives the built-in defaults.

    Connector packs switched on are expanded first (:func:`~switchboard.core.connectors.expand_connectors`);
    ``secrets`` are the egress secrets the environment declares, which a pack's secret setting may name (``None``:
    the environment is not known, so that is not checked).
    """
    if not path.exists():
        if required:
            raise ConfigError(f"config file {path} does not exist: create it or fix SWITCHBOARD_CONFIG", field="config")
        defaults = FileConfig(agents=_default_agents())
        _add_accepted(defaults, path)
        return defaults
    if not path.is_file():
        raise ConfigError(f"config file {path} is not a file: fix SWITCHBOARD_CONFIG", field="config")
    try:
        raw: Any = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}", field="config") from None
    except (UnicodeDecodeError, OSError) as err:
        raise ConfigError(f"{path} is not a readable UTF-8 file ({type(err).__name__})", field="config") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level", field="config")
    for name, body in (raw.get("agents") or {}).items():
        if isinstance(body, dict):
            body.setdefault("name", name)
    raw = expand_connectors(
        raw,
        source=str(path),
        secrets=secrets,
        default_tools=Agent.model_fields["tools"].get_default(call_default_factory=True),
    )
    try:
        cfg = FileConfig.model_validate(raw, context={"config_dir": path.parent})  # relative paths in it
    except ValidationError as err:
        raise ConfigError(_format_validation(err, str(path))) from None
    if not cfg.agents:
        cfg.agents = _default_agents()
    _add_accepted(cfg, path)
    if cfg.default_agent not in cfg.agents:
        raise ConfigError(
            f"{path}: default_agent {cfg.default_agent!r} is not defined under agents "
            f"(defined: {', '.join(sorted(cfg.agents))})",
            field="default_agent",
        )
    _check_agents_named(cfg, path)
    for index, job in enumerate(cfg.schedules):
        if job.target.agent and job.target.agent not in cfg.agents:
            raise ConfigError(
                f"{path}: schedules[{index}] ({job.id}) names agent {job.target.agent!r}, which is not defined under "
                f"agents (defined: {', '.join(sorted(cfg.agents))})",
                field=f"schedules.{index}.target.agent",
            )
    return cfg
