"""The ``shell`` tool through the real tool gateway: the Responses API's shape, concurrency, truncation, progress."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from switchboard.core.actions import Action
from switchboard.core.events import Event, SandboxUsed
from switchboard.core.tools.builtin import ToolRegistry, default_registry
from switchboard.core.tools.builtin.shell import ShellOptions, shell_tools
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.sandbox.capture import marker
from switchboard.sandbox.runner import Sandbox
from switchboard.types import SessionKey


class Recorder:
    """Collects what the tool sends to the channel, its status messages, and what it records in the event log."""

    def __init__(self, *, edits: bool = True) -> None:
        self.actions: list[Action] = []
        self.events: list[Event] = []
        self.opened: list[str] = []
        self.posted: list[str] = []
        self.edited: list[tuple[str, bool]] = []
        self.edits = edits

    async def act(self, action: Action) -> None:
        self.actions.append(action)

    async def record(self, event: Event) -> None:
        self.events.append(event)

    def open(self, name: str) -> Recorder:
        self.opened.append(name)
        return self

    async def post(self, text: str) -> bool:
        self.posted.append(text)
        return True

    async def edit(self, text: str, *, final: bool = False) -> bool:
        self.edited.append((text, final))
        return True


def context(workspace: Path, recorder: Recorder) -> ToolContext:
    return ToolContext(
        session_key=SessionKey("t:web:acct:chat"),
        tenant="t",
        run_id="run-1",
        actor="u1",
        workspace=workspace,
        idempotency_key="",
        act=recorder.act,
        record=recorder.record,
        status=recorder,
    )


async def call(
    sandbox: Sandbox, workspace: Path, args: dict[str, Any], options: ShellOptions | None = None
) -> tuple[Any, Recorder]:
    gateway = ToolGateway(ToolRegistry(shell_tools(sandbox, options)), workspace_root=workspace.parent)
    recorder = Recorder()
    outcome = await gateway.call("shell", args, context(workspace, recorder))
    assert outcome.ok, outcome.error
    return outcome.value, recorder


async def test_the_result_has_the_responses_api_shape(sandbox: Sandbox, workspace: Path) -> None:
    value, recorder = await call(
        sandbox, workspace, {"commands": ["echo out; echo err >&2; exit 3", "sleep 5"], "timeout_ms": 1000}
    )
    assert value == {
        "output": [
            {"stdout": "out\n", "stderr": "err\n", "outcome": {"type": "exit", "exit_code": 3}},
            {"stdout": "", "stderr": "", "outcome": {"type": "timeout"}},
        ],
        "max_output_length": ShellOptions().max_output_chars,
        "isolation": sandbox.label,
    }
    [used] = recorder.events
    assert isinstance(used, SandboxUsed)
    assert (used.isolation, used.commands, used.timed_out) == (sandbox.label, 2, 1)


async def test_commands_of_one_call_run_concurrently(sandbox: Sandbox, workspace: Path) -> None:
    """Each command waits until all four have started: run one after another, the first would time out."""
    command = (
        "touch ready-{n}; for i in $(seq 100); do "
        "[ $(ls ready-* | wc -l) -eq 4 ] && echo together && exit 0; sleep 0.05; done; exit 1"
    )
    value, _ = await call(sandbox, workspace, {"commands": [command.format(n=n) for n in range(4)], "timeout_ms": 8000})
    assert [entry["stdout"] for entry in value["output"]] == ["together\n"] * 4
    assert [entry["outcome"] for entry in value["output"]] == [{"type": "exit", "exit_code": 0}] * 4


async def test_long_output_keeps_head_and_tail_and_marks_the_cut(bwrap: Sandbox, workspace: Path) -> None:
    script = "import sys; sys.stdout.write('a' * 5000 + 'MIDDLE' + 'z' * 5000); sys.stderr.write('e' * 50)"
    value, _ = await call(bwrap, workspace, {"commands": [f'python3 -c "{script}"'], "max_output_length": 1000})
    [entry] = value["output"]
    assert entry["stdout"] == "a" * 500 + marker(10006 - 1000) + "z" * 500
    assert entry["stderr"] == "e" * 50
    assert value["max_output_length"] == 1000


async def test_output_past_the_capture_buffer_is_counted_exactly(bwrap: Sandbox, workspace: Path) -> None:
    value, _ = await call(
        bwrap, workspace, {"commands": ["head -c 3000000 /dev/zero | tr '\\0' 'x'; echo END"], "max_output_length": 100}
    )
    [entry] = value["output"]
    assert entry["stdout"] == "x" * 50 + marker(3000004 - 100) + "x" * 46 + "END\n"


async def test_the_model_cannot_raise_the_output_cap(bwrap: Sandbox, workspace: Path) -> None:
    options = ShellOptions(max_output_chars=200)
    value, _ = await call(bwrap, workspace, {"commands": ["seq 10000"], "max_output_length": 100_000}, options)
    assert value["max_output_length"] == 200
    assert "characters truncated" in value["output"][0]["stdout"]


async def test_a_long_command_shows_one_status_message_and_how_it_ended(bwrap: Sandbox, workspace: Path) -> None:
    options = ShellOptions(progress_after_s=0.2, progress_every_s=60)
    _, recorder = await call(bwrap, workspace, {"commands": ["sleep 1.5; echo done"]}, options)
    [name] = recorder.opened
    assert name.startswith("status:") and len(name) > len("status:")  # one per call, stable across re-runs
    [posted] = recorder.posted
    assert posted.startswith("⏳ Running `sleep 1.5; echo done` — ")
    [(final, final_edit)] = recorder.edited
    assert final_edit
    assert final.startswith("✅ Done in ") and final.endswith(": `sleep 1.5; echo done` (exit 0)")
    assert recorder.actions == []  # nothing else reaches the channel


async def test_a_timed_out_command_ends_its_status_as_timed_out(bwrap: Sandbox, workspace: Path) -> None:
    options = ShellOptions(progress_after_s=0.1, progress_every_s=60)
    _, recorder = await call(bwrap, workspace, {"commands": ["sleep 30"], "timeout_ms": 1000}, options)
    [(final, final_edit)] = recorder.edited
    assert final_edit
    assert final.startswith("⏹ Timed out after ") and final.endswith("(timed out)"), final


async def test_a_quick_command_sends_no_progress(bwrap: Sandbox, workspace: Path) -> None:
    _, recorder = await call(bwrap, workspace, {"commands": ["echo hi"]})
    assert (recorder.actions, recorder.posted, recorder.edited) == ([], [], [])


@pytest.mark.parametrize(
    "args",
    [{"commands": []}, {"commands": ["true"] * 17}, {"commands": ["true"], "timeout_ms": 5}, {"command": "ls"}],
)
async def test_bad_arguments_are_refused_before_anything_runs(bwrap: Sandbox, workspace: Path, args: Any) -> None:
    gateway = ToolGateway(ToolRegistry(shell_tools(bwrap)), workspace_root=workspace.parent)
    recorder = Recorder()
    outcome = await gateway.call("shell", args, context(workspace, recorder))
    assert not outcome.ok and outcome.error_class == "validation"
    assert recorder.events == []


def test_no_sandbox_means_no_shell_tool() -> None:
    assert "shell" not in default_registry(sandbox=None)
    assert "shell" in default_registry()


def test_without_network_untrusted_content_in_the_turn_does_not_gate_the_next_command(sandbox: Sandbox) -> None:
    # A command's effects stay in the session's workspace: a document or an earlier command's output in view must
    # not stop the next command (a multi-step shell task, a skill's script). Sending to the user is still gated.
    from switchboard.core.approvals.policy import Policy
    from switchboard.core.tools.builtin.channel import TOOLS as CHANNEL_TOOLS

    (shell,) = shell_tools(sandbox)
    command = {"commands": ["wc -l notes.md"]}
    assert Policy().decide(shell, command, actor="web:s", untrusted=True).decision == "allow"
    send = next(tool for tool in CHANNEL_TOOLS if tool.name == "send_file")
    assert Policy().decide(send, {"path": "a.txt"}, actor="web:s", untrusted=True).decision == "approve"
