"""Client sessions to MCP servers: one per worker per server, opened on first use, reopened after a failure.

A server in the session's sandbox has one session (and process) per agent and session instead.

The SDK's transports are task-scoped (anyio task groups), so each session lives in a task of its own that opens it,
serves calls from any task until it is closed, and then closes it in the task that opened it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client
from pydantic import SecretStr

from switchboard.core.tools.mcp.config import (
    SECRET_PLACEHOLDER,
    HttpServer,
    McpServer,
    StdioServer,
    file_sha256,
    identity,
    program_file,
)
from switchboard.core.tools.mcp.sandbox import Scope, sandboxed_stdio
from switchboard.core.workspaces.disk import make_private_dir
from switchboard.errors import ToolError
from switchboard.sandbox.runner import EgressAccess, Sandbox
from switchboard.tracing import span

if TYPE_CHECKING:
    import httpx2

    from switchboard.core.tools.builtin.shell import EgressGate

__all__ = ["HttpClients", "McpClients", "McpConnection", "SandboxHost", "Scope", "sandboxed"]

logger = logging.getLogger(__name__)

HttpClients = Callable[[], "httpx2.AsyncClient"]
"""Makes the HTTP client of one session (the egress layer's, whose connections pass its address checks)."""

_LISTED_PAGES = 20
"""Most pages of ``tools/list`` read (a server that pages forever is cut off)."""


def sandboxed(server: McpServer) -> bool:
    """Whether ``server`` runs in the session's sandbox (one process per agent and session)."""
    return isinstance(server, StdioServer) and server.sandbox


@dataclass(frozen=True, slots=True)
class SandboxHost:
    """What a server in the session's sandbox needs of the worker: its sandbox (or why it has none), its egress."""

    sandbox: Sandbox | None = None
    no_sandbox: str = "no sandbox works on this host"
    """Why :attr:`sandbox` is ``None`` (``switchboard check`` says more)."""
    egress: EgressGate | None = None
    """The worker's egress proxy (``None``: sandboxed servers have no network)."""

    def refusal(self, name: str) -> str | None:
        """Why server ``name`` cannot run in a sandbox here, or ``None`` when it can."""
        if self.sandbox is not None and self.sandbox.kind == "bwrap":
            return None
        why = self.no_sandbox if self.sandbox is None else f"its sandbox is {self.sandbox.label}, not bubblewrap"
        return (
            f"the MCP server {name} runs only in a sandbox (sandbox: true) and this host cannot run it: {why} "
            "(see `switchboard check`); it is never started unsandboxed"
        )


class McpConnection:
    """The worker's session with one server."""

    def __init__(
        self,
        name: str,
        server: StdioServer | HttpServer,
        *,
        http_client: HttpClients | None = None,
        errlog: TextIO | None = None,
        host: SandboxHost | None = None,
        scope: Scope | None = None,
        secrets: Mapping[str, SecretStr] | None = None,
    ) -> None:
        self.name = name
        self.server = server
        self._http_client = http_client
        self._secrets = dict(secrets or {})
        self._errlog = errlog
        self._host = host or SandboxHost()
        self._scope = scope
        """The session a sandboxed server serves."""
        self.used = time.monotonic()
        """When the connection was last handed out (idle sandboxed sessions are closed)."""
        self.grant = ""
        """The token of a sandboxed server's egress grant (empty: none): hidden in what the server returns."""
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._abandoned: set[asyncio.Task[None]] = set()
        """Sessions given up after a cancelled call, still closing (their process is stopped) in the background."""
        self._session: ClientSession | None = None
        self._tools: list[types.Tool] = []
        self.identity = ""
        """The identity of the server as last connected (see :func:`.config.identity`)."""

    async def tools(self, *, refresh: bool = False) -> list[types.Tool]:
        """The tools the server announces: as listed when the session was opened, or listed again (``refresh``).

        A call lists them again first, so that a tool changed in the middle of a session is caught before it runs.

        Raises:
            ToolError: the session failed (``transient``).
        """
        session = await self._open()
        if refresh:
            try:
                self._tools = await _list_tools(session)
            except asyncio.CancelledError:  # the gateway's timeout: the server may never answer this session again
                self._abandon(session)
                raise
            except Exception as exc:
                await self.aclose()
                raise ToolError(
                    f"the MCP server {self.name} failed: {type(exc).__name__}", error_class="transient"
                ) from exc
        return list(self._tools)

    async def call(self, tool: str, arguments: dict[str, Any], *, write: bool = False) -> types.CallToolResult:
        """Call one tool; a failed session is dropped so that the next call opens a new one.

        Raises:
            ToolError: the session failed: ``transient`` (the call may be made again on a new session), or for a
                ``write`` that was sent, ``ambiguous_timeout`` (the server may have done it before it failed).
        """
        session = await self._open()
        try:
            return await session.call_tool(tool, arguments, read_timeout_seconds=self.server.timeout_s)
        except asyncio.CancelledError:  # the gateway's timeout (or the turn's end): the server may be stuck in it
            self._abandon(session)
            raise
        except Exception as exc:
            await self.aclose()
            if write:
                raise ToolError(
                    f"the MCP server {self.name} failed during the call ({type(exc).__name__}): "
                    "it may have happened; do not repeat it, tell the user",
                    error_class="ambiguous_timeout",
                ) from exc
            raise ToolError(
                f"the MCP server {self.name} failed: {type(exc).__name__}", error_class="transient"
            ) from exc

    async def _open(self) -> ClientSession:
        async with self._lock:
            if self._task is not None and not self._task.done() and self._session is not None:
                return self._session
            await self._close_locked()
            self._stop = asyncio.Event()
            ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self._serve(ready, self._stop), name=f"mcp:{self.name}")
            try:
                async with asyncio.timeout(self.server.connect_timeout_s):
                    self._session = await asyncio.shield(ready)
            except TimeoutError:
                await self._close_locked()
                raise ToolError(f"the MCP server {self.name} did not answer in time", error_class="transient") from None
            except ToolError:
                await self._close_locked()
                raise
            return self._session

    async def _serve(self, ready: asyncio.Future[ClientSession], stop: asyncio.Event) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                with span("mcp.connect", mcp__server=self.name, mcp__transport=self.server.transport):
                    streams = await stack.enter_async_context(await self._transport(stack))
                    session = await stack.enter_async_context(ClientSession(*streams))
                    await session.initialize()
                    self._tools = await _list_tools(session)
                ready.set_result(session)
                await stop.wait()
        except Exception as exc:
            logger.warning("MCP server %s: session ended: %s", self.name, type(exc).__name__)
            if not ready.done():
                refused = _refusal(exc)
                ready.set_exception(
                    exc
                    if isinstance(exc, ToolError)
                    else ToolError(
                        f"the MCP server {self.name} could not be reached" + (f": {refused}" if refused else ""),
                        error_class="transient",
                    )
                )
        finally:
            if self._task is asyncio.current_task():  # not a session given up since, whose successor may be open
                self._session = None

    async def _transport(self, stack: contextlib.AsyncExitStack) -> contextlib.AbstractAsyncContextManager[Any]:
        server = self.server
        self.identity = await asyncio.to_thread(identity, server)  # hashes the program file: off the event loop
        if isinstance(server, StdioServer):
            if server.digest is not None and not await asyncio.to_thread(_digest_matches, server, server.digest):
                raise ToolError(f"the MCP server {self.name}'s program does not match its configured digest")
            if server.sandbox:
                return await self._sandboxed(server, stack)
            params = StdioServerParameters(
                command=server.command[0],
                args=server.command[1:],
                env={**get_default_environment(), **self._env(server)},
                cwd=server.cwd,
            )
            return stdio_client(params, errlog=self._errlog or sys.stderr)
        if self._http_client is None:
            return streamable_http_client(server.url)
        client = await stack.enter_async_context(self._http_client())
        return streamable_http_client(server.url, http_client=client)

    async def _sandboxed(
        self, server: StdioServer, stack: contextlib.AsyncExitStack
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        refused = self._host.refusal(self.name)
        if refused is not None:
            raise ToolError(refused, error_class="permanent")
        assert self._host.sandbox is not None
        scope = self._scope
        if scope is None:
            raise ToolError(f"the MCP server {self.name} runs in a session's sandbox: it serves sessions only")
        access: EgressAccess | None = None
        if self._host.egress is not None and scope.agent:  # the grant lives as long as the process
            granted = await stack.enter_async_context(self._host.egress.access(scope.agent, scope.session))
            access = granted if isinstance(granted, EgressAccess) else None
        self.grant = access.token if access is not None else ""
        workspace = await asyncio.to_thread(make_private_dir, scope.workspace)
        return sandboxed_stdio(
            self._host.sandbox,
            server.model_copy(update={"env": self._env(server)}),
            workspace,
            egress=access,
            errlog=self._errlog or sys.stderr,
        )

    def _env(self, server: StdioServer) -> dict[str, str]:
        """``server.env`` with each ``{{secret:NAME}}`` replaced by the egress secret's value.

        Raises:
            ToolError: a secret it names is not configured.
        """

        def value(variable: str, match: re.Match[str]) -> str:
            secret = self._secrets.get(match.group(1).upper())
            if secret is None:
                raise ToolError(
                    f"the MCP server {self.name} needs the egress secret {match.group(1).upper()} for ${variable}, "
                    f"which is not set (SWITCHBOARD_EGRESS__SECRETS__{match.group(1).upper()}__VALUE)"
                )
            return secret.get_secret_value()

        return {
            variable: SECRET_PLACEHOLDER.sub(functools.partial(value, variable), text)
            for variable, text in server.env.items()
        }

    async def _close_locked(self) -> None:
        task, self._task = self._task, None
        self._session = None
        if task is not None:
            self._stop.set()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 10.0)

    def _abandon(self, session: ClientSession) -> None:
        """Give ``session`` up without waiting (a call on it was cancelled): the next call opens a new one.

        A server stuck in a call, or writing an answer without end, would otherwise hold the session for good: every
        later call would wait behind it, and its reader would keep the worker busy. The old session closes (its
        process stopped) in the background.
        """
        if self._session is not session:  # given up or replaced already
            return
        task, self._task = self._task, None
        self._session = None
        self._stop.set()
        if task is not None and not task.done():
            self._abandoned.add(task)
            task.add_done_callback(self._abandoned.discard)

    async def aclose(self) -> None:
        """End the session (and a stdio server's process), and wait for the sessions given up to close."""
        async with self._lock:
            await self._close_locked()
        for task in list(self._abandoned):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 10.0)


def _digest_matches(server: StdioServer, digest: str) -> bool:
    found = program_file(server)
    return found is not None and file_sha256(found) == digest


def _refusal(exc: BaseException) -> str | None:
    """The first network error in ``exc`` (an exception group's leaves included), as said to the operator."""
    if isinstance(exc, BaseExceptionGroup):
        return next((found for inner in exc.exceptions if (found := _refusal(inner))), None)
    if isinstance(exc, OSError) and str(exc):
        return str(exc)
    return _refusal(exc.__cause__) if exc.__cause__ is not None else None


async def _list_tools(session: ClientSession) -> list[types.Tool]:
    listed: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(_LISTED_PAGES):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        listed.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return listed


class McpClients:
    """The worker's connections to every configured server, by name (and by agent and session when sandboxed).

    Sandboxed sessions idle past ``idle_s``, and the least recently used beyond ``max_sandboxed``, are closed
    (their processes end; the next call starts a new one).
    """

    def __init__(
        self,
        servers: Mapping[str, McpServer],
        *,
        http_client: HttpClients | None = None,
        errlog: TextIO | None = None,
        host: SandboxHost | None = None,
        max_sandboxed: int = 16,
        idle_s: float = 600.0,
        secrets: Mapping[str, SecretStr] | None = None,
    ) -> None:
        """Connect nothing yet; ``secrets``: the egress secrets by upper-case name (for ``{{secret:NAME}}`` in env)."""
        self.servers = dict(servers)
        self.host = host or SandboxHost()
        self._http_client = http_client
        self._errlog = errlog
        self._secrets = dict(secrets or {})
        self._connections = {
            name: McpConnection(name, server, http_client=http_client, errlog=errlog, secrets=secrets)
            for name, server in servers.items()
            if not sandboxed(server)
        }
        self._sessions: OrderedDict[tuple[str, str, str], McpConnection] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        self.max_sandboxed = max_sandboxed
        self.idle_s = idle_s

    def get(self, name: str) -> McpConnection:
        """The connection to server ``name`` (a host process or an HTTP server).

        Raises:
            KeyError: no such server is configured, or it runs in a session's sandbox (see :meth:`connection`).
        """
        return self._connections[name]

    def connection(self, name: str, scope: Scope) -> McpConnection:
        """The connection serving ``scope`` with server ``name``: the worker's, or the session's own when sandboxed.

        Raises:
            KeyError: no such server is configured.
        """
        server = self.servers[name]
        if not sandboxed(server):
            return self._connections[name]
        now = time.monotonic()
        key = (name, scope.agent, scope.session)
        found = self._sessions.pop(key, None)
        for stale in [k for k, c in self._sessions.items() if now - c.used > self.idle_s]:
            self._close_later(self._sessions.pop(stale))
        while len(self._sessions) >= self.max_sandboxed:
            self._close_later(self._sessions.popitem(last=False)[1])
        if found is None:
            found = McpConnection(name, server, errlog=self._errlog, host=self.host, scope=scope, secrets=self._secrets)
        found.used = now
        self._sessions[key] = found
        return found

    def _close_later(self, connection: McpConnection) -> None:
        task = asyncio.get_running_loop().create_task(connection.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Close every session."""
        for connection in [*self._connections.values(), *self._sessions.values()]:
            await connection.aclose()
        self._sessions.clear()
        if self._closing:
            await asyncio.wait(list(self._closing))
