"""The Agent: a configuration over the shared runtime, loaded from the YAML file."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from switchboard.core.agent.taskclass import ModelRouting, TaskClass
from switchboard.core.approvals.policy import PolicyConfig
from switchboard.core.knowledge.config import KnowledgeConfig, knowledge_project
from switchboard.core.memory.facts import check_name
from switchboard.core.routing import HandoffConfig
from switchboard.core.sql.databases import AgentDatabases
from switchboard.core.tables.config import ConnectedTable, PostgresDatabase, check_table_databases
from switchboard.core.tools.egress import AgentEgress
from switchboard.core.tools.mcp.config import AgentMcp
from switchboard.core.tools.rest.declaration import RestToolSpec
from switchboard.core.tools.web.config import ImageGeneration, WebSearch
from switchboard.skills.package import check_pins
from switchboard.types import BusyPolicy

__all__ = ["Agent", "AgentLimits", "AgentPolicy", "AgentProfile", "AgentStatus", "AgentVoice", "Starter", "VoiceMode"]

AgentStatus = Literal["draft", "ready"]


class Starter(BaseModel):
    """A message a new conversation may start with, and the short label its button shows."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(min_length=1, max_length=80)
    text: str = Field(min_length=1, max_length=2000)


def _starter(value: object) -> object:
    """A bare string is its own label (cut to the label's length)."""
    if isinstance(value, str):
        return {"label": value if len(value) <= 80 else value[:79] + "…", "text": value}
    return value


class AgentProfile(BaseModel):
    """Who the agent is, as users see it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    starters: list[Annotated[Starter, BeforeValidator(_starter)]] = Field(default_factory=list, max_length=8)
    """Messages a new conversation may start with (``{label, text}``, or a string that is both): the web chat's empty
    state offers them as buttons."""


class AgentLimits(BaseModel):
    """Budgets of one turn (docs/ARCHITECTURE.md §3.6): nothing unbounded wraps a model call."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(8, ge=1, le=1000)
    """Model decisions per turn; at the budget one last turn without tools answers the user."""
    deadline_s: float = Field(120.0, gt=0)
    """Wall-clock budget of one turn."""
    max_output_chars: int = Field(40_000, ge=1)
    """Longest reply the agent may send in one turn; a longer one is cut with a notice saying so. The default
    holds five full-length model steps (2,048 tokens, ~8,000 characters each), about ten Telegram messages."""
    max_input_tokens: int = Field(32_000, ge=256)
    """Context budget: the most the model is ever sent in one request."""
    max_output_tokens: int = Field(2_048, ge=16)
    """Most tokens a model may write in one step."""
    max_credits: float | None = Field(None, ge=0)
    """Credits one turn may spend (``None``: unmetered)."""
    max_tool_calls: int = Field(64, ge=0)
    """Tool calls per turn."""
    max_turn_tokens: int | None = Field(None, ge=256)
    """Input plus output tokens over one whole turn (``None``: bounded by the step budget only)."""


VoiceMode = Literal["off", "on_request", "when_spoken_to", "always"]
"""When a reply is also sent as a voice note: never; when the conversation asked (``/voice on``); when the user sent a
voice note (or asked); every reply (unless the conversation said ``/voice off``)."""


def _yaml_off(value: object) -> object:
    """YAML reads a bare ``off`` as ``false``: take it as the ``off`` it was written as."""
    return "off" if value is False else value


class AgentVoice(BaseModel):
    """Voice replies: the turn's text reply also spoken, as a voice note where the channel has one (docs/voice.md)."""

    model_config = ConfigDict(extra="forbid")

    mode: Annotated[VoiceMode, BeforeValidator(_yaml_off)] = "off"
    """``off`` costs nothing (``/voice`` then says voice replies are not available)."""
    model: str = Field("gpt-4o-mini-tts", min_length=1)
    """OpenAI speech model (needs ``OPENAI_API_KEY``; ``OPENAI_BASE_URL`` for a compatible server)."""
    voice: str = Field("alloy", min_length=1)
    """The speaker (``alloy``, ``coral``, ``nova``, ...)."""
    max_chars: int = Field(1000, ge=1, le=4096)
    """Longest text spoken: a longer reply is not spoken at all (it goes out as text alone); 4,096 is OpenAI's cap."""
    timeout_s: float = Field(30.0, gt=0, le=300)
    """How long the speech request may take before the reply stays text only."""


AgentPolicy = PolicyConfig
"""An agent's ``policy:`` block: its rules, mode, approvals and grants (see
:mod:`switchboard.core.approvals.policy`)."""


class Agent(BaseModel):
    """One agent: profile, instructions, model, tools and limits over the shared runtime."""

    model_config = ConfigDict(extra="forbid")

    name: str
    profile: AgentProfile | None = None
    instructions: str = ""
    model: str | None = None
    """``provider:name`` (``offline``, ``openai:gpt-4.1-mini``, ``anthropic:...``); ``None`` uses the default."""
    models: ModelRouting | None = None
    """A small and a strong model, routed per step (``docs/routing.md``); ``None``: ``model`` runs every step."""
    task_classes: dict[str, TaskClass] = Field(default_factory=dict)
    """Kinds of work by name, each with its budgets and matching rule, tried in order (``docs/budgets.md``)."""
    task_classifier: Literal["rules", "model"] = "rules"
    """``model``: a turn no rule matches is classified by the small model (or the agent's own) from the classes'
    descriptions; ``rules``: by the rules alone."""
    models_allowed: list[str] = Field(default_factory=list)
    """Models ``/model <name>`` may switch one conversation to (``provider:name``); empty: ``/model`` only shows the
    model."""
    handoff: HandoffConfig | None = None
    """To which agents it may hand a conversation with the ``handoff`` tool, and what they see of it (``None``: it
    may not hand over)."""
    tools: list[str] = Field(default_factory=lambda: ["current_time"])
    connectors: list[str] = Field(default_factory=list)
    """Connector packs switched on (``docs/connectors.md``): their operations are added to ``tools`` (or ``mcp``),
    their hosts to ``egress.allow`` and their write rules to ``policy`` when the file loads."""
    mcp: list[AgentMcp] = Field(default_factory=list)
    """MCP servers (of the file's ``mcp_servers``) whose accepted tools the agent may call, each with an optional
    allowlist: ``[docs, {server: tickets, tools: [search]}]``; the tools are named ``<server>__<tool>``."""
    limits: AgentLimits = Field(default_factory=AgentLimits)
    busy_policy: BusyPolicy = "sequential"
    codeact: bool = False
    """Let the model answer with a program that calls tools as functions."""
    vision: bool | None = None
    """The model takes image input (images the user sends are shown to it); ``None``: known vision models do."""
    prompt_cache: bool = True
    """Ask the provider to cache the stable prefix of its requests (``docs/caching.md``); ``false`` for a server that
    refuses ``prompt_cache_key`` or ``cache_control``."""
    policy: AgentPolicy = Field(default_factory=AgentPolicy)
    """What the agent may do on its own, outside what the model decides: rules, mode, approvals, grants."""
    egress: AgentEgress = Field(default_factory=AgentEgress)
    """Hosts the agent's sandboxes and tools may reach, and the secrets injected for them."""
    rest_tools: list[RestToolSpec] = Field(default_factory=list)
    """REST operations declared for this agent alone (``docs/rest-tools.md``), offered to it without listing them in
    ``tools``; each host must be in its egress allowlist."""
    databases: AgentDatabases = Field(default_factory=dict)
    """Shared read-only SQLite databases its ``sql`` tool reads, by name (see :mod:`switchboard.core.sql.databases`)."""
    postgres: dict[str, PostgresDatabase] = Field(default_factory=dict)
    """PostgreSQL databases its connected tables may live in, by name."""
    tables: dict[str, ConnectedTable] = Field(default_factory=dict)
    """Connected tables by the reference the model names, each with its permission (see
    :mod:`switchboard.core.tables.config`); the table tools they enable are added to its tools."""
    projects: list[str] = Field(default_factory=list)
    """Memory projects (of the file's ``projects:``) it is connected to: it gets ``remember``, ``recall``, ``link``,
    ``correct`` and ``forget`` over their facts (``docs/memory.md``)."""
    knowledge: KnowledgeConfig | None = None
    """Files and URLs indexed for it (read-only): it gets ``search_knowledge`` and ``read_source`` over them
    (``docs/memory.md``, Knowledge)."""
    skills: Annotated[list[str], AfterValidator(check_pins)] = Field(default_factory=list)
    """Skills the agent may load, ``name`` or ``name@version``; their names and descriptions are in its context."""
    compaction: Literal["deterministic", "native"] = "deterministic"
    """How long runs are fitted into the context: ``native`` uses the provider's own compaction where it has one
    (OpenAI's Responses API), falling back to the deterministic record whenever it is unavailable or fails."""
    voice: AgentVoice = Field(default_factory=AgentVoice)
    """Voice replies (off by default)."""
    shell: Literal["local", "hosted"] = "local"
    """Where shell commands run: ``local`` (the ``shell`` tool in the session's sandbox) or ``hosted`` (OpenAI's
    hosted container through the Responses API; the local ``shell`` tool is then not offered)."""
    search: WebSearch = Field(default_factory=WebSearch)
    """Who answers its ``web_search``: the model provider's hosted search, or a search API through egress."""
    images: ImageGeneration = Field(default_factory=ImageGeneration)
    """How its ``generate_image`` draws (the image model, size and quality)."""

    @model_validator(mode="after")
    def _search_key_is_a_secret(self) -> Agent:
        name = self.search.api_key_secret
        if name is not None and name.upper() not in self.egress.secrets:
            raise ValueError(
                f"search.api_key_secret {name!r} is not one of its egress secrets: add egress.secrets.{name.upper()} "
                "(the environment variable holding the key, and the search API's host in its domains)"
            )
        return self

    @model_validator(mode="after")
    def _classifier_has_classes(self) -> Agent:
        if self.task_classifier == "model" and not self.task_classes:
            raise ValueError(
                "task_classifier: model needs task_classes to choose from (declare them, with a description)"
            )
        return self

    @model_validator(mode="after")
    def _tables_have_databases(self) -> Agent:
        problems = check_table_databases(self.tables, self.databases, self.postgres)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _knowledge_project_named(self) -> Agent:
        if self.knowledge is not None:
            try:
                check_name(knowledge_project(self.name), "knowledge project")
            except ValueError:
                raise ValueError(
                    f"agent {self.name!r} has knowledge, which lives in the project {knowledge_project(self.name)!r}: "
                    "rename the agent to letters, digits, '_', '.' and '-' (at most 54)"
                ) from None
        return self

    @property
    def status(self) -> AgentStatus:
        """``ready`` once the agent has a profile and instructions, else ``draft``."""
        return "ready" if self.profile is not None and self.instructions.strip() else "draft"

    def missing(self) -> list[str]:
        """What keeps the agent in draft (``profile``, ``instructions``); empty when it is ready."""
        found = [] if self.profile is not None else ["profile"]
        return found if self.instructions.strip() else [*found, "instructions"]

    def draft_notice(self) -> str:
        """What a user who writes to this agent while it is a draft is told (a draft is never served)."""
        return (
            f"This agent is not ready yet (draft): it has no {' and no '.join(self.missing())}. "
            "Its operator has been told; please try again later."
        )

    def problems(self) -> list[str]:
        """What keeps the agent in draft, in words an operator can act on."""
        found: list[str] = []
        if self.profile is None:
            found.append(f"agent {self.name!r} has no profile: add `profile: {{name: ...}}` in the YAML file")
        if not self.instructions.strip():
            found.append(f"agent {self.name!r} has no instructions: add `instructions: ...` in the YAML file")
        return found
