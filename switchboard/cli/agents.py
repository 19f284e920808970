"""``switchboard agents list|show|validate``: what each agent is, what it may use, and what is wrong."""

from __future__ import annotations

import contextlib

from switchboard.core.agent.config import Agent
from switchboard.core.tables.config import table_cost
from switchboard.settings import Settings

__all__ = ["agent_problems", "agents_command"]


def agent_problems(settings: Settings, agent: Agent) -> list[str]:
    """Everything that keeps an agent from working as configured, in words an operator can act on."""
    from switchboard.core.tools.builtin import default_registry
    from switchboard.egress.transport import register_rest_tools, rest_problems, search_problems

    problems = agent.problems()
    registry = default_registry()
    try:
        register_rest_tools(registry, settings, None)
    except ValueError as err:
        problems.append(str(err))
    problems += rest_problems(settings, agent.name)
    problems += search_problems(settings, agent.name)
    from switchboard.cli.knowledge import knowledge_problems

    problems += knowledge_problems(settings, agent)
    for tool in agent.tools:
        if registry.get(tool) is None:
            problems.append(
                f"agent {agent.name!r}: unknown tool {tool!r} (known: {', '.join(sorted(registry.names()))})"
            )
    spec = agent.model or settings.default_model
    provider = spec.split(":", 1)[0]
    if provider not in {"offline", "openai", "anthropic"}:
        problems.append(
            f"agent {agent.name!r}: unknown model provider {provider!r} (use offline, openai:…, anthropic:…)"
        )
    if provider == "openai" and settings.openai_api_key is None and not settings.openai_base_url:
        problems.append(
            f"agent {agent.name!r}: model {spec} needs OPENAI_API_KEY (or OPENAI_BASE_URL for a local server)"
        )
    if provider == "anthropic" and settings.anthropic_api_key is None:
        problems.append(f"agent {agent.name!r}: model {spec} needs ANTHROPIC_API_KEY")
    for name, binding in agent.egress.secrets.items():
        if not settings.environ.get(binding.env):
            problems.append(f"agent {agent.name!r}: egress secret {name} reads ${binding.env}, which is not set")
    for name, database in agent.databases.items():
        if not database.path.is_file():
            problems.append(f"agent {agent.name!r}: database {name} has no file at {database.path}")
    from switchboard.cli.skills import skill_store
    from switchboard.skills.store import SkillLibrary

    _, missing = SkillLibrary(skill_store(settings)).resolve_all(agent.skills)
    problems += [f"agent {agent.name!r}: {problem} (see `switchboard skills list`)" for problem in missing]
    return problems


def _show(settings: Settings, agent: Agent) -> None:
    from switchboard.core.tools.builtin import default_registry
    from switchboard.egress.transport import register_rest_tools

    registry = default_registry()
    with contextlib.suppress(ValueError):  # agent_problems below says which name is taken
        register_rest_tools(registry, settings, None)
    print(f"agent:        {agent.name} ({agent.status})")
    if agent.profile:
        print(f"profile:      {agent.profile.name} — {agent.profile.description}")
    print(f"model:        {agent.model or settings.default_model}")
    print(f"busy policy:  {agent.busy_policy}")
    print(f"codeact:      {'on' if agent.codeact else 'off'}")
    limits = agent.limits
    credits = "unlimited" if limits.max_credits is None else f"{limits.max_credits:g}"
    print(
        f"limits:       {limits.max_steps} steps, {limits.deadline_s:g} s, {limits.max_tool_calls} tool calls, "
        f"{limits.max_input_tokens} input tokens, {credits} credits"
    )
    allow = (*settings.egress.allow, *agent.egress.allow)
    print(f"egress:       {', '.join(allow) if allow else 'none (default deny)'}")
    for name, binding in agent.egress.secrets.items():
        print(f"  secret {name} (${binding.env}) → {', '.join(binding.domains)}")
    from switchboard.egress.transport import credentials_used

    for line in credentials_used(settings, agent.name):
        print(f"  {line}")
    print(f"skills:       {', '.join(agent.skills) if agent.skills else 'none'}")
    tables = table_cost(agent.tables)
    others = [tool for tool in registry.for_agent(agent) if tool.name not in tables.parts]
    own = sum(tool.cost for tool in others)
    print(f"tool cost:    {own + tables.total} (tools {own} + tables {tables.total})")
    print(f"table cost:   {tables.describe()}")
    for ref, table in agent.tables.items():
        columns = ", ".join(table.columns) if table.columns else "all"
        tenant = f", rows of the tenant in {table.tenant_column}" if table.tenant_column else ""
        print(f"  table {ref}: {table.database}.{table.table} {table.permission} (columns: {columns}{tenant})")
    print("tools:")
    for name in [*agent.tools, *(spec.name for spec in agent.rest_tools if spec.name not in agent.tools)]:
        tool = registry.get(name, agent=agent.name)
        if tool is None:
            print(f"  {name:<18} UNKNOWN")
        else:
            print(f"  {name:<18} {tool.side_effect:<5} risk={tool.risk:<6} cost={tool.cost}  {tool.description}")
    for problem in agent_problems(settings, agent):
        print(f"problem:      {problem}")


def agents_command(settings: Settings, action: str, name: str | None) -> int:
    """Run one ``agents`` subcommand; returns the exit code."""
    agents = settings.file.agents
    if action == "list":
        for agent in agents.values():
            marker = " (default)" if agent.name == settings.file.default_agent else ""
            print(f"{agent.name:<16} {agent.status:<6} {agent.model or settings.default_model}{marker}")
        return 0
    if action == "show":
        if not name:
            print("switchboard: `agents show` needs an agent NAME (see `switchboard agents list`)")
            return 2
        _show(settings, settings.file.agent(name))
        return 0
    failures = 0
    for agent in agents.values():
        problems = agent_problems(settings, agent)
        print(f"{agent.name}: {'ok' if not problems else 'problems'}")
        for problem in problems:
            print(f"  - {problem}")
        failures += bool(problems)
    return 1 if failures else 0
