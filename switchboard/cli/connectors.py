"""``switchboard connectors list`` / ``connectors show PACK [--agent NAME]``: the packs, and what an agent gets."""

from __future__ import annotations

import sys

from switchboard.core.connectors import ConnectorPack, Expansion, expand_pack, load_packs
from switchboard.errors import ConfigError
from switchboard.settings import Settings

__all__ = ["connectors_command"]


def _users(settings: Settings, pack: str) -> list[str]:
    return sorted(name for name, agent in settings.file.agents.items() if pack in agent.connectors)


def _list(settings: Settings) -> int:
    print(f"{'PACK':<12} {'READS':>5} {'WRITES':>6}  {'AGENTS':<24} DESCRIPTION")
    for name, pack in load_packs().items():
        effects = list(pack.effects().values())
        writes = effects.count("write") if pack.rest_tools else "mcp"
        reads = effects.count("read") if pack.rest_tools else len(pack.mcp_reads)
        agents = ", ".join(_users(settings, name)) or "-"
        print(f"{name:<12} {reads:>5} {writes!s:>6}  {agents:<24} {pack.description}")
    return 0


def _expansion(settings: Settings, pack: ConnectorPack) -> tuple[Expansion, str | None]:
    """The pack as configured, or with example settings and the reason it is not configured."""
    try:
        return expand_pack(pack, settings.file.connectors.get(pack.name)), None
    except ConfigError as err:
        return expand_pack(pack, pack.samples()), str(err)


def _show(settings: Settings, name: str, agent: str | None) -> int:
    packs = load_packs()
    if name not in packs:
        print(f"switchboard: no connector pack {name!r} (packs: {', '.join(sorted(packs))})", file=sys.stderr)
        return 2
    pack = packs[name]
    if agent is not None and agent not in settings.file.agents:
        raise ConfigError(f"unknown agent {agent!r} (defined: {', '.join(sorted(settings.file.agents))})")
    expansion, problem = _expansion(settings, pack)
    print(f"pack:      {pack.name}\n           {pack.description}")
    print(f"agents:    {', '.join(_users(settings, name)) or 'none (add it to agents.<name>.connectors)'}")
    if problem is not None:
        print(f"settings:  not configured ({problem}); shown with example values")
    print("\nSETTING         VALUE / DEFAULT               ABOUT")
    for key, setting in pack.settings.items():
        value = expansion.values[key] if problem is None else (setting.default or "(required)")
        kind = "(secret) " if setting.secret else ""
        print(f"{key:<15} {value:<29} {kind}{setting.description}")
    gate = "approve" if expansion.approve_writes else "allow (approve_writes: false)"
    print(f"\n{'TOOL':<28} {'METHOD':<7} {'EFFECT':<6} {'RISK':<7} {'TIMEOUT':>7}  WRITES")
    for spec in expansion.tools:
        decision = gate if spec.effect == "write" else "-"
        print(
            f"{spec.name:<28} {spec.method:<7} {spec.effect:<6} {spec.risk or '-':<7} {spec.timeout_s:>6g}s  {decision}"
        )
    if expansion.server is not None:
        print(
            f"MCP server {pack.name}: reads {', '.join(pack.mcp_reads) or 'none'}; every other tool is a write: {gate}"
        )
    if expansion.hosts:
        print(f"\nhosts:     {', '.join(expansion.hosts)}")
    if agent is None:
        return 0
    print(f"\nagent {agent}:")
    if name not in settings.file.agents[agent].connectors:
        print(f"  does not switch {name} on: add it to agents.{agent}.connectors")
        return 0
    got = settings.file.agents[agent]
    tools = [spec.name for spec in expansion.tools if spec.name in got.tools]
    print(f"  tools:   {', '.join(tools) or '-'}")
    if expansion.server is not None:
        print(f"  mcp:     {pack.name} (accept its tools with `switchboard mcp accept {pack.name}`)")
    print(f"  egress:  {', '.join(h for h in expansion.hosts if h in got.egress.allow) or '-'}")
    for rule in got.policy.rules:
        if (rule.name or "").startswith(f"connector:{pack.name}"):
            print(f"  rule:    {rule.name}: {rule.decide} ({rule.reason})")
    return 0


def connectors_command(settings: Settings, action: str, pack: str | None, agent: str | None) -> int:
    """Run ``connectors list`` or ``connectors show PACK``; the exit status."""
    if action == "list":
        return _list(settings)
    if pack is None:
        print("switchboard: connectors show needs a PACK (see `switchboard connectors list`)", file=sys.stderr)
        return 2
    return _show(settings, pack, agent)
