"""The offline model shows tool results readably and echoes the user's Markdown as it was written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.agent.runtime import Runtime
from switchboard.core.agent.worklog import tool_message
from switchboard.core.model import ChatMessage, ModelRequest, TextDelta, ToolCall, ToolSpec
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.providers.offline import OfflineModel
from switchboard.core.tools.builtin import default_registry
from tests.core.turns import MemorySink, MemoryStore, request
from tests.sandbox.conftest import sandbox_of

SPECS = [ToolSpec(name=name, description="t", parameters={}) for name in ("shell", "sql", "send_file", "list_files")]


async def _answer(messages: list[ChatMessage], tools: list[ToolSpec] = SPECS) -> str:
    model = OfflineModel()
    request_ = ModelRequest(model="offline", system="Be brief.", messages=messages, tools=tools)
    return "".join([e.text async for e in model.stream(request_) if isinstance(e, TextDelta)])


async def _after(name: str, arguments: dict[str, Any], result: Any, *, untrusted: bool = True) -> str:
    """The offline model's answer once ``name`` returned ``result``, with the result shaped as the runtime shapes it."""
    call = ToolCall(id="call_1", name=name, arguments=arguments)
    return await _answer(
        [
            ChatMessage(role="user", content=f"/tool {name} {json.dumps(arguments)}"),
            ChatMessage(role="assistant", tool_calls=[call]),
            tool_message(call, json.dumps(result), untrusted=untrusted),
        ]
    )


def _ran(stdout: str = "", stderr: str = "", code: int = 0) -> dict[str, Any]:
    return {"stdout": stdout, "stderr": stderr, "outcome": {"type": "exit", "exit_code": code}}


async def test_a_shell_result_shows_every_command_with_its_exit_status_and_output() -> None:
    commands = ["echo hello from the sandbox", "python3 -c 'print(6 * 7)'", "ls no-such-file"]
    result = {
        "output": [
            _ran("hello from the sandbox\n"),
            _ran("42\n"),
            _ran(stderr="ls: cannot access 'no-such-file': No such file or directory\n", code=2),
        ],
        "max_output_length": 20000,
        "isolation": "bubblewrap",
    }
    text = await _after("shell", {"commands": commands}, result)
    assert "<data" not in text and '"stdout"' not in text and "isolation" not in text, text
    assert "hello from the sandbox" in text and "42" in text and "No such file or directory" in text
    # each command, in order, with its exit status beside it
    positions = [text.index(f"`{command}`") for command in commands]
    assert positions == sorted(positions)
    for command, status in zip(commands, ["exit 0", "exit 0", "exit 2"], strict=True):
        line = next(line for line in text.splitlines() if f"`{command}`" in line)
        assert status in line, line


async def test_a_long_shell_output_keeps_its_head_and_tail() -> None:
    lines = "".join(f"line {n}\n" for n in range(1, 501))
    timed_out = {"stdout": "", "stderr": "", "outcome": {"type": "timeout"}}
    result = {"output": [_ran(lines), timed_out], "max_output_length": 20000, "isolation": "bubblewrap"}
    text = await _after("shell", {"commands": ["seq 500", "sleep 999"]}, result)
    assert "line 1\n" in text and "line 500" in text and "line 250\n" not in text
    assert "omitted" in text
    assert "timed out" in next(line for line in text.splitlines() if "`sleep 999`" in line)


async def test_sql_rows_are_a_table_and_other_tools_a_short_summary() -> None:
    rows = {"statement": "read", "columns": ["region", "revenue"], "rows": [["east", 109.5], ["west", 92]]}
    table = await _after("sql", {"statement": "SELECT region, revenue FROM t"}, rows)
    assert "| region | revenue |" in table and "| east | 109.5 |" in table and "| west | 92 |" in table
    assert '"columns"' not in table and "<data" not in table
    sent = await _after("send_file", {"path": "hello.md"}, {"sent": "hello.md", "bytes": 42, "mime_type": None})
    assert "hello.md" in sent and "42 bytes" in sent and "{" not in sent
    listed = {"path": ".", "entries": [{"path": "a.txt", "type": "file", "bytes": 3}], "truncated": False}
    files = await _after("list_files", {}, listed, untrusted=False)
    assert "a.txt" in files and "{" not in files


@pytest.mark.parametrize(
    "text",
    [
        "| name | qty |\n| --- | --- |\n| tea | 2 |",
        "> to be or not to be\n> that is the question",
        'she said "hi" and left',
        "- one\n- two",
    ],
)
async def test_the_echo_keeps_the_users_markdown_as_written(text: str) -> None:
    answer = await _answer([ChatMessage(role="user", content=text)], tools=[])
    assert text in answer.split("\n\n"), answer  # a block of its own, verbatim
    assert 'You said: "' not in answer


async def test_a_plain_message_is_still_echoed_in_quotes() -> None:
    answer = await _answer([ChatMessage(role="user", content="hello there")], tools=[])
    assert answer.startswith('You said: "hello there".')


async def test_a_real_shell_turn_reads_as_commands_and_outputs(tmp_path: Path) -> None:
    sandbox = sandbox_of("bwrap")  # skips, naming why, where bubblewrap does not run
    shell = Agent(name="a", profile=AgentProfile(name="a"), instructions="t", tools=["shell"])
    runtime = Runtime(
        models=ModelFactory(ProviderConfig()), tools=default_registry(sandbox=sandbox), workspace_root=tmp_path
    )
    commands = ["echo first", "echo second; echo oops >&2; exit 3"]
    message = "/tool shell " + json.dumps({"commands": commands})
    result = await runtime.run_turn(request(message, agent_=shell), MemorySink(), MemoryStore())
    assert "<data" not in result.text and '"outcome"' not in result.text, result.text
    assert "first" in result.text and "second" in result.text and "oops" in result.text
    assert "exit 3" in next(line for line in result.text.splitlines() if "echo second" in line)
