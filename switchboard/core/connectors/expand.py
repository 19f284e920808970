"""Connector packs switched on in the YAML file, expanded into what already runs: REST tools, MCP servers, rules.

```yaml
connectors:                      # each pack's settings; secret ones name an egress secret
  tracker: {repo: acme/shop, token: TRACKER_TOKEN}
  calendar: {approve_writes: false}
agents:
  support: {connectors: [tracker, calendar]}
```

A pack's REST operations become top-level ``rest_tools`` named ``<pack>_<op>`` that each agent switching the pack
on lists in its ``tools``; its MCP server becomes ``mcp_servers.<pack>``. The agent's egress allowlist gains the
pack's hosts, and its policy gains one rule per write: ``approve`` (a person decides), or ``allow`` when the operator
set ``approve_writes: false``. The agent's own rules come first, so the operator may still narrow either way.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from switchboard.core.connectors.pack import OPERATOR_OPTIONS, ConnectorPack, load_packs
from switchboard.core.tools.mcp.config import tool_name
from switchboard.core.tools.rest.declaration import RestToolSpec
from switchboard.errors import ConfigError

__all__ = ["SECRET_NAME", "Expansion", "expand_connectors", "expand_pack"]

SECRET_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")
"""What a secret setting holds: the name of an egress secret, never its value."""


@dataclass(frozen=True)
class Expansion:
    """What one pack with the operator's settings adds to an agent that switches it on."""

    pack: ConnectorPack
    values: dict[str, str]
    """Every setting's value (a secret setting's is the egress secret's name)."""
    approve_writes: bool
    tools: list[RestToolSpec] = field(default_factory=list)
    server: dict[str, Any] | None = None
    """The MCP server declaration (``mcp_servers.<pack>``), if the pack is one."""

    @property
    def hosts(self) -> list[str]:
        """Hosts the REST operations call (added to the agent's egress allowlist)."""
        return sorted({spec.host for spec in self.tools})

    @property
    def secrets(self) -> dict[str, str]:
        """Secret setting → the egress secret it names."""
        return {name: self.values[name] for name, setting in self.pack.settings.items() if setting.secret}

    def rules(self) -> list[dict[str, Any]]:
        """The policy rules (``Rule`` fields) that gate the pack's writes."""
        decide = "approve" if self.approve_writes else "allow"
        why = (
            f"the {self.pack.name} connector's writes wait for a person's approval"
            if self.approve_writes
            else f"the operator allowed the {self.pack.name} connector's writes (connectors.{self.pack.name})"
        )
        found = [
            {"name": f"connector:{spec.name}", "tool": spec.name, "decide": decide, "reason": why}
            for spec in self.tools
            if spec.effect == "write"
        ]
        if self.server is not None:
            found.append(
                {
                    "name": f"connector:{self.pack.name}",
                    "tool": tool_name(self.pack.name, "*"),
                    "side_effect": "write",
                    "decide": decide,
                    "reason": why,
                }
            )
        return found


def _fail(source: str, where: str, message: str) -> ConfigError:
    return ConfigError(f"{source}: {where} {message}", field=where)


def expand_pack(pack: ConnectorPack, block: Mapping[str, Any] | None, *, source: str = "the YAML file") -> Expansion:
    """The pack with the operator's ``connectors.<pack>`` block applied.

    Raises:
        ConfigError: a required setting is missing, a setting is unknown or malformed, or a secret setting holds
            something that is not an egress secret's name.
    """
    where = f"connectors.{pack.name}"
    given = dict(block or {})
    approve = given.pop("approve_writes", True)
    if not isinstance(approve, bool):
        raise _fail(source, f"{where}.approve_writes", "is true (writes wait for a person's approval) or false")
    unknown = sorted(set(given) - set(pack.settings))
    if unknown:
        known = ", ".join([*pack.settings, *sorted(OPERATOR_OPTIONS)])
        raise _fail(source, f"{where}.{unknown[0]}", f"is not a setting of the {pack.name} pack (settings: {known})")
    values: dict[str, str] = {}
    for name, setting in pack.settings.items():
        value = given.get(name, setting.default)
        key = f"{where}.{name}"
        if value is None:
            example = f" (e.g. {setting.example})" if setting.example else ""
            raise _fail(
                source, key, f"is missing: the {pack.name} pack needs {setting.description}{example}; add it there"
            )
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise _fail(source, key, "must be text (or a number)")
        text = str(value)
        if setting.secret and not SECRET_NAME.match(text):
            raise _fail(
                source,
                key,
                "must name an egress secret (upper-case, like TRACKER_TOKEN), never hold the secret itself: declare "
                "the value under agents.<name>.egress.secrets (or SWITCHBOARD_EGRESS__SECRETS__<NAME>__VALUE) and put "
                "its name here",
            )
        if setting.pattern is not None and not re.fullmatch(setting.pattern, text):
            raise _fail(source, key, f"{text!r} does not match {setting.pattern!r} ({setting.description})")
        values[name] = text
    try:
        tools = pack.operations(values)
        server = pack.server(values)
    except ValueError as err:
        raise _fail(source, where, f"does not give a working {pack.name} pack: {err}") from None
    return Expansion(pack, values, approve, tools, server)


def _names(value: Any, where: str, source: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _fail(source, where, "is a list of connector pack names ([calendar, tracker])")
    return list(dict.fromkeys(value))


def _unknown_pack(source: str, where: str, name: str, packs: Mapping[str, ConnectorPack]) -> ConfigError:
    known = ", ".join(sorted(packs)) or "none"
    return _fail(
        source,
        where,
        f"names the connector pack {name!r}, which does not exist (packs: {known}; `switchboard connectors list`)",
    )


def _server_of(entry: Any) -> Any:
    return entry.get("server") if isinstance(entry, dict) else entry


def _section(body: dict[str, Any], key: str) -> dict[str, Any]:
    found = body.setdefault(key, {})
    return found if isinstance(found, dict) else {}  # a malformed block is left for validation to name


def _append(body: dict[str, Any], key: str, items: list[Any]) -> None:
    found = body.setdefault(key, [])
    if isinstance(found, list):
        found.extend(item for item in items if item not in found)


def expand_connectors(
    raw: Mapping[str, Any],
    *,
    source: str = "the YAML file",
    secrets: Collection[str] | None = None,
    default_tools: Collection[str] = ("current_time",),
    packs: Mapping[str, ConnectorPack] | None = None,
) -> dict[str, Any]:
    """The parsed YAML file with its connectors switched on (a copy; ``raw`` is unchanged).

    ``secrets`` are the egress secrets the environment declares (``SWITCHBOARD_EGRESS__SECRETS__<NAME>``): a secret
    setting must name one of them or one of the agent's ``egress.secrets`` (``None``: not checked, the environment
    is not known). ``default_tools`` are an agent's tools when it lists none.

    Raises:
        ConfigError: naming the field and what to fix (see :func:`expand_pack`, and an unknown pack).
    """
    packs = load_packs() if packs is None else packs
    out = copy.deepcopy(dict(raw))
    blocks = out.get("connectors") or {}
    if not isinstance(blocks, dict):
        raise _fail(source, "connectors", "maps pack names to their settings ({tracker: {repo: acme/shop}})")
    expansions: dict[str, Expansion] = {}
    for name, block in blocks.items():
        if name not in packs:
            raise _unknown_pack(source, f"connectors.{name}", str(name), packs)
        if block is not None and not isinstance(block, dict):
            raise _fail(source, f"connectors.{name}", "maps the pack's settings to values")
    agents = out.get("agents") or {}
    enabled: dict[str, list[str]] = {}
    for agent_name, body in agents.items() if isinstance(agents, dict) else ():
        if not isinstance(body, dict):
            continue
        names = _names(body.get("connectors"), f"agents.{agent_name}.connectors", source)
        for index, name in enumerate(names):
            if name not in packs:
                raise _unknown_pack(source, f"agents.{agent_name}.connectors.{index}", name, packs)
        enabled[agent_name] = names
    for name in dict.fromkeys([*blocks, *(n for names in enabled.values() for n in names)]):
        expansions[name] = expand_pack(packs[name], blocks.get(name), source=source)
    for name in sorted({n for names in enabled.values() for n in names}):
        expansion = expansions[name]
        _append(out, "rest_tools", [spec.model_dump(mode="json", exclude_defaults=True) for spec in expansion.tools])
        if expansion.server is not None:
            servers = _section(out, "mcp_servers")
            if name in servers:
                raise _fail(source, f"mcp_servers.{name}", f"is the {name} connector's server: rename yours")
            servers[name] = expansion.server
    for agent_name, names in enabled.items():
        if not names:
            continue
        body = agents[agent_name]
        declared = {str(n).upper() for n in (_section(_section(body, "egress"), "secrets"))}
        for name in names:
            expansion = expansions[name]
            hosts = ", ".join(expansion.hosts)
            for setting, secret in expansion.secrets.items():
                if secrets is not None and secret not in declared and secret not in {s.upper() for s in secrets}:
                    raise _fail(
                        source,
                        f"connectors.{name}.{setting}",
                        f"names the egress secret {secret}, which agent {agent_name!r} does not have: declare it "
                        f"under agents.{agent_name}.egress.secrets ({{env: VARIABLE, domains: [{hosts}]}}) or as "
                        f"SWITCHBOARD_EGRESS__SECRETS__{secret}__VALUE",
                    )
            if "tools" not in body:
                body["tools"] = list(default_tools)
            _append(body, "tools", [spec.name for spec in expansion.tools])
            _append(_section(body, "egress"), "allow", expansion.hosts)
            _append(_section(body, "policy"), "rules", expansion.rules())
            listed = body.get("mcp") or []
            if expansion.server is not None and not any(_server_of(entry) == name for entry in listed):
                _append(body, "mcp", [name])
    return out
