"""Escape attempts from a sandboxed command: every one of them must fail, under every sandbox kind this host runs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchboard.sandbox.runner import Sandbox
from tests.sandbox.conftest import LIMITS, processes_with

REPO = Path(__file__).resolve().parents[2]


async def run(sandbox: Sandbox, command: str, workspace: Path, timeout_s: float = 10.0) -> tuple[str, str, int | None]:
    done = await sandbox.run(command, workspace, timeout_s=timeout_s, max_output=20_000)
    return done.stdout, done.stderr, done.exit_code


async def test_a_command_runs_and_writes_its_workspace(sandbox: Sandbox, workspace: Path) -> None:
    out, err, code = await run(sandbox, "echo hello > note.txt && cat note.txt && id -u", workspace)
    assert (out.splitlines()[0], code) == ("hello", 0), err
    assert (workspace / "note.txt").read_text() == "hello\n"


async def test_reading_etc_shadow_fails(sandbox: Sandbox, workspace: Path) -> None:
    out, _, code = await run(sandbox, "cat /etc/shadow", workspace)
    assert code != 0 and "root:" not in out


async def test_reading_the_repository_fails(sandbox: Sandbox, workspace: Path) -> None:
    target = REPO / "pyproject.toml"
    assert target.is_file()
    out, _, _ = await run(sandbox, f"cat {target}; ls {REPO}; cat {REPO}/switchboard/settings.py", workspace)
    assert "[project]" not in out and "switchboard" not in out and "BaseSettings" not in out


async def test_reading_the_data_dir_fails(sandbox: Sandbox, workspace: Path, data_dir: Path) -> None:
    out, _, _ = await run(sandbox, f"cat {data_dir}/secret.key; cat ../../../secret.key; ls -R {data_dir}", workspace)
    assert "host-secret-123" not in out and "secret.key" not in out


async def test_reading_the_workers_environment_fails(
    sandbox: Sandbox, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD_TEST_TOKEN", "tok-very-secret")
    holder = subprocess.Popen(["sleep", "30"])  # a host process started with the secret in its environment
    try:
        command = f"env; cat /proc/1/environ; cat /proc/{holder.pid}/environ; cat /proc/{os.getpid()}/environ"
        out, _, _ = await run(sandbox, command, workspace)
    finally:
        holder.kill()
        holder.wait()
    assert "tok-very-secret" not in out and "SWITCHBOARD" not in out


async def test_reading_another_sessions_workspace_fails(
    sandbox: Sandbox, workspace: Path, other_workspace: Path
) -> None:
    out, _, _ = await run(sandbox, f"cat ../session-b/notes.txt; cat {other_workspace}/notes.txt; ls ..", workspace)
    assert "session-b-private" not in out and "session-b" not in out


async def test_writing_outside_the_workspace_fails(sandbox: Sandbox, workspace: Path, data_dir: Path) -> None:
    outside = data_dir / "planted.txt"
    command = f"echo x > {outside}; echo x > ../planted.txt; echo x > /usr/planted.txt; touch $HOME/../planted.txt"
    await run(sandbox, command, workspace)
    assert not outside.exists() and not (workspace.parent / "planted.txt").exists()
    assert not Path("/usr/planted.txt").exists()


@pytest.fixture
def host_server() -> Iterator[tuple[int, list[object]]]:
    """A TCP server on the host's 127.0.0.1, recording every connection it accepts."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, addr = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(addr)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    server.close()
    thread.join(timeout=5)


async def test_reaching_the_network_fails(
    sandbox: Sandbox, workspace: Path, host_server: tuple[int, list[object]]
) -> None:
    port, accepted = host_server
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('CONNECTED')"
    out, err, code = await run(sandbox, f'python3 -c "{probe}"', workspace)
    assert "CONNECTED" not in out and code != 0
    assert accepted == [], "the host's server saw a connection from the sandbox"
    assert "Errno" in err


async def test_a_fork_bomb_is_contained_and_the_call_returns(sandbox: Sandbox, workspace: Path) -> None:
    marker = f"bomb-{uuid.uuid4().hex[:8]}"
    bomb = (
        "import os, sys, time\n"
        "made = 0\n"
        "for _ in range(500):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(30); os._exit(0)\n"
        "    made += 1\n"
        "print('forked', made, flush=True)\n"
    )
    (workspace / "bomb.py").write_text(bomb)
    done = await sandbox.run(f"python3 bomb.py {marker}", workspace, timeout_s=20.0, max_output=2000)
    made = int(done.stdout.split()[-1])
    assert made < LIMITS.processes, done.stdout
    assert processes_with(marker) == [], "children of the bomb outlived the call"
    assert subprocess.run(["true"], check=False).returncode == 0  # the host still forks


async def test_a_file_past_the_size_limit_is_cut_and_refused(sandbox: Sandbox, workspace: Path) -> None:
    out, err, _ = await run(sandbox, "head -c 5000000 /dev/zero > big.bin; echo status=$?", workspace)
    assert "status=0" not in out, err
    assert (workspace / "big.bin").stat().st_size <= LIMITS.file_mb * 2**20


async def test_a_command_ignoring_sigterm_is_killed_with_its_group_on_timeout(
    sandbox: Sandbox, workspace: Path
) -> None:
    marker = f"stubborn-{uuid.uuid4().hex[:8]}"
    script = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)\n"
    )
    (workspace / "stubborn.py").write_text(script)
    command = f"trap '' TERM; python3 stubborn.py {marker} & setsid python3 stubborn.py {marker} & sleep 60"
    done = await sandbox.run(command, workspace, timeout_s=1.5, max_output=2000)
    assert done.timed_out and done.outcome() == {"type": "timeout"}
    assert done.stdout.count("up") == 2, done.stderr
    assert processes_with(marker) == [], "a process of the command outlived its timeout"


def test_the_sandbox_python_is_the_workers_interpreter(bwrap: Sandbox) -> None:
    assert sys.prefix in " ".join(bwrap._argv("true", Path("/nonexistent"), "", 3)[0])


async def test_the_common_tools_are_there(sandbox: Sandbox, workspace: Path) -> None:
    command = (
        "printf 'b,2\\na,1\\n' > t.csv && sort t.csv | grep a | sed s/a/A/ | awk -F, '{print $1 $2}' && "
        "sqlite3 :memory: 'select 6*7' && python3 -c 'import openpyxl, sqlite3; print(\"py ok\")'"
    )
    out, err, code = await run(sandbox, command, workspace)
    assert (out, code) == ("A1\n42\npy ok\n", 0), err


async def test_the_command_holds_no_capability(sandbox: Sandbox, workspace: Path) -> None:
    """capget(2) on itself: every set empty (read-only; the command's own view, /proc need not be visible)."""
    probe = (
        "import ctypes, struct; libc = ctypes.CDLL(None); "
        "hdr = ctypes.create_string_buffer(struct.pack('=Ii', 0x20080522, 0)); "
        "data = ctypes.create_string_buffer(24); "
        "print(libc.capget(hdr, data), struct.unpack('=6I', data.raw))"
    )
    out, err, code = await run(sandbox, f'python3 -c "{probe}"', workspace)
    assert (out, code) == ("0 (0, 0, 0, 0, 0, 0)\n", 0), err
