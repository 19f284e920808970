"""Landlock and the weak floor without a pids cgroup (non-root workers): nothing a command starts outlives it.

The launcher is a child subreaper: a daemon that leaves the process group (``setsid``, double fork) is re-parented
to it, and it kills every process below it when the command exits or when the runner stops it at the deadline.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import uuid
from pathlib import Path

import pytest

from switchboard.sandbox.runner import Isolation, Sandbox
from tests.sandbox.conftest import processes_with, sandbox_of


def _non_root(kind: Isolation) -> Sandbox:
    return dataclasses.replace(sandbox_of(kind), pids_root=None, _slots={})  # what a non-root worker gets


@pytest.fixture(params=["landlock", "weak"])
def box(request: pytest.FixtureRequest) -> Sandbox:
    """Each launcher-based sandbox, as a worker that is not root runs it."""
    return _non_root(request.param)


def _daemon(marker: str) -> str:
    """Start a double-forked daemon in a session of its own, and wait until it runs."""
    return (
        f"(setsid sh -c 'echo up > up; exec sleep {marker}' &) >/dev/null 2>&1; "
        "while [ ! -f up ]; do sleep 0.05; done; echo started"
    )


async def test_a_daemon_is_killed_when_the_command_times_out(box: Sandbox, workspace: Path) -> None:
    marker = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    try:
        done = await box.run(f"{_daemon(marker)}; sleep 60", workspace, timeout_s=2, max_output=1000)
        assert done.timed_out and done.stdout.strip() == "started", done.stderr
        assert processes_with(marker) == [], "a daemon of the command outlived its deadline"
    finally:
        for pid in processes_with(marker):
            os.kill(pid, signal.SIGKILL)


async def test_a_daemon_is_killed_when_the_call_is_cancelled(box: Sandbox, workspace: Path) -> None:
    import asyncio

    marker = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    try:
        task = asyncio.create_task(box.run(f"{_daemon(marker)}; sleep 60", workspace, timeout_s=30, max_output=100))
        for _ in range(400):
            if (workspace / "up").exists():
                break
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert processes_with(marker) == [], "a daemon of the command outlived the cancelled call"
    finally:
        for pid in processes_with(marker):
            os.kill(pid, signal.SIGKILL)


async def test_the_exit_status_and_output_are_the_commands(box: Sandbox, workspace: Path) -> None:
    done = await box.run("echo out; echo err >&2; exit 7", workspace, timeout_s=10, max_output=100)
    assert (done.stdout, done.stderr, done.exit_code) == ("out\n", "err\n", 7)
    killed = await box.run("kill -9 $$", workspace, timeout_s=10, max_output=100)
    assert killed.exit_code == 128 + signal.SIGKILL


async def test_a_landlocked_command_cannot_kill_its_launcher(workspace: Path) -> None:
    """Landlock ABI 6 scopes signals: the launcher is outside the command's domain."""
    box = _non_root("landlock")
    marker = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    try:
        done = await box.run(
            f"{_daemon(marker)}; kill -9 $PPID 2>/dev/null && echo killed || echo refused",
            workspace,
            timeout_s=10,
            max_output=1000,
        )
        if "killed" in done.stdout:
            pytest.skip("Landlock ABI < 6 here: signals are not scoped")
        assert "refused" in done.stdout, done.stderr
        assert processes_with(marker) == []
    finally:
        for pid in processes_with(marker):
            os.kill(pid, signal.SIGKILL)


async def test_the_weak_floor_cannot_reach_the_hosts_unix_sockets(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    path = tmp_path / "host.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen(4)
        server.setblocking(False)
        command = f"python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('{path}')\""
        done = await _non_root("weak").run(command, workspace, timeout_s=10, max_output=2000)
        with pytest.raises(BlockingIOError):
            server.accept()
    assert "Address family not supported" in done.stderr, done.stderr
