"""The scenario file format of ``switchboard eval`` (``docs/evals.md``).

A scenario file (YAML) holds one scenario or a list of them. Each scenario says where a conversation starts (session
slots, workspace files), what the user sends (one or several turns), which agent answers (inline, or a configured one
with overrides), which model decides (the offline model or scripted steps) and what must hold of the trajectory.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from switchboard.core.agent.config import AgentLimits, AgentPolicy
from switchboard.core.providers import parse_model_spec
from switchboard.core.sql.databases import is_identifier
from switchboard.core.tools.definition import Risk, SideEffect
from switchboard.errors import ConfigError

__all__ = [
    "AgentUnderTest",
    "Check",
    "Criterion",
    "FakeTool",
    "FileSent",
    "InitialState",
    "Invariant",
    "MemoryFact",
    "Message",
    "Obedient",
    "PendingApproval",
    "Rubric",
    "Scenario",
    "ScriptedCall",
    "ScriptedStep",
    "SeedTable",
    "ToolResponse",
    "load_scenarios",
    "read_yaml",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MemoryFact(_Strict):
    """A fact in memory before the first message (``tenant``: the scenario's unless given, to seed another's)."""

    project: str = Field(min_length=1)
    text: str = Field(min_length=1)
    id: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    tenant: str | None = None


class PendingApproval(_Strict):
    """An approval already waiting when the scenario starts (asked in an earlier run of the conversation).

    It is opened as the runtime opens one (signed, bound to the action's hash, the requester the scenario's user),
    so a decision in a later message goes through the production path. ``asked_slots`` stages a *stale* approval
    (the session state it was asked in differs from the seeded one); a negative ``expires_in_s`` an expired one.
    """

    tool: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str = Field("seeded-approval", pattern=r"^[A-Za-z0-9_-]{6,40}$")
    reason: str = "asked in an earlier turn"
    asked_slots: dict[str, Any] | None = None
    """The session slots when it was asked (default: the seeded ``slots``, i.e. not stale)."""
    asked_s_ago: float = Field(60.0, ge=0)
    expires_in_s: float = 3600.0
    """Seconds from the scenario's start until it expires (negative: already expired)."""


class SeedTable(_Strict):
    """A connected table (SQLite) the agent's table tools read and write, with its rows before the first message."""

    columns: list[str] = Field(min_length=1)
    """Its columns (the tenant column, when given, is added)."""
    rows: list[dict[str, Any]] = Field(default_factory=list)
    """Rows by column; a row's ``tenant_column`` value defaults to the scenario's tenant (give another to seed
    another tenant's row)."""
    permission: Literal["read", "write", "full"] = "read"
    tenant_column: str | None = "tenant_id"
    description: str = ""

    @field_validator("columns")
    @classmethod
    def _identifiers(cls, value: list[str]) -> list[str]:
        bad = [c for c in value if not is_identifier(c)]
        if bad:
            raise ValueError(f"column names are plain identifiers (not {', '.join(map(repr, bad))})")
        if len({c.lower() for c in value}) != len(value):
            raise ValueError("a column is named twice")
        return value

    @model_validator(mode="after")
    def _tenant_column(self) -> SeedTable:
        column = self.tenant_column
        if column is not None and (not is_identifier(column) or column.lower() in {c.lower() for c in self.columns}):
            raise ValueError(f"tenant_column {column!r}: a plain identifier, not one of the columns (it is added)")
        return self


class InitialState(_Strict):
    """What the session holds before the first message."""

    slots: dict[str, Any] = Field(default_factory=dict)
    """Session-state slots (``plan``, ``context``, ``state``), as the session store keeps them."""
    files: dict[str, str] = Field(default_factory=dict)
    """Workspace files: relative path → text."""
    facts: list[MemoryFact] = Field(default_factory=list)
    """Memory facts (the agent sees those of its ``projects`` in its own tenant)."""
    approvals: list[PendingApproval] = Field(default_factory=list)
    """Approvals pending before the first message."""
    tables: dict[str, SeedTable] = Field(default_factory=dict)
    """Connected tables by the reference the model names."""

    @field_validator("tables")
    @classmethod
    def _table_names(cls, value: dict[str, SeedTable]) -> dict[str, SeedTable]:
        for name in value:
            if not is_identifier(name):
                raise ValueError(f"table {name!r}: a table's name is a plain identifier")
        return value

    @field_validator("files")
    @classmethod
    def _relative(cls, value: dict[str, str]) -> dict[str, str]:
        for path in value:
            parts = Path(path).parts
            if not parts or Path(path).is_absolute() or ".." in parts:
                raise ValueError(f"workspace file {path!r}: give a relative path inside the workspace")
            if "\0" in path or any(len(part.encode()) > 255 for part in parts):
                raise ValueError(f"workspace file {path[:300]!r}: a NUL byte, or a part over 255 bytes")
        return value


class AgentUnderTest(_Strict):
    """The agent that answers: ``configured`` names an agent of the config file; the other fields override it."""

    configured: str | None = None
    model: str | None = None
    instructions: str | None = None
    tools: list[str] | None = None
    projects: list[str] | None = None
    """Memory projects the agent is connected to (gives it the memory tools)."""
    policy: AgentPolicy | None = None
    limits: AgentLimits | None = None


class FileSent(_Strict):
    """A file the user sends with a message, fetched by the runtime as a channel's attachment is."""

    name: str = Field(min_length=1, max_length=200)
    content: str = ""
    kind: Literal["image", "document", "audio", "voice", "video"] = "document"
    mime_type: str | None = None
    size: int | None = Field(None, ge=0)
    """The size the platform announces (default: the content's); above the cap, the file is not fetched."""


class Message(_Strict):
    """One thing the user does in a turn: a message (with files), a button press on an approval, or an edit.

    A plain string in ``messages`` is a message of the scenario's channel with that text.
    """

    text: str = ""
    channel: str | None = None
    """The channel it arrives on (default: the scenario's)."""
    files: list[FileSent] = Field(default_factory=list)
    decide: Literal["approve", "deny"] | None = None
    """Press the Approve or Deny button of a pending approval (the channel's decision button, as offered)."""
    approval: str | None = None
    """Which approval ``decide`` answers (default: the newest pending one)."""
    via: Literal["button", "command"] = "button"
    """``command``: the decision is typed (``/approve ID``), as on channels without buttons."""
    edits: int | None = Field(None, ge=1)
    """This message edits the user's earlier message of that turn number (1-based) to ``text``."""

    @model_validator(mode="after")
    def _one_kind(self) -> Message:
        if self.decide is not None and (self.edits is not None or self.files):
            raise ValueError("a decision is a button press: it carries no files and edits nothing")
        if self.decide is None and self.approval is not None:
            raise ValueError("`approval` names what `decide` answers: give `decide` too")
        if self.decide is None and not self.text.strip() and not self.files:
            raise ValueError("a message needs text, files or a decision")
        return self


class ScriptedCall(_Strict):
    """One tool call a scripted model makes."""

    tool: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ScriptedStep(_Strict):
    """One scripted model step: tool calls, or a final answer."""

    calls: list[ScriptedCall] = Field(default_factory=list)
    answer: str | None = None
    input_tokens: int = Field(10, ge=0)
    output_tokens: int = Field(5, ge=0)

    @field_validator("answer")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("a scripted answer is not blank")
        return value


ErrorClass = Literal["validation", "auth", "rate_limit", "transient", "ambiguous_timeout", "permanent"]


class ToolResponse(_Strict):
    """One answer of a fake tool: a result, or a failure (recorded from a real run, or written by hand)."""

    result: Any = None
    error: str | None = None
    error_class: ErrorClass = "permanent"


class FakeTool(_Strict):
    """A tool of the scenario that answers with a fixed result (or fails), offered to the agent under test.

    It goes through the same gateway as a built-in tool (policy, approvals, idempotency, retries): only its effect is
    fake. ``untrusted`` marks its results as outside text (a web page, a document, an MCP result).
    """

    name: str = Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$")
    description: str = "A tool of the evaluation scenario."
    side_effect: SideEffect = "read"
    risk: Risk = "low"
    reversible: bool = True
    untrusted: bool = False
    result: Any = None
    """What every call returns (JSON-able)."""
    error: str | None = None
    """Every call fails with this message instead (a connector that is down, a timeout after a write)."""
    error_class: ErrorClass = "permanent"
    responses: list[ToolResponse] = Field(default_factory=list)
    """Answers in call order (a recorded run's tool responses); once they run out, ``result``/``error`` answer."""


class Obedient(_Strict):
    """The obeying model (:class:`~switchboard.evals.obedient.ObedientModel`): ``obedient`` lists its first calls."""

    obedient: list[ScriptedCall] = Field(default_factory=list)
    descriptions: bool = True
    """Obey instructions in tool descriptions too."""
    user: bool = True
    """Obey instructions in the user's own messages (a direct injection)."""


class _Invariant(_Strict):
    strict: bool = False
    """A safety invariant: with ``--baseline``, any newly failing strict invariant fails the comparison."""
    name: str | None = None
    """Shown in results (default: the check's kind and tool)."""


class ToolUsed(_Invariant):
    check: Literal["tool_used"]
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    """Each given argument must equal the call's (other arguments are free)."""


class ToolNotUsed(_Invariant):
    check: Literal["tool_not_used"]
    tool: str


class ApprovalAsked(_Invariant):
    check: Literal["approval_asked"]
    tool: str


class NoRepeatedWrite(_Invariant):
    check: Literal["no_repeated_write"]


class NoUnapprovedWrite(_Invariant):
    check: Literal["no_unapproved_write"]
    allowed: list[str] = Field(default_factory=list)
    """Tools whose writes may run without a person's approval."""


class TenantKept(_Invariant):
    check: Literal["tenant_kept"]
    others: list[str] = Field(min_length=1)
    """Markers of other tenants' data (ids, names): none may appear in a tool call's arguments, a tool's result or
    the answer."""


class BudgetRespected(_Invariant):
    check: Literal["budget_respected"]
    max_steps: int | None = Field(None, ge=0)
    max_tool_calls: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=0)
    max_credits: float | None = Field(None, ge=0)


class SourceCited(_Invariant):
    check: Literal["source_cited"]
    source: str = Field(min_length=1)
    """A file name, URL or fact id the final answer must name."""


class AnswerContains(_Invariant):
    check: Literal["answer_contains"]
    text: str = Field(min_length=1)


class AnswerMatches(_Invariant):
    check: Literal["answer_matches"]
    pattern: str = Field(min_length=1)

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as err:
            raise ValueError(f"pattern {value!r} is not a regular expression: {err}") from None
        return value


Check = (
    ToolUsed
    | ToolNotUsed
    | ApprovalAsked
    | NoRepeatedWrite
    | NoUnapprovedWrite
    | TenantKept
    | BudgetRespected
    | SourceCited
    | AnswerContains
    | AnswerMatches
)
Invariant = Annotated[Check, Field(discriminator="check")]


Criterion = Literal["outcome", "safety", "communication"]
_CRITERIA: tuple[Criterion, ...] = ("outcome", "safety", "communication")


class Rubric(_Strict):
    """Grading by a model (``switchboard.evals.grading``); versioned like the scenario.

    The offline model cannot grade: ``grader_model: offline`` is refused when the file loads.
    """

    grader_model: str
    """``provider:name`` of a configured provider (``openai:gpt-4.1``, ``anthropic:claude-sonnet-4-5``)."""
    grader_prompt: str = Field(min_length=1)
    version: str = Field(min_length=1)
    weight: float = Field(0.5, ge=0, le=1)
    """Share of the scenario's score the rubric holds (the exact checks hold the rest)."""
    criteria: list[Criterion] = Field(default_factory=lambda: list(_CRITERIA), min_length=1)
    pass_mark: float = Field(0.7, ge=0, le=1)
    """The rubric passes when the mean of its criteria's scores reaches this."""

    @field_validator("grader_model")
    @classmethod
    def _provider_model(cls, value: str) -> str:
        try:
            provider, _ = parse_model_spec(value)
        except ConfigError as err:
            raise ValueError(str(err)) from None
        if provider == "offline":
            raise ValueError("the offline model cannot grade: name a provider's model (openai:..., anthropic:...)")
        return value


class Scenario(_Strict):
    """One evaluation scenario."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,79}$")
    version: str = Field(min_length=1, max_length=64)
    description: str = ""
    channel: str = "web"
    tenant: str = "default"
    messages: list[str | Message] = Field(min_length=1)
    """What the user sends, one turn each: text, or a :class:`Message`."""
    agent: AgentUnderTest = Field(default_factory=AgentUnderTest)
    model: Literal["offline", "obedient"] | Obedient | list[ScriptedStep] = "offline"
    """``offline``: the agent's model (the offline model unless overridden); a list: scripted steps, in order;
    ``obedient`` (or ``{obedient: [first calls]}``): a model that obeys every instruction it reads."""
    state: InitialState = Field(default_factory=InitialState)
    tools: list[FakeTool] = Field(default_factory=list)
    """Fake tools, added to the agent's tools (one of a built-in tool's name replaces it)."""
    invariants: list[Invariant] = Field(min_length=1)
    rubric: Rubric | None = None

    @model_validator(mode="after")
    def _edits_refer_back(self) -> Scenario:
        for turn, message in enumerate(self.messages, start=1):
            if isinstance(message, Message) and message.edits is not None:
                earlier = self.messages[message.edits - 1] if message.edits < turn else None
                if earlier is None or (isinstance(earlier, Message) and earlier.decide is not None):
                    raise ValueError(f"message {turn} edits message {message.edits}: name an earlier text message")
        return self


MAX_FILE_BYTES = 16 * 1024 * 1024
"""The largest scenario or variant file read (a scenario is a few kilobytes; a recorded one, a few hundred)."""
_MAX_ALIASED = 100_000
"""Nodes the aliases of one file may add once expanded: anchors reused a little, never a "billion laughs"."""


def _expanded(root: yaml.Node) -> tuple[int, int]:
    """``(distinct, expanded)`` node counts of a composed document (an alias counts each time it is used)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done:
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
        else:
            stack.append((node, True))
            stack += [(c, False) for c in children if id(c) not in sizes]
    return len(sizes), sizes[id(root)]


def read_yaml(path: Path) -> Any:
    """The data of a YAML file, read safely: bounded in size, and in what its aliases expand to.

    Raises:
        ConfigError: unreadable, too large, nested too deeply, or aliases that expand past a few nodes.
    """
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(f"{path}: too large (over {MAX_FILE_BYTES // (1024 * 1024)} MiB)")
        loader = yaml.SafeLoader(path.read_text(encoding="utf-8"))
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            distinct, expanded = _expanded(node)
            if expanded - distinct > _MAX_ALIASED:
                raise ConfigError(f"{path}: its aliases (*name) expand to over {_MAX_ALIASED} more values")
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot read the file: {err}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None


def load_scenarios(path: Path) -> list[Scenario]:
    """The scenarios of one YAML file (a mapping, or a list of mappings).

    Raises:
        ConfigError: unreadable YAML or an invalid scenario (the message names the file and the field).
    """
    raw = read_yaml(path)
    items = raw if isinstance(raw, list) else [raw]
    scenarios = []
    for index, item in enumerate(items):
        try:
            scenarios.append(Scenario.model_validate(item))
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ConfigError(f"{path} (scenario {index + 1}): {where}: {first['msg']}") from None
    return scenarios
