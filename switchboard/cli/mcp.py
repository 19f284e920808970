"""``switchboard mcp tools SERVER`` / ``mcp accept SERVER [TOOL]``: review and pin an MCP server's tools.

``tools`` connects to the server and lists each announced tool with its hash and how it stands against the pins
(``new``, ``accepted``, ``changed``, ``removed``), the description shown as the server's text. ``accept`` pins the
server's identity and its tools (or one tool); workers offer what was accepted from their next start.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcp import types
from pydantic import SecretStr

from switchboard.cli.sandbox import startup_choice
from switchboard.core.tools.mcp.client import McpClients, McpConnection, SandboxHost, Scope, sandboxed
from switchboard.core.tools.mcp.config import TOOL_NAME_PATTERN
from switchboard.core.tools.mcp.pins import PinStore, tool_sha256, tool_status
from switchboard.egress.addresses import AddressGuard
from switchboard.egress.sockets import guarded_http_client
from switchboard.errors import ToolError
from switchboard.settings import Settings

if TYPE_CHECKING:
    from switchboard.core.tools.builtin.shell import EgressGate

__all__ = ["clients_command", "mcp_command", "mcp_secrets", "pin_store", "sandbox_host", "serve_command"]

logger = logging.getLogger(__name__)


def pin_store(settings: Settings) -> PinStore:
    """The operator's pins: ``<data dir>/mcp/pins.json``."""
    return PinStore(settings.data_path / "mcp" / "pins.json")


def sandbox_host(settings: Settings, egress: EgressGate | None = None) -> SandboxHost:
    """The sandbox servers with ``sandbox: true`` run in (the ``shell`` tool's), or why there is none.

    Logs a warning when some server asks for a sandbox this host cannot give (its calls are refused).
    """
    choice = startup_choice(settings)
    why = choice.reasons[0] if choice.reasons else "no sandbox works on this host"
    host = SandboxHost(choice.sandbox, why, egress)
    for name, server in settings.file.mcp_servers.items():
        if sandboxed(server) and (refused := host.refusal(name)) is not None:
            logger.warning("%s", refused)
    return host


def _reviewed(settings: Settings, server: str) -> Path:
    """Where ``mcp tools`` records what it listed (identity, each tool's hash), for ``mcp accept`` to hold to."""
    return settings.data_path / "mcp" / "reviewed" / f"{server}.json"


def _shown(name: str) -> str:
    """A tool name as printed: the server's text, escaped when it holds control characters.

    A terminal would act on them: move the cursor up and erase the lines of another tool under review.
    """
    return name if name.isprintable() else repr(name)


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
        host=sandbox_host(settings),
        secrets=mcp_secrets(settings),
    )


async def _announced(settings: Settings, server: str) -> tuple[McpConnection, list[types.Tool]]:
    """The server's tools as it announces them; a sandboxed one is started over a scratch workspace, no network."""
    clients = _clients(settings, server)
    with tempfile.TemporaryDirectory(prefix="sb-mcp-") as scratch:
        connection = clients.connection(server, Scope("", "mcp-cli", Path(scratch) / "workspace"))
        try:
            return connection, await connection.tools()
        finally:
            await clients.aclose()


async def _tools(settings: Settings, server: str) -> int:
    connection, announced = await _announced(settings, server)
    pins = pin_store(settings).server(server)
    if pins is not None and pins.identity != connection.identity:
        print(f"the server is not the one accepted before (was {pins.identity}); every tool needs accepting again")
        pins = None
    print(f"server:   {server}\nidentity: {connection.identity}")
    print(f"{'TOOL':<28} {'STATUS':<9} SHA256")
    for tool in announced:
        status = tool_status(pins, tool)
        usable = "" if re.match(TOOL_NAME_PATTERN, tool.name) else "  (name not usable: never offered)"
        print(f"{_shown(tool.name):<28} {status:<9} {tool_sha256(tool)[:16]}{usable}")
        text = (tool.description or "").replace("\n", " ")
        print(f"    description (the server's text, untrusted): {text[:300]!r}")
        print(
            f"    arguments (the server's schema, untrusted): {json.dumps(tool.input_schema, sort_keys=True)[:500]!r}"
        )
    for name in sorted(set(pins.tools if pins else ()) - {t.name for t in announced}):
        print(f"{_shown(name):<28} {'removed':<9}")
    record = _reviewed(settings, server)
    record.parent.mkdir(parents=True, exist_ok=True)
    listed = {"identity": connection.identity, "tools": {t.name: tool_sha256(t) for t in announced}}
    record.write_text(json.dumps(listed, sort_keys=True))
    return 0


async def _accept(settings: Settings, server: str, tool: str | None) -> int:
    connection, announced = await _announced(settings, server)
    try:
        listed = json.loads(_reviewed(settings, server).read_text())
    except (OSError, ValueError):
        listed = None  # never listed here: nothing to hold the server to
    if isinstance(listed, dict):  # accept what the operator was shown, not what the server announces a moment later
        seen = listed.get("tools") if listed.get("identity") == connection.identity else {}
        changed = [
            t.name
            for t in announced
            if (tool is None or t.name == tool) and (not isinstance(seen, dict) or seen.get(t.name) != tool_sha256(t))
        ]
        if changed:
            names = ", ".join(map(_shown, changed))
            print(
                f"switchboard: {names} changed since `switchboard mcp tools {server}` listed it: nothing accepted; "
                "list the tools again and review them",
                file=sys.stderr,
            )
            return 1
    try:
        accepted = pin_store(settings).accept(server, connection.identity, announced, only=tool)
    except KeyError:
        print(f"switchboard: {server} announces no tool {tool!r}", file=sys.stderr)
        return 1
    print(
        f"accepted {len(accepted)} tool(s) of {server}: {', '.join(map(_shown, accepted))} "
        "(workers offer them from their next start)"
    )
    return 0


def mcp_command(settings: Settings, action: str, server: str, tool: str | None) -> int:
    """Run ``mcp tools`` or ``mcp accept``; the exit status."""
    if server not in settings.file.mcp_servers:
        known = ", ".join(sorted(settings.file.mcp_servers)) or "none"
        print(f"switchboard: no MCP server {server!r} in mcp_servers (configured: {known})", file=sys.stderr)
        return 2
    try:
        if action == "tools":
            return asyncio.run(_tools(settings, server))
        return asyncio.run(_accept(settings, server, tool))
    except ToolError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 1


# ---------------------------------------------------------------- Switchboard as an MCP server


def clients_command(settings: Settings, action: str, name: str | None, tenant: str) -> int:
    """``mcp clients add NAME|list|remove NAME``: the clients of ``mcp serve``; ``add`` prints the token once."""
    from switchboard.cli.sessions import redis_url_for, with_redis
    from switchboard.queue.mcpclients import McpClientStore
    from switchboard.web.api.tokens import new_token, token_hash

    if action in {"add", "remove"} and not name:
        print(f"switchboard: `mcp clients {action}` needs the client's NAME", file=sys.stderr)
        return 2

    async def body(redis: Any) -> int:
        store = McpClientStore(redis)
        if action == "list":
            clients = await store.of_tenant(tenant)
            for client in clients:
                print(f"{client.name:<24} tenant={client.tenant}  sha256={client.sha256[:12]}…")
            if not clients:
                print(f"no MCP clients for tenant {tenant!r} (add one: switchboard mcp clients add NAME)")
            return 0
        assert name is not None
        if action == "remove":
            if not await store.remove(tenant, name):
                print(f"switchboard: tenant {tenant!r} has no MCP client {name!r}", file=sys.stderr)
                return 1
            print(f"removed MCP client {name!r} of tenant {tenant!r}: its token is refused from now on")
            return 0
        token = new_token()
        try:
            await store.add(tenant, name, token_hash(token))
        except ValueError as err:
            print(f"switchboard: {err}", file=sys.stderr)
            return 2
        print(token)
        print(
            f"\nThe token above is shown only now (Redis keeps its SHA-256). Client {name!r} reaches the agents of "
            f"tenant {tenant!r}: over HTTP at /mcp with 'Authorization: Bearer <token>', or over stdio with "
            f"`switchboard mcp serve --client {name}` and SWITCHBOARD_MCP_SERVE__TOKEN.",
            file=sys.stderr,
        )
        return 0

    return with_redis(redis_url_for(settings), body)


def serve_command(settings: Settings, client_name: str, token: str | None) -> int:
    """``mcp serve --client NAME``: serve the client's tenant's agents over stdio until the client hangs up."""
    presented = token or (settings.mcp_serve.token.get_secret_value() if settings.mcp_serve.token else "")
    if not presented:
        print("switchboard: give the client's token in SWITCHBOARD_MCP_SERVE__TOKEN (or --token)", file=sys.stderr)
        return 2
    from switchboard.cli.sessions import redis_url_for, with_redis

    return with_redis(redis_url_for(settings), functools.partial(_serve_stdio, settings, client_name, presented))


async def _serve_stdio(settings: Settings, client_name: str, token: str, redis: Any) -> int:
    from switchboard.channels.registry import account_configs, configured_factories
    from switchboard.core.tools.builtin import default_registry
    from switchboard.queue.ingest import Ingestor
    from switchboard.queue.mcpclients import McpClientStore
    from switchboard.queue.router import IngestRouter
    from switchboard.web.api.tokens import MAX_TOKEN_CHARS, token_hash
    from switchboard.web.mcpserve.server import build_server
    from switchboard.web.mcpserve.service import McpService

    client = None
    if len(token) <= MAX_TOKEN_CHARS and token.isascii():
        client = await McpClientStore(redis).find(token_hash(token))
    if client is None or client.name != client_name:
        print(f"switchboard: the token is not MCP client {client_name!r}'s (see `mcp clients list`)", file=sys.stderr)
        return 2
    accounts = [
        (found.name, config.account)
        for found in configured_factories(settings)
        for config in account_configs(settings, found, settings.environ or None)
    ]
    router = IngestRouter(Ingestor(redis, settings.queue, settings.limits), settings.file, accounts)
    service = McpService(redis, router, wait_s=settings.mcp_serve.wait_s, tool_names=default_registry().names())
    await build_server(service, client).run_stdio_async()
    return 0
