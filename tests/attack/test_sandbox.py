"""A hostile command in the ``shell`` sandbox (a prompt-injected model, or a user steering one).

Each test is an escape or abuse attempt that must fail. Those marked ``xfail(strict=True)`` fail today: they pin a
defect described in the attack notes of issue #10, and turn into a failure of the suite (XPASS) once it is fixed, so
the mark is removed with the fix. Every test runs a real command in a real sandbox; a host without bubblewrap (or
without Landlock) skips it, naming why.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import resource
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchboard.sandbox.landlock import abi_version
from switchboard.sandbox.runner import Isolation, Sandbox
from tests.sandbox.conftest import processes_with, sandbox_of

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux only")

KINDS = ["bwrap", "landlock"]
"""Both strong levels: every attack below runs against each (skipped, naming why, only where the host lacks one)."""

_CLONE_PROBE = r"""
import ctypes, os, platform
libc = ctypes.CDLL(None, use_errno=True)
NEWUSER, NEWNS, SIGCHLD = 0x10000000, 0x00020000, 17
clone = {"x86_64": 56, "aarch64": 220}[platform.machine()]
pid = libc.syscall(clone, NEWUSER | NEWNS | SIGCHLD, 0, 0, 0, 0)
if pid == 0:
    os._exit(0)
if pid > 0:
    os.waitpid(pid, 0)
print("clone-newuser", "ok" if pid > 0 else "refused")
"""

_CLONE3_PROBE = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
class Args(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in
                ("flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls")]
args = Args(flags=0x10000000, exit_signal=17)  # CLONE_NEWUSER
pid = libc.syscall(435, ctypes.byref(args), ctypes.sizeof(args))
if pid == 0:
    os._exit(0)
if pid > 0:
    os.waitpid(pid, 0)
print("clone3-newuser", "ok" if pid > 0 else "refused")
"""

_FSOPEN_PROBE = r"""
import ctypes, os, platform
libc = ctypes.CDLL(None, use_errno=True)
clone = {"x86_64": 56, "aarch64": 220}[platform.machine()]
pid = libc.syscall(clone, 0x10000000 | 0x00020000 | 17, 0, 0, 0, 0)
if pid == 0:
    fd = libc.syscall(430, b"tmpfs", 0)  # fsopen: the new mount API (fsopen/fsconfig/fsmount/move_mount)
    print("fsopen", "ok" if fd >= 0 else "refused", flush=True)
    os._exit(0)
if pid > 0:
    os.waitpid(pid, 0)
else:
    print("fsopen refused")
"""


async def _run(box: Sandbox, workspace: Path, command: str, timeout_s: float = 30) -> str:
    done = await box.run(command, workspace, timeout_s=timeout_s, max_output=20_000)
    return done.stdout + done.stderr


def _script(workspace: Path, name: str, text: str) -> str:
    (workspace / name).write_text(text)
    (workspace / name).chmod(0o644)
    return f"python3 {name}"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    path.chmod(0o777)  # the sandbox's uid (nobody under bubblewrap) writes here
    return path


@pytest.mark.parametrize("kind", KINDS)
async def test_a_command_cannot_make_new_namespaces_with_clone(kind: Isolation, workspace: Path) -> None:
    out = await _run(sandbox_of(kind), workspace, _script(workspace, "p.py", _CLONE_PROBE))
    assert "clone-newuser" in out, out
    assert "clone-newuser refused" in out, "a nested user namespace gives the command every capability in it"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_command_cannot_make_new_namespaces_with_clone3(kind: Isolation, workspace: Path) -> None:
    out = await _run(sandbox_of(kind), workspace, _script(workspace, "p.py", _CLONE3_PROBE))
    assert "clone3-newuser" in out, out
    assert "clone3-newuser refused" in out


@pytest.mark.parametrize("kind", KINDS)
async def test_a_command_cannot_mount_through_the_new_mount_api(kind: Isolation, workspace: Path) -> None:
    out = await _run(sandbox_of(kind), workspace, _script(workspace, "p.py", _FSOPEN_PROBE))
    assert "fsopen" in out, out
    assert "fsopen refused" in out


async def test_a_daemon_started_by_a_command_does_not_outlive_it_under_landlock_as_non_root(workspace: Path) -> None:
    box = dataclasses.replace(sandbox_of("landlock"), pids_root=None)  # what a worker not running as root gets
    marker = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    try:
        done = await box.run(
            f"setsid -f sh -c 'echo up > up; exec sleep {marker}' >/dev/null 2>&1; "
            "while [ ! -f up ]; do sleep 0.05; done; echo started",  # in its own session before the command ends
            workspace,
            timeout_s=10,
            max_output=1000,
        )
        assert done.stdout.strip() == "started" and done.exit_code == 0
        assert processes_with(marker) == [], "a process of the command is still running"
    finally:
        for pid in processes_with(marker):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("kind", KINDS)
async def test_no_device_node_or_write_to_the_system(kind: Isolation, workspace: Path) -> None:
    box = sandbox_of(kind)
    out = await _run(
        box,
        workspace,
        "mknod disk b 8 0 2>&1 || echo no-mknod; "
        "cat /dev/kcore >/dev/null 2>&1 || echo no-kcore; "
        "cat /proc/kcore >/dev/null 2>&1 || echo no-proc-kcore; "
        "touch /usr/planted 2>/dev/null || echo no-usr-write; "
        "touch \"$(python3 -c 'import sys; print(sys.prefix)')/planted\" 2>/dev/null || echo no-venv-write",
    )
    for word in ("no-mknod", "no-kcore", "no-proc-kcore", "no-usr-write", "no-venv-write"):
        assert word in out, out
    assert not (workspace / "disk").exists()
    assert not Path("/usr/planted").exists()


@pytest.mark.parametrize("kind", KINDS)
async def test_the_worker_environment_and_venv_hold_no_secret_the_sandbox_can_read(
    kind: Isolation, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD_TELEGRAM__BOT_TOKEN", "host-token-4242")
    out = await _run(
        sandbox_of(kind),
        workspace,
        "env; cat /proc/1/environ /proc/self/environ 2>/dev/null | tr '\\0' '\\n'; "
        "grep -rs host-token-4242 /proc/*/environ /tmp 2>/dev/null; echo end",
    )
    assert "end" in out and "host-token-4242" not in out


@pytest.mark.parametrize("kind", KINDS)
async def test_output_flooding_is_captured_with_bounded_memory_and_an_exact_count(
    kind: Isolation, workspace: Path
) -> None:
    size = 40 * 2**20
    done = await sandbox_of(kind).run(f"head -c {size} /dev/zero | tr '\\0' a", workspace, timeout_s=60, max_output=100)
    assert done.exit_code == 0
    assert done.stdout.startswith("a" * 50) and done.stdout.endswith("a" * 50)
    assert f"… {size - 100} characters truncated …" in done.stdout


@pytest.mark.parametrize("kind", KINDS)
async def test_hostile_file_names_and_file_floods_stay_inside_the_workspace(kind: Isolation, workspace: Path) -> None:
    out = await _run(
        sandbox_of(kind),
        workspace,
        "printf x > \"$(printf 'evil\\nname\\r\\033[2J')\"; mkfifo pipe; "
        "python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.bind('sock')\"; "
        "mkdir -p flood && cd flood && seq 1 3000 | xargs touch; echo made",
    )
    assert "made" in out, out
    assert len(list((workspace / "flood").iterdir())) == 3000
    assert all(p.resolve().is_relative_to(workspace.resolve()) for p in workspace.iterdir())


async def test_a_landlocked_command_cannot_reach_the_hosts_unix_sockets(tmp_path: Path) -> None:
    data = tmp_path / "data"  # the default layout: <data dir>/redis.sock beside <data dir>/workspaces
    workspace = data / "workspaces" / "t-tenant" / "session"
    workspace.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(data / "redis.sock"))
        server.listen(4)
        server.setblocking(False)
        command = (  # relative to the socket's directory: a socket path is bounded (108 bytes)
            'cd "$HOME/../../.." && python3 -c "import socket; s = socket.socket(socket.AF_UNIX); '
            "s.connect('redis.sock'); s.sendall(b'FLUSHALL\\r\\n')\""
        )
        await _run(sandbox_of("landlock"), workspace, command)
        try:
            peer, _ = server.accept()
        except BlockingIOError:
            return
        with peer:
            peer.setblocking(True)
            peer.settimeout(5)
            got = peer.recv(100)
        pytest.fail(f"the host's unix socket received {got!r} from the sandbox")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_command_cannot_reach_the_hosts_abstract_unix_sockets(kind: Isolation, workspace: Path) -> None:
    name = f"switchboard-attack-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("\0" + name)
        server.listen(4)
        server.setblocking(False)
        command = (
            'python3 -c "import socket; s = socket.socket(socket.AF_UNIX); '
            f"s.connect('\\\\0{name}'); s.sendall(b'hello')\""
        )
        out = await _run(sandbox_of(kind), workspace, command)
        with pytest.raises(BlockingIOError):
            server.accept()
    assert "Error" in out, out


async def test_a_bubblewrapped_command_cannot_reach_the_hosts_pathname_unix_sockets(tmp_path: Path) -> None:
    data = tmp_path / "data"
    workspace = data / "workspaces" / "t-tenant" / "session"
    workspace.mkdir(parents=True)
    workspace.chmod(0o777)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(data / "redis.sock"))
        server.listen(4)
        server.setblocking(False)
        host = await _run(sandbox_of("bwrap"), workspace, "awk '$5 == \"/workspace\" {print $4}' /proc/self/mountinfo")
        command = (
            f"cd '{host.strip()}/../../..' 2>/dev/null || cd /workspace/../../..; python3 -c \"import socket; "
            "s = socket.socket(socket.AF_UNIX); s.connect('redis.sock')\""
        )
        await _run(sandbox_of("bwrap"), workspace, command)
        with pytest.raises(BlockingIOError):
            server.accept()


@pytest.fixture
def host_process() -> Iterator[subprocess.Popen[bytes]]:
    """A process of the host with the worker's uid (what the gateway and its embedded server are)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SWITCHBOARD_HOST_SECRET": "host-proc-secret-77"}
    proc = subprocess.Popen(["sleep", "300"], env=env)
    yield proc
    proc.kill()
    proc.wait()


def _host_state(pid: int) -> dict[str, object]:
    """What a command might change of a host process: limits, state, priorities, affinity, OOM score."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ionice = subprocess.run(["ionice", "-p", str(pid)], capture_output=True, text=True, check=False).stdout
    return {
        "cpu": resource.prlimit(pid, resource.RLIMIT_CPU),
        "nofile": resource.prlimit(pid, resource.RLIMIT_NOFILE),
        "stopped": stat[0] in "Tt",
        "nice": os.getpriority(os.PRIO_PROCESS, pid),
        "ionice": ionice,
        "affinity": os.sched_getaffinity(pid),
        "oom": Path(f"/proc/{pid}/oom_score_adj").read_text(),
    }


@pytest.mark.parametrize("kind", KINDS)
async def test_a_command_cannot_touch_a_host_process(
    kind: Isolation, workspace: Path, host_process: subprocess.Popen[bytes]
) -> None:
    pid = host_process.pid
    before = _host_state(pid)
    command = (
        f"prlimit --pid {pid} --cpu=1:1 --nofile=3:3; echo prlimit=$?; "
        f"renice -n 19 -p {pid}; echo renice=$?; "
        f"ionice -c 3 -p {pid}; echo ionice=$?; "
        f"taskset -p 1 {pid}; echo taskset=$?; "
        f"chrt -b -p 0 {pid}; echo chrt=$?; "
        f"cat /proc/{pid}/environ /proc/{pid}/cmdline; "
        f"echo 1000 > /proc/{pid}/oom_score_adj; echo end"
    )
    out = await _run(sandbox_of(kind), workspace, command)
    assert "end" in out, out
    assert "host-proc-secret-77" not in out
    assert _host_state(pid) == before, out
    assert host_process.poll() is None, "the host process died"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_command_cannot_signal_a_host_process(
    kind: Isolation, workspace: Path, host_process: subprocess.Popen[bytes]
) -> None:
    if kind == "landlock" and abi_version() < 6:
        pytest.skip(f"Landlock ABI {abi_version()} does not scope signals (6 does, Linux 6.12): a documented gap")
    pid = host_process.pid
    command = f"kill -STOP {pid}; kill -TERM {pid}; kill -KILL {pid}; echo end"
    out = await _run(sandbox_of(kind), workspace, command)
    assert "end" in out, out
    assert host_process.poll() is None, "the host process died"
    assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"), "it was stopped"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_command_still_sets_its_own_limits_and_priority(kind: Isolation, workspace: Path) -> None:
    out = await _run(
        sandbox_of(kind),
        workspace,
        "prlimit --nofile=50 sh -c 'ulimit -n'; nice -n 5 sh -c 'echo nice-ok'; "
        "python3 -c 'import os; os.setpriority(os.PRIO_PROCESS, 0, 7); print(os.getpriority(os.PRIO_PROCESS, 0))'",
    )
    assert out.split() == ["50", "nice-ok", "7"], out


_HOGS = r"""
import sys, time
block = bytearray({size})  # zeroed by the kernel: touch every page so that it is really resident
for i in range(0, len(block), 4096):
    block[i] = 1
time.sleep(4)
print("survived", sys.argv[1], flush=True)
"""


def _memory_box(kind: Isolation, *, budget_mb: int, watchdog: bool = False) -> Sandbox:
    box = sandbox_of(kind)
    box = dataclasses.replace(box, limits=dataclasses.replace(box.limits, memory_mb=budget_mb))
    if watchdog:  # a host without a usable memory cgroup
        box = dataclasses.replace(box, memory_root=None)
    return box


@pytest.mark.parametrize("watchdog", [False, True], ids=["cgroup", "watchdog"])
@pytest.mark.parametrize("kind", KINDS)
async def test_the_processes_of_one_command_share_one_memory_budget(
    kind: Isolation, watchdog: bool, workspace: Path
) -> None:
    box = _memory_box(kind, budget_mb=160, watchdog=watchdog)
    if not watchdog and box.memory_root is None:
        pytest.skip("no memory cgroup on this host")
    script = _script(workspace, "hog.py", _HOGS.format(size=70 * 2**20))
    done = await box.run(
        f"for i in 1 2 3; do {script} $i & done; wait; echo waited", workspace, timeout_s=30, max_output=5000
    )
    survived = done.stdout.count("survived")
    assert survived < 3, (done.stdout, done.stderr)
    if not watchdog:  # the kernel kills until the rest fit: one, or a second one still growing while it did
        assert survived >= 1, (done.stdout, done.stderr)
    assert "memory" in done.stderr, done.stderr  # the output says why processes died


@pytest.mark.parametrize("kind", KINDS)
async def test_one_process_within_the_budget_runs(kind: Isolation, workspace: Path) -> None:
    box = _memory_box(kind, budget_mb=160)
    script = _script(workspace, "hog.py", _HOGS.format(size=70 * 2**20))
    done = await box.run(f"{script} 1", workspace, timeout_s=30, max_output=5000)
    assert (done.stdout, done.exit_code) == ("survived 1\n", 0), done.stderr


@pytest.mark.parametrize("kind", KINDS)
async def test_memory_cgroups_are_removed_after_each_command_also_when_killed(kind: Isolation, workspace: Path) -> None:
    box = _memory_box(kind, budget_mb=160)
    if box.memory_root is None:
        pytest.skip("no memory cgroup on this host")
    mine = f"switchboard-{os.getpid()}-"  # other processes (the suite's other workers) make cgroups here meanwhile
    root = box.memory_root

    def own() -> set[str]:
        return {p.name for p in root.iterdir() if p.is_dir() and p.name.startswith(mine)}

    before = own()
    await box.run("echo done", workspace, timeout_s=10, max_output=100)
    timed_out = await box.run("sleep 30 & sleep 30", workspace, timeout_s=0.5, max_output=100)
    assert timed_out.timed_out
    assert own() == before


async def test_concurrent_commands_are_bounded_by_the_workers_total_budget(workspace: Path) -> None:
    box = dataclasses.replace(
        sandbox_of("bwrap"),
        limits=dataclasses.replace(sandbox_of("bwrap").limits, memory_mb=100, memory_total_mb=250),
        _slots={},
    )
    marker = workspace / "running"
    marker.mkdir()
    command = "touch running/$$; sleep 0.6; ls running | wc -l; rm running/$$"
    results = await asyncio.gather(*(box.run(command, workspace, timeout_s=20, max_output=100) for _ in range(5)))
    assert max(int(done.stdout.split()[0]) for done in results) <= 2  # 250 MB holds two budgets of 100 MB


@pytest.mark.parametrize("kind", KINDS)
async def test_pid_1_and_the_commands_environment_name_no_host_path(kind: Isolation, tmp_path: Path) -> None:
    data = tmp_path / "data-dir-of-the-host"
    workspace = data / "workspaces" / "t" / "session"
    workspace.mkdir(parents=True)
    workspace.chmod(0o777)
    out = await _run(
        sandbox_of(kind),
        workspace,
        "for f in /proc/1/cmdline /proc/1/environ /proc/self/environ /proc/$PPID/cmdline /proc/$PPID/environ; "
        "do tr '\\0' ' ' < $f; echo; done; echo end",
    )
    assert "end" in out, out
    assert "data-dir-of-the-host" not in out, out
    repo = str(Path(__file__).resolve().parents[2])
    assert f"{repo}/switchboard" not in out, out


@pytest.mark.parametrize(
    "kind",
    [
        "bwrap",
        pytest.param(
            "landlock",
            marks=pytest.mark.xfail(
                strict=True, reason="Landlock has no hook on stat or path walk: a known gap of the level (docs)"
            ),
        ),
    ],
)
async def test_a_command_cannot_see_which_host_files_exist(kind: Isolation, workspace: Path, tmp_path: Path) -> None:
    secret = tmp_path / "egress" / "ca.key"
    secret.parent.mkdir()
    secret.write_text("k" * 1234)
    out = await _run(sandbox_of(kind), workspace, f"stat -c 'size=%s' {secret}; ls {secret.parent}; echo end")
    assert "end" in out, out
    assert "size=1234" not in out and "ca.key" not in out.replace(str(secret), ""), out
