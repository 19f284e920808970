"""CodeAct in Monty: tools as functions, limits, sandbox escapes, output caps, pause and resume."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.agent.codeact import (
    PausedProgram,
    ProgramLimits,
    ProgramRunner,
    ProgramSnapshotError,
    cap_output,
    resume_program,
    run_program,
    tool_params,
)
from switchboard.core.tools.builtin.files import TOOLS as FILE_TOOLS
from switchboard.errors import BudgetExceededError, ToolError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runner() -> Iterator[ProgramRunner]:
    pool = ProgramRunner(max_processes=3)
    yield pool
    pool.close()


class Tools:
    """A stand-in for the gateway: records every call that left the interpreter."""

    def __init__(self, **results: Any) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.results = results

    async def __call__(self, name: str, args: dict[str, Any]) -> Any:
        self.calls.append((name, args))
        found = self.results.get(name)
        if isinstance(found, BaseException):
            raise found
        if callable(found):
            return found(**args)
        return found


async def test_tools_are_functions_and_every_call_leaves_the_interpreter(runner: ProgramRunner) -> None:
    tools = Tools(read_file=lambda path: {"path": path, "content": "hello"}, current_time={"iso": "2026-01-01"})
    code = """
first = read_file("a.txt")
second = read_file(path="b.txt")
print(first["content"], current_time()["iso"])
[first["path"], second["path"]]
"""
    result = await run_program(
        code,
        call_tool=tools,
        tool_names=["read_file", "current_time"],
        inputs={},
        tool_params={"read_file": ["path"]},
        runner=runner,
    )
    assert result.error is None
    assert result.value == ["a.txt", "b.txt"]
    assert result.output == "hello 2026-01-01\n"
    assert result.calls == 3
    assert tools.calls == [("read_file", {"path": "a.txt"}), ("read_file", {"path": "b.txt"}), ("current_time", {})]


async def test_tool_params_come_from_the_tools_input_models(runner: ProgramRunner) -> None:
    params = tool_params(FILE_TOOLS)
    assert params["write_file"][:2] == ["path", "content"]
    tools = Tools(write_file=lambda **kw: kw)
    result = await run_program(
        'write_file("notes.md", "# hi")', call_tool=tools, tool_names=["write_file"], tool_params=params, runner=runner
    )
    assert result.value == {"path": "notes.md", "content": "# hi"}


async def test_positional_arguments_without_parameter_names_are_a_clear_error(runner: ProgramRunner) -> None:
    tools = Tools(lookup={"ok": True})
    result = await run_program('lookup("x")', call_tool=tools, tool_names=["lookup"], runner=runner)
    assert result.error is not None
    assert "keyword arguments only" in result.error
    assert tools.calls == []


async def test_tool_errors_are_exceptions_the_program_can_catch(runner: ProgramRunner) -> None:
    tools = Tools(
        read_file=FileNotFoundError("no such file: x.txt"),
        fetch=ToolError("bad url", error_class="validation"),
        denied=ToolError("nope", error_class="auth"),
    )
    code = """
caught = []
try:
    read_file(path="x.txt")
except FileNotFoundError as e:
    caught.append("missing: " + str(e))
try:
    fetch(url="::")
except ValueError as e:
    caught.append("invalid")
try:
    denied()
except PermissionError:
    caught.append("denied")
caught
"""
    result = await run_program(code, call_tool=tools, tool_names=["read_file", "fetch", "denied"], runner=runner)
    assert result.error is None
    assert result.value == ["missing: read_file: no such file: x.txt", "invalid", "denied"]


async def test_an_uncaught_tool_error_ends_the_program_with_a_clear_error(runner: ProgramRunner) -> None:
    tools = Tools(read_file=FileNotFoundError("no such file: x.txt"))
    result = await run_program(
        'print("before")\nread_file(path="x.txt")\nprint("after")',
        call_tool=tools,
        tool_names=["read_file"],
        runner=runner,
    )
    assert result.error is not None
    assert "FileNotFoundError" in result.error and "no such file: x.txt" in result.error
    assert result.output == "before\n"


async def test_a_budget_error_from_the_gateway_stops_the_program_and_propagates(runner: ProgramRunner) -> None:
    tools = Tools(search=BudgetExceededError("tool budget spent", budget="tool_calls"))
    with pytest.raises(BudgetExceededError):
        await run_program(
            "try:\n    search(q='x')\nexcept Exception:\n    pass\n'swallowed'",
            call_tool=tools,
            tool_names=["search"],
            runner=runner,
        )


async def test_unknown_functions_are_name_errors_unless_routing_everything(runner: ProgramRunner) -> None:
    tools = Tools(helper={"routed": True})
    closed = await run_program("helper()", call_tool=tools, tool_names=["read_file"], runner=runner)
    assert closed.error is not None and "NameError" in closed.error
    assert tools.calls == []
    routed = await run_program("helper(a=1)", call_tool=tools, tool_names=None, runner=runner)
    assert routed.value == {"routed": True}
    assert tools.calls == [("helper", {"a": 1})]


async def test_inputs_are_globals_and_nothing_persists_between_programs(runner: ProgramRunner) -> None:
    tools = Tools()
    first = await run_program(
        "secret = plan['goal'] + '!'\nsecret", call_tool=tools, inputs={"plan": {"goal": "ship"}}, runner=runner
    )
    assert first.value == "ship!"
    second = await run_program("secret", call_tool=tools, runner=runner)
    assert second.error is not None and "NameError" in second.error
    with pytest.raises(ValueError, match="shadows a tool"):
        await run_program("1", call_tool=tools, tool_names=["plan"], inputs={"plan": 1}, runner=runner)


async def test_printed_output_is_capped_keeping_head_and_tail(runner: ProgramRunner) -> None:
    code = "print('HEAD')\nfor i in range(20000):\n    print('line', i)\nprint('TAIL')"
    result = await run_program(code, call_tool=Tools(), limits=ProgramLimits(max_output_chars=1000), runner=runner)
    assert result.error is None
    assert len(result.output) <= 1000
    assert result.output.startswith("HEAD\nline 0\n")
    assert result.output.endswith("line 19999\nTAIL\n")
    assert "chars omitted] …" in result.output


def test_cap_output_counts_what_it_omits() -> None:
    assert cap_output("short", 100) == "short"
    text = "".join(chr(ord("a") + i % 26) for i in range(10_000))
    capped = cap_output(text, 500)
    assert len(capped) <= 500
    head, rest = capped.split("\n… [", 1)
    omitted, tail = rest.split(" chars omitted] …\n", 1)
    assert text.startswith(head) and text.endswith(tail)
    assert len(head) + int(omitted) + len(tail) == len(text)


ESCAPES = {
    "import os": ("import os\nos.listdir('/')", "PermissionError"),
    "open()": ("open('/etc/passwd').read()", "PermissionError"),
    "__import__": ("__import__('os').system('id')", "NameError"),
    "class walk": ("().__class__.__bases__[0].__subclasses__()", "AttributeError"),
    "type mro": ("type(()).__mro__[-1].__subclasses__()", "AttributeError"),
    "getattr walk": ("getattr(getattr((), '__class__'), '__base__')", "AttributeError"),
    "environment": ("import os\nos.getenv('HOME')", "not supported"),
    "subprocess": ("import subprocess\nsubprocess.run(['id'])", "ModuleNotFoundError"),
    "sys.modules": ("import sys\nsys.modules['os']", "AttributeError"),
}


@pytest.mark.parametrize(("code", "expected"), ESCAPES.values(), ids=ESCAPES.keys())
async def test_sandbox_escapes_fail(runner: ProgramRunner, code: str, expected: str) -> None:
    tools = Tools()
    result = await run_program(code, call_tool=tools, tool_names=["read_file"], runner=runner)
    assert result.error is not None
    assert expected in result.error
    assert result.value is None
    assert "root:" not in result.output + result.error
    assert tools.calls == []


async def test_an_infinite_loop_is_stopped_by_the_time_limit_off_the_event_loop(runner: ProgramRunner) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        result = await run_program(
            "while True:\n    pass", call_tool=Tools(), limits=ProgramLimits(max_duration_s=0.3), runner=runner
        )
    finally:
        task.cancel()
    assert result.error is not None and "TimeoutError" in result.error
    assert ticks > 0  # the event loop kept running while the program spun


async def test_a_huge_allocation_is_stopped_by_the_memory_limit(runner: ProgramRunner) -> None:
    limits = ProgramLimits(max_memory_bytes=16 * 2**20)
    big = await run_program("x = [0] * (10**9)\nlen(x)", call_tool=Tools(), limits=limits, runner=runner)
    assert big.error is not None and "MemoryError" in big.error
    growing = await run_program(
        "x = []\nwhile True:\n    x.append('y' * 1000)", call_tool=Tools(), limits=limits, runner=runner
    )
    assert growing.error is not None and "MemoryError" in growing.error
    after = await run_program("1 + 1", call_tool=Tools(), runner=runner)
    assert after.value == 2


async def test_a_program_stops_at_its_call_budget(runner: ProgramRunner) -> None:
    tools = Tools(ping="pong")
    result = await run_program(
        "for i in range(100):\n    ping(i=i)",
        call_tool=tools,
        tool_names=["ping"],
        limits=ProgramLimits(max_calls=3),
        runner=runner,
    )
    assert result.error is not None and "more than 3 tool calls" in result.error
    assert result.calls == 3
    assert len(tools.calls) == 3


async def test_cancellation_reaches_a_running_tool_and_frees_the_worker(runner: ProgramRunner) -> None:
    started = asyncio.Event()

    async def slow(name: str, args: dict[str, Any]) -> Any:
        started.set()
        await asyncio.sleep(60)

    task = asyncio.create_task(run_program("slow()", call_tool=slow, tool_names=["slow"], runner=runner))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    results = await asyncio.gather(*(run_program(f"{i} * 2", call_tool=Tools(), runner=runner) for i in range(4)))
    assert [r.value for r in results] == [0, 2, 4, 6]


PAUSING = """
print("drafting")
r = send_email(to="bob@example.com", body="hi")
print("send_email returned", r)
n = count(x=2)
n * 10
"""


def _pause_on_send(name: str, args: dict[str, Any]) -> bool:
    return name == "send_email"


async def test_a_program_pauses_at_a_gated_call_and_resumes_with_its_result(runner: ProgramRunner) -> None:
    tools = Tools(count=lambda x: x + 1)
    names = ["send_email", "count"]
    paused = await run_program(PAUSING, call_tool=tools, tool_names=names, pause_on=_pause_on_send, runner=runner)
    assert paused.error is None and paused.paused is not None
    assert paused.paused.tool == "send_email"
    assert paused.paused.args == {"to": "bob@example.com", "body": "hi"}
    assert paused.output == "drafting\n"
    assert tools.calls == []  # the gated call was not made

    done = await resume_program(paused.paused, {"sent": True}, call_tool=tools, runner=runner)
    assert done.error is None
    assert done.value == 30
    assert done.output == "drafting\nsend_email returned {'sent': True}\n"
    assert done.calls == 2
    assert tools.calls == [("count", {"x": 2})]


async def test_a_refused_call_raises_in_the_resumed_program(runner: ProgramRunner) -> None:
    code = "try:\n    send_email(to='x')\n    out = 'sent'\nexcept PermissionError as e:\n    out = str(e)\nout"
    paused = await run_program(
        code, call_tool=Tools(), tool_names=["send_email"], pause_on=_pause_on_send, runner=runner
    )
    assert paused.paused is not None
    done = await resume_program(
        paused.paused.dump(), call_tool=Tools(), error=PermissionError("approval denied"), runner=runner
    )
    assert done.value == "send_email: approval denied"


async def test_a_paused_program_resumes_in_another_process(runner: ProgramRunner, tmp_path: Path) -> None:
    key = b"approvals-signing-key"
    paused = await run_program(
        PAUSING, call_tool=Tools(), tool_names=["send_email", "count"], pause_on=_pause_on_send, runner=runner
    )
    assert paused.paused is not None
    envelope = paused.paused.dump(key=key)
    body = json.loads(envelope)
    assert body["schema"] == "switchboard.codeact.paused/1"
    assert body["monty_version"] and body["mac"]
    (tmp_path / "paused.json").write_bytes(envelope)
    child = f"""
import asyncio, json, pathlib, sys
from switchboard.core.agent.codeact import resume_program

async def call_tool(name, args):
    assert name == "count", name
    return args["x"] + 1

async def main():
    data = pathlib.Path({str(tmp_path / "paused.json")!r}).read_bytes()
    result = await resume_program(data, {{"sent": "from-child"}}, call_tool=call_tool, key={key!r})
    print(json.dumps({{"value": result.value, "output": result.output, "error": result.error}}))

asyncio.run(main())
"""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", child, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, stderr.decode()
    answer = json.loads(stdout.decode().strip().splitlines()[-1])
    assert answer == {
        "value": 30,
        "output": "drafting\nsend_email returned {'sent': 'from-child'}\n",
        "error": None,
    }


async def test_altered_or_foreign_envelopes_are_refused(runner: ProgramRunner) -> None:
    paused = await run_program(
        PAUSING, call_tool=Tools(), tool_names=["send_email", "count"], pause_on=_pause_on_send, runner=runner
    )
    assert paused.paused is not None
    key = b"k1"
    body = json.loads(paused.paused.dump(key=key))

    tampered = dict(body, args={"to": "mallory@example.com", "body": "hi"})
    with pytest.raises(ProgramSnapshotError, match="signature"):
        PausedProgram.load(json.dumps(tampered).encode(), key=key)
    with pytest.raises(ProgramSnapshotError, match="signature"):
        PausedProgram.load(paused.paused.dump(), key=key)  # unsigned
    foreign = dict(body, monty_version="0.0.1")
    foreign.pop("mac")
    with pytest.raises(ProgramSnapshotError, match=r"Monty 0\.0\.1"):
        PausedProgram.load(json.dumps(foreign).encode())
    corrupt = dict(body, snapshot=body["snapshot"][:-8] + "AAAAAAAA")
    corrupt.pop("mac")
    with pytest.raises(ProgramSnapshotError, match="corrupt"):
        PausedProgram.load(json.dumps(corrupt).encode())
    with pytest.raises(ProgramSnapshotError, match="envelope"):
        PausedProgram.load(b'{"schema": "something-else/1"}')
    assert PausedProgram.load(paused.paused.dump(key=key), key=key).args == paused.paused.args


def test_a_forked_child_gets_a_clear_error_instead_of_a_hang() -> None:
    script = """
import asyncio, os, sys
from switchboard.core.agent.codeact import ProgramRunner

async def tool(name, args):
    return 1

runner = ProgramRunner(max_processes=1)
print("parent", asyncio.run(runner.run("t()", call_tool=tool, tool_names=["t"])).value, flush=True)
pid = os.fork()
if pid == 0:
    try:
        asyncio.run(runner.run("t()", call_tool=tool, tool_names=["t"]))
        print("child ran", flush=True)
    except RuntimeError as exc:
        print("child refused:", exc, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print("parent again", asyncio.run(runner.run("t() + 1", call_tool=tool, tool_names=["t"])).value, flush=True)
runner.close()
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines() == [
        "parent 1",
        "child refused: this ProgramRunner was started before a fork; create a new one in this process",
        "parent again 2",
    ]
