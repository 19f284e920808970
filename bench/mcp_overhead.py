"""MCP call overhead (issue #23): a tool call through Switchboard's gateway vs the SDK's own client, side by side.

The same local server (``config/demo/mcp_server.py``, its ``add`` tool) is called, over stdio and over streamable
HTTP, by:

- **SDK**: the official ``mcp`` SDK's ``ClientSession.call_tool`` on its own transport (the baseline);
- **Switchboard**: ``ToolGateway.call("demo__add", …)``: validation against the accepted schema, policy, the pinning
  check (the server's tools listed again and compared with what the operator accepted: a ``tools/list`` round trip
  before every call), the call on the worker's session, the result wrapped as untrusted data;
- over stdio, where bubblewrap runs, also the same through a server in the session's sandbox (``sandbox: true``).

Calls alternate one by one between the clients (each with its own session, opened before timing), so the machine's
noise falls on both alike; the figure is the median latency of one call, and the ratio Switchboard ÷ SDK.

    python -m bench.mcp_overhead
    python -m bench.mcp_overhead --quick
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from bench._harness import (
    REPO,
    SUMMARY_HEADERS,
    Row,
    fmt,
    free_port,
    median,
    parser,
    percentile,
    render_table,
    verdicts,
)
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.tools.mcp.client import McpClients, SandboxHost, Scope
from switchboard.core.tools.mcp.config import HttpServer, McpServer, StdioServer, identity
from switchboard.core.tools.mcp.pins import PinStore
from switchboard.core.tools.mcp.tools import mcp_tools
from switchboard.egress.addresses import AddressGuard
from switchboard.egress.sockets import guarded_http_client
from switchboard.sandbox.detect import choose_now
from switchboard.types import SessionKey

SERVER = REPO / "config" / "demo" / "mcp_server.py"
ARGUMENTS = {"a": 2, "b": 40}
SESSION = SessionKey("default/a/web/main/bench")

Call = Callable[[], Awaitable[Any]]


@contextlib.asynccontextmanager
async def sdk_session(transport: str, url: str, errlog: TextIO) -> AsyncIterator[Call]:
    """The SDK's own client: one session, ``call_tool("add", …)``."""
    async with contextlib.AsyncExitStack() as stack:
        if transport == "stdio":
            params = StdioServerParameters(command=sys.executable, args=[str(SERVER), "stdio"])
            streams = await stack.enter_async_context(stdio_client(params, errlog=errlog))
        else:
            streams = await stack.enter_async_context(streamable_http_client(url))
        session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
        await session.initialize()

        async def call() -> Any:
            result = await session.call_tool("add", ARGUMENTS)
            assert not result.is_error and result.structured_content == {"result": 42}, result

        yield call


@contextlib.asynccontextmanager
async def gateway_session(
    server: McpServer, root: Path, errlog: TextIO, host: SandboxHost | None = None
) -> AsyncIterator[Call]:
    """Switchboard: the accepted tool ``demo__add`` through the tool gateway, as a turn calls it."""
    guard = functools.partial(guarded_http_client, AddressGuard(["127.0.0.0/8"]))
    clients = McpClients({"demo": server}, http_client=guard, errlog=errlog, host=host)
    try:
        scope = Scope("a", SESSION, root / "ws")
        pins = PinStore(root / "pins.json")
        pins.accept("demo", identity(server), await clients.connection("demo", scope).tools())
        registry = default_registry()
        for tool in mcp_tools(clients.servers, pins, clients):
            registry.register(tool)
        gateway = ToolGateway(registry, workspace_root=root / "ws")
        counter = iter(range(10**9))

        async def call() -> Any:
            n = next(counter)
            ctx = ToolContext(
                session_key=SESSION,
                tenant="default",
                run_id=f"run-{n}",
                actor="u1",
                workspace=root / "ws",
                idempotency_key=f"bench-{n}",
                agent="a",
            )
            outcome = await gateway.call("demo__add", dict(ARGUMENTS), ctx)
            assert outcome.ok and "42" in str(outcome.value), outcome

        yield call
    finally:
        await clients.aclose()


@contextlib.contextmanager
def http_server() -> Any:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


async def alternate(calls: dict[str, Call], n: int, warmup: int) -> dict[str, list[float]]:
    """Milliseconds of each call, the clients taking turns call by call."""
    for _ in range(warmup):
        for call in calls.values():
            await call()
    timings: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(n):
        for name, call in calls.items():
            started = time.perf_counter()
            await call()
            timings[name].append((time.perf_counter() - started) * 1000)
    return timings


async def run(argv: list[str] | None = None) -> list[Row]:
    """Run the benchmark, print its table, return the summary rows."""
    ns = parser(__doc__.splitlines()[0] if __doc__ else "mcp_overhead").parse_args(argv)
    n = ns.rounds * 100 if ns.rounds else (20 if ns.quick else 300)
    warmup = 3 if ns.quick else 20
    choice = choose_now("bwrap")
    print(f"mcp_overhead: {n} calls of each client per transport (after {warmup} warm-up calls)", flush=True)
    table: list[tuple[str, ...]] = []
    rows: list[Row] = []
    # the servers' stderr goes nowhere (the SDK's server logs every request)
    with (
        tempfile.TemporaryDirectory(prefix="sb-bench-mcp-") as tmp,
        http_server() as url,
        open(os.devnull, "w") as quiet,
    ):
        root = Path(tmp)
        stdio = StdioServer(transport="stdio", command=[sys.executable, str(SERVER), "stdio"], reads=["add"])
        plans: list[tuple[str, McpServer, SandboxHost | None]] = [
            ("stdio", stdio, None),
            ("streamable HTTP", HttpServer(transport="http", url=url, reads=["add"]), None),
        ]
        if choice.sandbox is not None:
            boxed = stdio.model_copy(update={"sandbox": True})
            plans.append(("stdio, server in the session's sandbox (bwrap)", boxed, SandboxHost(choice.sandbox)))
        else:
            print(f"(no sandboxed row: no bubblewrap here: {choice.reasons})")
        for index, (label, server, host) in enumerate(plans):
            transport = "stdio" if isinstance(server, StdioServer) else "http"
            async with (
                sdk_session(transport, url, quiet) as sdk,
                gateway_session(server, root / str(index), quiet, host) as ours,
            ):
                timings = await alternate({"sdk": sdk, "ours": ours}, n, warmup)
            base, mine = median(timings["sdk"]), median(timings["ours"])
            table.append(
                (
                    label,
                    fmt(base, 2),
                    fmt(mine, 2),
                    fmt(percentile(timings["sdk"], 95), 2),
                    fmt(percentile(timings["ours"], 95), 2),
                    f"{mine / base:.2f}×",
                )
            )
            rows.append(Row("mcp_overhead", f"MCP call, {label}: Switchboard ÷ SDK", f"{mine / base:.2f}×", "—", None))
    print(
        render_table(
            f"One MCP tool call (`add`), median of {n} alternating calls, ms",
            ("transport", "SDK p50", "Switchboard p50", "SDK p95", "Switchboard p95", "ratio (p50)"),
            table,
        )
    )
    rows = verdicts(rows, ns.quick)
    print(render_table("summary", SUMMARY_HEADERS, [row.cells() for row in rows]))
    return rows


if __name__ == "__main__":
    asyncio.run(run())
