"""A hostile command against the host's processes and memory, on both strong levels (bubblewrap, Landlock).

Every system call that names another process is aimed at a real host process of the worker's uid (a ``sleep``
started here); System V IPC objects and tmpfs files that would outlive the command, or hold memory that no
process's resident size counts, are tried too.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchboard.sandbox.runner import Isolation, Sandbox
from tests.sandbox.conftest import sandbox_of

pytestmark = pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64", reason="Linux x86_64")

KINDS = ["bwrap", "landlock"]

_PROCESS_PROBE = r"""
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
pid, pgid = int(sys.argv[1]), int(sys.argv[2])
def rep(name, rc):
    print(name, "ok" if rc >= 0 else "refused", flush=True)
class IOV(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(16)
local, remote = IOV(ctypes.addressof(buf), 16), IOV(0x400000, 16)
fd = libc.syscall(434, pid, 0)  # pidfd_open: allowed (it only names the process); what it is used for is not
if fd >= 0:
    rep("pidfd_send_signal", libc.syscall(424, fd, signal.SIGSTOP, None, 0))
    rep("pidfd_getfd", libc.syscall(438, fd, 0, 0))
    rep("process_madvise", libc.syscall(440, fd, ctypes.byref(local), 1, 21, 0))  # MADV_PAGEOUT
rep("kill_pgrp", libc.syscall(62, -pgid, signal.SIGSTOP))
rep("tgkill", libc.syscall(234, pid, pid, signal.SIGSTOP))
rep("process_vm_readv", libc.syscall(310, pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0))
rep("process_vm_writev", libc.syscall(311, pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0))
rep("ptrace_attach", libc.syscall(101, 16, pid, 0, 0))
rep("ptrace_seize", libc.syscall(101, 0x4206, pid, 0, 0))
rep("kcmp", libc.syscall(312, os.getpid(), pid, 0, 0, 0))
rep("get_robust_list", libc.syscall(274, pid, ctypes.byref(ctypes.c_void_p()), ctypes.byref(ctypes.c_size_t())))
mask = ctypes.c_ulong(1)
rep("migrate_pages", libc.syscall(256, pid, 64, ctypes.byref(mask), ctypes.byref(mask)))
rep("move_pages", libc.syscall(279, pid, 0, None, None, None, 0))
rep("setpriority_pgrp", libc.syscall(141, 1, pgid, 19))
rep("setpriority_user", libc.syscall(141, 2, 0, 19))
rep("ioprio_pgrp", libc.syscall(251, 2, pgid, 3 << 13))
rep("ioprio_user", libc.syscall(251, 3, 0, 3 << 13))
attr = (ctypes.c_uint32 * 14)(56, 3)  # size, SCHED_BATCH
rep("sched_setattr", libc.syscall(314, pid, attr, 0))
rep("prlimit64", libc.syscall(302, pid, 0, (ctypes.c_uint64 * 2)(1, 1), None))
for name, value in (("oom_score_adj", "1000"), ("autogroup", "19"), ("timerslack_ns", "1000000000"),
                    ("coredump_filter", "0"), ("clear_refs", "1"), ("mem", "x")):
    try:
        with open(f"/proc/{pid}/{name}", "w") as handle:
            handle.write(value)
        print("proc_" + name, "ok")
    except OSError:
        print("proc_" + name, "refused")
for path in ("/sys/fs/cgroup/memory/cgroup.procs", "/sys/fs/cgroup/pids/cgroup.procs", "/sys/fs/cgroup/cgroup.procs"):
    try:
        with open(path, "w") as handle:
            handle.write(str(os.getpid()))
        print("cgroup_escape", "ok")
    except OSError:
        print("cgroup_escape", "refused")
print("end")
"""


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    path.chmod(0o777)  # the sandbox's uid (nobody under bubblewrap) writes here
    return path


@pytest.fixture
def host_process() -> Iterator[subprocess.Popen[bytes]]:
    """A host process of the worker's uid, in a process group of its own."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _state(pid: int) -> dict[str, object]:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ionice = subprocess.run(["ionice", "-p", str(pid)], capture_output=True, text=True, check=False).stdout
    return {
        "stopped": stat[0] in "Tt",
        "nice": os.getpriority(os.PRIO_PROCESS, pid),
        "ionice": ionice,
        "cpu": resource.prlimit(pid, resource.RLIMIT_CPU),
        "policy": os.sched_getscheduler(pid),
        "oom": Path(f"/proc/{pid}/oom_score_adj").read_text(),
        "autogroup": Path(f"/proc/{pid}/autogroup").read_text() if Path(f"/proc/{pid}/autogroup").exists() else "",
        "cgroup": Path(f"/proc/{pid}/cgroup").read_text(),
    }


async def _run(box: Sandbox, workspace: Path, script: str, args: str = "", timeout_s: float = 30) -> str:
    (workspace / "p.py").write_text(script)
    (workspace / "p.py").chmod(0o644)
    done = await box.run(f"python3 p.py {args}", workspace, timeout_s=timeout_s, max_output=20_000)
    return done.stdout + done.stderr


@pytest.mark.parametrize("kind", KINDS)
async def test_no_call_naming_a_host_process_changes_it(
    kind: Isolation, workspace: Path, host_process: subprocess.Popen[bytes]
) -> None:
    pid = host_process.pid
    before = _state(pid)
    out = await _run(sandbox_of(kind), workspace, _PROCESS_PROBE, f"{pid} {pid}")
    assert out.rstrip().endswith("end"), out
    if kind == "landlock":  # the host's pids are in reach: every attempt refused
        assert " ok" not in out, out
    assert host_process.poll() is None, "the host process died"
    assert _state(pid) == before, out


def _ipc_ids() -> set[tuple[str, str]]:
    """The host's System V IPC objects (shared memory, message queues, semaphores) that the probe's could be.

    Only those made with the probe's mode (``666``, and 32 MiB for shared memory): other processes on the host (a
    PostgreSQL the suite started, with mode ``600``) create and remove their own while the probe runs.
    """
    found = set()
    for kind in ("shm", "msg", "sem"):
        for line in Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]:
            _key, ident, perms, *rest = line.split()
            if perms == "666" and (kind != "shm" or int(rest[0]) == _PROBE_SHM_BYTES):
                found.add((kind, ident))
    return found


_PROBE_SHM_BYTES = 32 << 20


_IPC_PROBE = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
size = 32 << 20
sid = libc.shmget(0, size, 0o1000 | 0o666)  # IPC_PRIVATE | IPC_CREAT: outlives its creator until removed
if sid >= 0:
    addr = libc.shmat(sid, None, 0)
    if addr not in (None, ctypes.c_void_p(-1).value):
        ctypes.memset(addr, 1, size)
        libc.shmdt(ctypes.c_void_p(addr))
print("shm", sid, libc.shmat(0, None, 0) not in (None, ctypes.c_void_p(-1).value))
print("msg", libc.msgget(0, 0o1000 | 0o666), libc.msgctl(0, 2, ctypes.create_string_buffer(256)))
print("sem", libc.semget(0, 1, 0o1000 | 0o666), libc.semctl(0, 0, 3, None))
print("end")
"""


@pytest.mark.parametrize("kind", KINDS)
async def test_no_ipc_object_outlives_the_command_or_reaches_the_hosts(kind: Isolation, workspace: Path) -> None:
    before = _ipc_ids()
    try:
        out = await _run(sandbox_of(kind), workspace, _IPC_PROBE)
        left = _ipc_ids() - before
    finally:
        for kind_, ident in _ipc_ids() - before:
            subprocess.run(["ipcrm", f"-{kind_[0]}", ident], check=False)
    assert out.rstrip().endswith("end"), out
    assert not left, f"memory and objects the command left on the host: {left}\n{out}"


_TMPFS_HOG = r"""
import mmap, os, sys, time
chunk = b"x" * (1 << 20)  # the largest file a command may write (file_mb): many of them, then
held = []
for where in sys.argv[1:]:
    try:
        for i in range(150):
            if where in ("memfd", "mapped"):
                fd = os.memfd_create("hog")
            else:
                fd = os.open(f"{where}{i}", os.O_CREAT | os.O_WRONLY, 0o600)
            os.write(fd, chunk)  # pages of a tmpfs: no process's resident size counts them
            if where == "mapped":  # kept by an untouched mapping alone
                held.append(mmap.mmap(fd, len(chunk)))
                os.close(fd)
            else:
                held.append(fd)
        print("held", where, flush=True)
    except OSError as err:
        print("refused", where, err.errno, flush=True)
    if where not in ("memfd", "mapped"):
        for fd in held:
            os.close(fd)
        held = []
time.sleep(1.5)
print("survived", flush=True)
"""


@pytest.mark.parametrize("kind", KINDS)
async def test_memory_held_in_tmpfs_counts_against_the_watchdogs_budget(kind: Isolation, workspace: Path) -> None:
    box = sandbox_of(kind)
    box = dataclasses.replace(box, memory_root=None, limits=dataclasses.replace(box.limits, memory_mb=64))
    for places in ("/dev/hog /dev/shm/hog memfd", "mapped") if kind == "bwrap" else ("memfd", "mapped"):
        out = await _run(box, workspace, _TMPFS_HOG, places)
        assert "survived" not in out or "held" not in out, f"150 MB held past a 64 MB budget:\n{out}"


@pytest.mark.parametrize("kind", KINDS)
async def test_memory_held_in_tmpfs_counts_against_the_cgroups_budget(kind: Isolation, workspace: Path) -> None:
    box = sandbox_of(kind)
    if box.memory_root is None:
        pytest.skip("no memory cgroup on this host: the watchdog's test above covers it")
    box = dataclasses.replace(box, limits=dataclasses.replace(box.limits, memory_mb=64))
    out = await _run(box, workspace, _TMPFS_HOG, "memfd")
    assert "survived" not in out or "held" not in out, f"150 MB held past a 64 MB budget:\n{out}"
