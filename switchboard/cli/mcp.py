"""``switchboard mcp tools SERVER`` / ``mcp accept SERVER [TOOL]``: review and pin an MCP server's tools.

``tools`` connects to the server and lists each announced tool with its hash and how it stands against the pins
(``new``, ``accepted``, ``changed``, ``removed``), the description shown as the server's text. ``accept`` pins the
server's identity and its tools (or one tool); workers offer what was accepted from their next start.
"""

from __future__ import annotations

import asyncio
import functools
import re
import sys

from pydantic import SecretStr

from switchboard.core.tools.mcp.client import McpClients
from switchboard.core.tools.mcp.config import TOOL_NAME_PATTERN
from switchboard.core.tools.mcp.pins import PinStore, tool_sha256, tool_status
from switchboard.egress.addresses import AddressGuard
from switchboard.egress.sockets import guarded_http_client
from switchboard.settings import Settings

__all__ = ["mcp_command", "mcp_secrets", "pin_store"]


def pin_store(settings: Settings) -> PinStore:
    """The operator's pins: ``<data dir>/mcp/pins.json``."""
    return PinStore(settings.data_path / "mcp" / "pins.json")


def mcp_secrets(settings: Settings) -> dict[str, SecretStr]:
    """The egress secrets a stdio server's ``{{secret:NAME}}`` may name: the deployment's, and the agents' own.

    Servers are shared by the worker's agents, so an agent's secret is offered only when no other agent binds the
    same name to another value (an ambiguous name is left out, and a server that needs it fails to start, saying so).
    """
    found = {name.upper(): secret.value for name, secret in settings.egress.secrets.items()}
    seen: dict[str, set[str]] = {}
    for agent in settings.file.agents.values():
        for name, binding in agent.egress.secrets.items():
            value = settings.environ.get(binding.env)
            if value:
                seen.setdefault(name.upper(), set()).add(value)
    for name, values in seen.items():
        if name not in found and len(values) == 1:
            found[name] = SecretStr(values.pop())
    return found


def _clients(settings: Settings, server: str) -> McpClients:
    guard = AddressGuard(settings.egress.internal_networks)
    return McpClients(
        {server: settings.file.mcp_servers[server]},
        http_client=functools.partial(guarded_http_client, guard),
        errlog=sys.stderr,
        secrets=mcp_secrets(settings),
    )


async def _tools(settings: Settings, server: str) -> int:
    clients = _clients(settings, server)
    try:
        connection = clients.get(server)
        announced = await connection.tools()
    finally:
        await clients.aclose()
    pins = pin_store(settings).server(server)
    if pins is not None and pins.identity != connection.identity:
        print(f"the server is not the one accepted before (was {pins.identity}); every tool needs accepting again")
        pins = None
    print(f"server:   {server}\nidentity: {connection.identity}")
    print(f"{'TOOL':<28} {'STATUS':<9} SHA256")
    for tool in announced:
        status = tool_status(pins, tool)
        usable = "" if re.match(TOOL_NAME_PATTERN, tool.name) else "  (name not usable: never offered)"
        print(f"{tool.name:<28} {status:<9} {tool_sha256(tool)[:16]}{usable}")
        text = (tool.description or "").replace("\n", " ")
        print(f"    description (the server's text, untrusted): {text[:300]!r}")
    for name in sorted(set(pins.tools if pins else ()) - {t.name for t in announced}):
        print(f"{name:<28} {'removed':<9}")
    return 0


async def _accept(settings: Settings, server: str, tool: str | None) -> int:
    clients = _clients(settings, server)
    try:
        connection = clients.get(server)
        announced = await connection.tools()
    finally:
        await clients.aclose()
    try:
        accepted = pin_store(settings).accept(server, connection.identity, announced, only=tool)
    except KeyError:
        print(f"switchboard: {server} announces no tool {tool!r}", file=sys.stderr)
        return 1
    print(
        f"accepted {len(accepted)} tool(s) of {server}: {', '.join(accepted)} "
        "(workers offer them from their next start)"
    )
    return 0


def mcp_command(settings: Settings, action: str, server: str, tool: str | None) -> int:
    """Run ``mcp tools`` or ``mcp accept``; the exit status."""
    if server not in settings.file.mcp_servers:
        known = ", ".join(sorted(settings.file.mcp_servers)) or "none"
        print(f"switchboard: no MCP server {server!r} in mcp_servers (configured: {known})", file=sys.stderr)
        return 2
    if action == "tools":
        return asyncio.run(_tools(settings, server))
    return asyncio.run(_accept(settings, server, tool))
