"""The tool registry: every tool an agent may name in its ``tools`` list, by name.

:func:`default_registry` holds the native tools — the clock, the session-state slots, web search and image
generation, and (when their modules are present) files in the session workspace, document reading, channel actions
and ``search_history``. Custom integrations register more with :meth:`ToolRegistry.register`.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from switchboard.core.agent.config import Agent
from switchboard.core.agent.slots import SLOT_TOOLS
from switchboard.core.knowledge.config import KNOWLEDGE_TOOLS
from switchboard.core.memory.tools import MEMORY_TOOLS
from switchboard.core.model import ToolSpec
from switchboard.core.tables.config import table_cost
from switchboard.core.tools.builtin.clock import TOOLS as CLOCK_TOOLS
from switchboard.core.tools.builtin.skills import agent_skills, skill_tools
from switchboard.core.tools.definition import Tool

if TYPE_CHECKING:
    from switchboard.core.memory.embeddings import Embedder
    from switchboard.core.memory.store import MemoryStore
    from switchboard.core.memory.tools import ConnectedProjects
    from switchboard.core.providers.images import ImageProvider
    from switchboard.core.tables.tools import ConnectedTables
    from switchboard.core.tools.builtin.documents import DocumentLimits
    from switchboard.core.tools.builtin.shell import EgressGate, SandboxSource, ShellOptions
    from switchboard.core.tools.rest.tool import RestTransport
    from switchboard.sandbox.runner import Sandbox
    from switchboard.skills.package import SkillRef
    from switchboard.skills.store import SkillLibrary

__all__ = ["OPTIONAL_TOOL_MODULES", "ToolRegistry", "default_registry", "tool_spec"]

logger = logging.getLogger(__name__)

OPTIONAL_TOOL_MODULES = (
    "switchboard.core.tools.builtin.files",
    "switchboard.core.tools.builtin.documents",
    "switchboard.core.tools.builtin.channel",
    "switchboard.core.tools.builtin.history",
    "switchboard.core.tools.builtin.sql",
    "switchboard.core.tools.builtin.schedules",
    "switchboard.core.tools.builtin.handoff",
)
"""Native tool modules registered by :func:`default_registry` when they import (each exports ``TOOLS``)."""


_VARIANTS_MAX = 4096
"""Per-agent tool variants whose specs a registry remembers (past it, it starts over)."""


def tool_spec(tool: Tool) -> ToolSpec:
    """The tool as a model sees it: name, description and the JSON Schema of its input."""
    schema: dict[str, Any] = tool.input.model_json_schema()
    schema.pop("title", None)
    schema.pop("description", None)
    return ToolSpec(name=tool.name, description=tool.description, parameters=schema)


class ToolRegistry:
    """Tools by name, and the agent-facing view of them."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._specs: dict[str, ToolSpec] = {}
        self._variants: dict[int, tuple[Tool, ToolSpec]] = {}
        """Specs of the per-agent variants of registered tools (:attr:`Tool.per_agent`), by the variant's identity."""
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool, *, replace: bool = False) -> None:
        """Add a tool.

        Raises:
            ValueError: a tool of that name is already registered and ``replace`` is false.
        """
        if tool.name in self._tools and not replace:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        self._specs.pop(tool.name, None)
        self._variants.clear()

    def remove(self, name: str) -> None:
        """Take a tool out (nothing when none has that name): a reloaded declaration that is gone."""
        self._tools.pop(name, None)
        self._specs.pop(name, None)
        self._variants.clear()

    def get(self, name: str, *, agent: str = "") -> Tool | None:
        """The tool called ``name``, if registered, as ``agent`` has it (see :attr:`Tool.per_agent`)."""
        tool = self._tools.get(name)
        if tool is not None and agent and tool.per_agent is not None:
            return tool.per_agent(agent)
        return tool

    def names(self) -> list[str]:
        """Registered tool names, sorted."""
        return sorted(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def spec(self, name: str) -> ToolSpec:
        """The model-facing spec of a registered tool (cached)."""
        found = self._specs.get(name)
        if found is None:
            found = self._specs[name] = tool_spec(self._tools[name])
        return found

    def specs(self, tools: Sequence[Tool] | None = None) -> list[ToolSpec]:
        """Specs for ``tools`` (default: every registered tool), in order.

        Each is rendered once per tool object (a registered tool, or the per-agent variant one hands out), so every
        step and turn of an agent sends the same catalog, object for object and byte for byte.
        """
        listed = tools if tools is not None else list(self._tools.values())
        return [self.spec(t.name) if self._tools.get(t.name) is t else self._variant_spec(t) for t in listed]

    def _variant_spec(self, tool: Tool) -> ToolSpec:
        hit = self._variants.get(id(tool))
        if hit is not None and hit[0] is tool:
            return hit[1]
        spec = tool_spec(tool)
        if len(self._variants) >= _VARIANTS_MAX:
            self._variants.clear()
        self._variants[id(tool)] = (tool, spec)
        return spec

    def for_agent(self, agent: Agent) -> list[Tool]:
        """The tools ``agent`` lists that are registered, in the agent's order (unknown names are skipped).

        An agent gets its own ``rest_tools``; one with ``skills`` also gets ``use_skill``, which loads them; one with
        ``tables`` the table tools their permissions enable (once, whatever the number of tables); one with ``projects``
        the memory tools; one with ``knowledge`` ``search_knowledge`` and ``read_source``; one with
        ``shell: hosted`` does not get the local ``shell`` (its provider runs the commands).
        """
        seen: set[str] = set()
        found: list[Tool] = []
        own = [spec.name for spec in agent.rest_tools]  # its declared REST operations need no listing
        skills = ["use_skill"] if agent.skills else []
        memory = list(MEMORY_TOOLS) if agent.projects else []
        knowledge = list(KNOWLEDGE_TOOLS) if agent.knowledge is not None else []
        extra = [*own, *skills, *table_cost(agent.tables).parts, *memory, *knowledge, *self._mcp_names(agent)]
        for name in [*agent.tools, *extra]:
            tool = self.get(name, agent=agent.name)
            if name == "shell" and agent.shell == "hosted":  # the provider's container runs its commands
                continue
            if tool is not None and name not in seen:
                seen.add(name)
                found.append(tool)
        return found

    def _mcp_names(self, agent: Agent) -> list[str]:
        """The registered MCP tools of ``agent``'s servers that its allowlists let through."""
        names: list[str] = []
        for entry in agent.mcp:
            prefix = f"{entry.server}__"
            if entry.tools is None:
                names.extend(name for name in self._tools if name.startswith(prefix))
            else:
                names.extend(prefix + tool for tool in entry.tools)
        return names

    def skills(self, agent: Agent) -> tuple[SkillRef, ...]:
        """The packages of ``agent``'s ``skills`` list, resolved for one turn (none without ``use_skill``)."""
        return agent_skills(self.for_agent(agent), agent)

    def problems(self, agent: Agent) -> list[str]:
        """Tool names in ``agent`` that no registered tool answers to, for ``switchboard agents validate``."""
        known = ", ".join(self.names())
        return [
            f"agent {agent.name!r}: unknown tool {name!r} (known: {known})"
            for name in agent.tools
            if name not in self._tools
        ]


def default_registry(
    *,
    documents: DocumentLimits | None = None,
    sandbox: Sandbox | SandboxSource | Literal["detect"] | None = "detect",
    shell: ShellOptions | None = None,
    skills: SkillLibrary | None = None,
    egress: EgressGate | None = None,
    tables: ConnectedTables | None = None,
    agents: Mapping[str, Agent] | None = None,
    search: RestTransport | None = None,
    images: ImageProvider | None = None,
    memory: tuple[MemoryStore, ConnectedProjects] | None = None,
    embedder: Embedder | None = None,
) -> ToolRegistry:
    """The native tools: clock, slots, and files, documents, channel actions and history when present.

    Args:
        documents: Limits of ``read_document`` (default:
        :class:`~switchboard.core.tools.builtin.documents.DocumentLimits`).
        sandbox: The sandbox the worker chose at start-up; ``None`` (no sandbox on this host): ``shell`` is not
            offered. ``"detect"``: ``shell`` detects one with the default limits on first use.
        shell: How ``shell`` treats its arguments (default:
        :class:`~switchboard.core.tools.builtin.shell.ShellOptions`).
        skills: Where ``use_skill`` finds packages (default: the built-in skills only).
        egress: The worker's egress proxy for ``shell`` commands (``None``: they have no network).
        tables: Each agent's connected tables; ``None``: the table tools are not offered.
        agents: The agents whose ``search:`` and ``images:`` blocks ``web_search`` and ``generate_image`` follow.
        search: The way out of ``web_search``'s API calls (the worker's egress; ``None``: they fail, saying so).
        images: Who draws for ``generate_image`` (``None``: it fails, saying so).
        memory: Where facts live and each agent's connected projects; ``None``: the memory tools are not offered.
        embedder: How the memory tools embed texts (``None``: they search by words only).
    """
    registry = ToolRegistry([*CLOCK_TOOLS, *SLOT_TOOLS])
    for module_name in OPTIONAL_TOOL_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            if err.name != module_name:
                logger.warning("tool module %s failed to import: %s", module_name, err)
            continue
        for tool in getattr(module, "TOOLS", []):
            if tool.name not in registry:
                registry.register(tool)
    if sandbox is not None:
        from switchboard.core.tools.builtin.shell import detect_on_first_use, shell_tools

        for tool in shell_tools(detect_on_first_use if sandbox == "detect" else sandbox, shell, egress):
            registry.register(tool)
    for tool in skill_tools(skills):
        registry.register(tool)
    if tables is not None:
        from switchboard.core.tables.tools import table_tools

        for tool in table_tools(tables):
            registry.register(tool)
    if memory is not None:
        from switchboard.core.memory.tools import memory_tools

        for tool in memory_tools(*memory, embedder=embedder):
            registry.register(tool)
    from switchboard.core.tools.web.images import image_tool
    from switchboard.core.tools.web.search import search_tool

    known = dict(agents or {})
    registry.register(search_tool(lambda: known, search))
    registry.register(image_tool(lambda: known, images))
    if documents is not None and "read_document" in registry:
        from switchboard.core.tools.builtin.documents import document_tools

        for tool in document_tools(documents):
            registry.register(tool, replace=True)
    return registry
