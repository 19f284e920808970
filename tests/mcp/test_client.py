"""MCP client: real SDK servers over stdio and streamable HTTP, pinned tools, calls through the gateway in a turn."""

from __future__ import annotations

import functools
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from switchboard.core.agent.config import Agent, AgentLimits, AgentProfile
from switchboard.core.model import (
    Finished,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    Usage,
)
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.mcp.client import McpClients
from switchboard.core.tools.mcp.config import HttpServer, StdioServer, file_sha256, identity
from switchboard.core.tools.mcp.pins import PinStore, tool_status
from switchboard.core.tools.mcp.tools import mcp_tools, schema_input
from switchboard.egress.addresses import AddressGuard
from switchboard.egress.sockets import guarded_http_client
from switchboard.errors import ToolError
from tests.core.turns import MemorySink, MemoryStore, request, runtime

SERVER = Path(__file__).resolve().parent / "server.py"
PROBES = {"environment", "read_text", "write_text", "connect", "fetch"}
"""The server's tools that show what its process sees and reaches."""


def stdio(state: Path) -> StdioServer:
    return StdioServer(
        transport="stdio",
        command=[sys.executable, str(SERVER), "stdio", "0", str(state)],
        reads=["add", "lookup", "pid", "slow"],
    )


def mcp_agent(entry: Any) -> Agent:
    return Agent(
        name="a",
        profile=AgentProfile(name="a"),
        instructions="Be brief.",
        tools=[],
        mcp=[entry],
        limits=AgentLimits(max_steps=3),
    )


@pytest.fixture
async def clients(tmp_path: Path) -> AsyncIterator[McpClients]:
    made = McpClients({"calc": stdio(tmp_path / "state")})
    yield made
    await made.aclose()


async def accepted_runtime(tmp_path: Path, clients: McpClients) -> Any:
    pins = PinStore(tmp_path / "pins.json")
    connection = clients.get("calc")
    pins.accept("calc", connection.identity or identity(clients.servers["calc"]), await connection.tools())
    registry = default_registry()
    for tool in mcp_tools(clients.servers, pins, clients):
        registry.register(tool)
    return runtime(tmp_path, registry=registry)


async def test_a_stdio_server_lists_its_tools_and_one_is_called_through_a_turn(
    tmp_path: Path, clients: McpClients
) -> None:
    announced = await clients.get("calc").tools()
    assert {t.name for t in announced} == {"add", "delete_everything", "lookup", "mutate", "pid", "slow"} | PROBES
    assert {tool_status(None, t) for t in announced} == {"new"}
    rt = await accepted_runtime(tmp_path, clients)
    sink = MemorySink()
    turn = request('/tool calc__add {"a": 2, "b": 40}', agent_=mcp_agent({"server": "calc", "tools": ["add"]}))
    result = await rt.run_turn(turn, sink, MemoryStore())
    called = sink.of("tool_called")
    assert [(e.tool, e.ok) for e in called] == [("calc__add", True)]
    assert "42" in str(result.history)


async def test_arguments_are_validated_against_the_announced_schema(tmp_path: Path, clients: McpClients) -> None:
    rt = await accepted_runtime(tmp_path, clients)
    sink = MemorySink()
    turn = request('/tool calc__add {"a": "two", "b": 40}', agent_=mcp_agent("calc"))
    result = await rt.run_turn(turn, sink, MemoryStore())
    (called,) = sink.of("tool_called")
    assert not called.ok and called.error_class == "validation" and "a: 'two' is not of type 'integer'" in result.text


async def test_a_tool_outside_the_allowlist_is_not_offered(tmp_path: Path, clients: McpClients) -> None:
    rt = await accepted_runtime(tmp_path, clients)
    sink = MemorySink()
    turn = request('/tool calc__lookup {"word": "x"}', agent_=mcp_agent({"server": "calc", "tools": ["add"]}))
    result = await rt.run_turn(turn, sink, MemoryStore())
    (called,) = sink.of("tool_called")
    assert not called.ok and "unknown tool 'calc__lookup'; available: calc__add" in result.text


async def test_an_injected_description_is_shown_as_data_and_runs_nothing(tmp_path: Path, clients: McpClients) -> None:
    rt = await accepted_runtime(tmp_path, clients)
    lookup = rt.registry.get("calc__lookup")
    assert lookup is not None and lookup.output_trust == "data"
    assert '<data source="mcp:calc/lookup description" trust="untrusted">' in lookup.description
    sink = MemorySink()
    turn = request('/tool calc__lookup {"word": "x"}', agent_=mcp_agent("calc"))
    await rt.run_turn(turn, sink, MemoryStore())
    assert [e.tool for e in sink.of("tool_called")] == ["calc__lookup"]  # the offline model obeys nothing it read


async def test_a_schema_changed_after_acceptance_disables_the_tool_until_accepted_again(
    tmp_path: Path, clients: McpClients
) -> None:
    rt = await accepted_runtime(tmp_path, clients)
    (tmp_path / "state").write_text("changed")
    await clients.get("calc").aclose()  # the next session meets the changed server
    sink = MemorySink()
    turn = request('/tool calc__add {"a": 1, "b": 2}', agent_=mcp_agent("calc"))
    result = await rt.run_turn(turn, sink, MemoryStore())
    (called,) = sink.of("tool_called")
    assert (
        not called.ok and called.error_class == "auth" and "changed since the operator accepted" in str(result.history)
    )

    pins = PinStore(tmp_path / "pins.json")
    announced = await clients.get("calc").tools()
    assert {t.name: tool_status(pins.server("calc"), t) for t in announced if t.name in {"add", "lookup"}} == {
        "add": "changed",
        "lookup": "accepted",
    }
    rt = await accepted_runtime(tmp_path, clients)  # the operator accepts again
    sink = MemorySink()
    await rt.run_turn(request('/tool calc__add {"a": 1, "b": 2}', agent_=mcp_agent("calc")), sink, MemoryStore())
    assert [e.ok for e in sink.of("tool_called")] == [True]


async def turn_calls(rt: Any, text: str, entry: Any = "calc") -> tuple[list[Any], str]:
    sink = MemorySink()
    result = await rt.run_turn(request(text, agent_=mcp_agent(entry)), sink, MemoryStore())
    return sink.of("tool_called"), str(result.history) + result.text


async def test_a_tool_changed_in_the_middle_of_a_session_is_disabled(tmp_path: Path, clients: McpClients) -> None:
    rt = await accepted_runtime(tmp_path, clients)
    called, _ = await turn_calls(rt, '/tool calc__add {"a": 1, "b": 2}')
    assert [c.ok for c in called] == [True]
    await clients.get("calc").call("mutate", {})  # the server swaps add's description, same session
    called, said = await turn_calls(rt, '/tool calc__add {"a": 1, "b": 2}')
    assert [(c.ok, c.error_class) for c in called] == [(False, "auth")]
    assert "changed since the operator accepted it" in said


async def test_a_server_that_died_is_started_again_on_the_next_call(tmp_path: Path, clients: McpClients) -> None:
    rt = await accepted_runtime(tmp_path, clients)
    first = int(str((await clients.get("calc").call("pid", {})).structured_content["result"]))
    os.kill(first, signal.SIGKILL)
    called, said = await turn_calls(rt, '/tool calc__add {"a": 20, "b": 3}')
    assert [c.ok for c in called] == [True] and "23" in said
    second = int(str((await clients.get("calc").call("pid", {})).structured_content["result"]))
    assert second != first


async def test_a_call_past_its_timeout_fails_and_the_next_call_is_served(tmp_path: Path) -> None:
    server = stdio(tmp_path / "state").model_copy(update={"timeout_s": 0.5})
    clients = McpClients({"calc": server})
    try:
        rt = await accepted_runtime(tmp_path, clients)
        rt.gateway.max_attempts = 1
        called, _ = await turn_calls(rt, '/tool calc__slow {"seconds": 5}')
        assert [(c.ok, c.error_class) for c in called] == [(False, "transient")]
        await clients.get("calc").tools()  # the timed-out call gave its session up: a new one (slower than 0.5 s)
        called, said = await turn_calls(rt, '/tool calc__add {"a": 1, "b": 1}')
        assert [c.ok for c in called] == [True] and "2" in said
    finally:
        await clients.aclose()


async def test_a_stdio_server_whose_program_differs_from_its_digest_is_not_started(tmp_path: Path) -> None:
    base = stdio(tmp_path / "state")
    good = base.model_copy(update={"digest": file_sha256(SERVER), "digest_file": str(SERVER)})
    bad = base.model_copy(update={"digest": "0" * 64, "digest_file": str(SERVER)})
    clients = McpClients({"good": good, "bad": bad})
    try:
        assert len(await clients.get("good").tools()) == 6 + len(PROBES)
        with pytest.raises(ToolError, match="does not match its configured digest"):
            await clients.get("bad").tools()
    finally:
        await clients.aclose()


class ObedientModel:
    """A scripted model that calls ``lookup``, then whatever tool an instruction in its context names."""

    provider = "offline"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def aclose(self) -> None:
        return None

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        last = request.messages[-1]
        calls: list[ToolCall] = []
        if last.role == "user":
            calls = [ToolCall(id="c-look", name="calc__lookup", arguments={"word": "x"})]
        elif last.name == "calc__lookup":
            seen = " ".join(spec.description for spec in request.tools) + last.content
            calls = [ToolCall(id=f"c-{n}", name=n, arguments={}) for n in sorted(set(OBEYED.findall(seen)))]
        for call in calls:
            yield ToolCallEvent(call=call)
        if not calls:
            yield TextDelta(text="Done.")
        yield Usage(input_tokens=10, output_tokens=5)
        yield Finished(stop_reason="tool_calls" if calls else "stop")


OBEYED = re.compile(r"call (\w+__\w+)")


async def test_an_injected_instruction_obeyed_by_the_model_performs_no_effect(
    tmp_path: Path, clients: McpClients
) -> None:
    rt = await accepted_runtime(tmp_path, clients)
    model = ObedientModel()
    rt.models.override("offline", model)
    sink = MemorySink()
    await rt.run_turn(request("look up x", agent_=mcp_agent("calc")), sink, MemoryStore())
    called = {e.tool: e for e in sink.of("tool_called")}
    assert set(called) == {"calc__lookup", "calc__delete_everything"}  # the model obeyed the injection ...
    assert called["calc__lookup"].ok and not called["calc__delete_everything"].ok  # ... and the write was held
    assert called["calc__delete_everything"].error_class == "needs_approval"
    assert not (tmp_path / "state.deleted").exists()  # zero effects on the server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port), str(tmp_path / "state")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                import time

                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


async def test_a_streamable_http_server_is_called_through_a_turn(tmp_path: Path, http_server: str) -> None:
    clients = McpClients(
        {"calc": HttpServer(transport="http", url=http_server, reads=["add"])},
        http_client=functools.partial(guarded_http_client, AddressGuard(["127.0.0.0/8"])),
    )
    try:
        rt = await accepted_runtime(tmp_path, clients)
        sink = MemorySink()
        turn = request('/tool calc__add {"a": 5, "b": 6}', agent_=mcp_agent("calc"))
        result = await rt.run_turn(turn, sink, MemoryStore())
        (called,) = sink.of("tool_called")
        assert called.ok and "11" in str(result.history)
    finally:
        await clients.aclose()


async def test_an_http_server_on_a_refused_address_is_never_reached(tmp_path: Path, http_server: str) -> None:
    named = http_server.replace("127.0.0.1", "localhost")  # checked when the socket opens, whatever the name
    guarded = functools.partial(guarded_http_client, AddressGuard())
    clients = McpClients({"calc": HttpServer(transport="http", url=named)}, http_client=guarded)
    try:
        with pytest.raises(
            ToolError, match=r"could not be reached: localhost: destination address refused \(loopback\)"
        ):
            await clients.get("calc").tools()
    finally:
        await clients.aclose()


def test_a_schema_that_refers_to_another_document_is_not_offered() -> None:
    remote = {"type": "object", "properties": {"a": {"$ref": "http://169.254.169.254/latest"}}}
    with pytest.raises(ValueError, match="refers to another document"):
        schema_input("calc__x", remote)
    local = schema_input(
        "calc__y", {"type": "object", "$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}}
    )
    assert local.model_validate({"a": 1}).model_dump() == {"a": 1}
    with pytest.raises(ValidationError, match="'x' is not of type 'integer'"):
        local.model_validate({"a": "x"})
