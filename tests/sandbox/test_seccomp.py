"""The seccomp filter, loaded into a real child process: what it refuses and what it lets through."""

from __future__ import annotations

import subprocess
import sys

import pytest

from switchboard.sandbox.seccomp import ARCHES, DENIED, HOST_IPC, SELF_ONLY, SeccompError, program

PROBE = """
import ctypes, errno, os, socket, sys
from switchboard.sandbox.seccomp import install, program
install(program(inet={inet}))
results = {{}}
for name, family in (("unix", socket.AF_UNIX), ("inet", socket.AF_INET), ("inet6", socket.AF_INET6),
                     ("netlink", socket.AF_NETLINK)):
    try:
        socket.socket(family, socket.SOCK_STREAM if family != socket.AF_NETLINK else socket.SOCK_RAW).close()
        results[name] = "ok"
    except OSError as err:
        results[name] = errno.errorcode[err.errno]
a, b = socket.socketpair()
results["socketpair"] = "ok"
libc = ctypes.CDLL(None, use_errno=True)
results["ptrace"] = "ok" if libc.ptrace(0, 0, 0, 0) == 0 else errno.errorcode[ctypes.get_errno()]
results["unshare"] = "ok" if libc.unshare(0x10000000) == 0 else errno.errorcode[ctypes.get_errno()]
print(results)
"""


def probe(inet: bool) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(inet=inet)], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    return dict(eval(done.stdout))


def test_only_unix_sockets_are_allowed() -> None:
    assert probe(inet=False) == {
        "unix": "ok",
        "inet": "EAFNOSUPPORT",
        "inet6": "EAFNOSUPPORT",
        "netlink": "EAFNOSUPPORT",
        "socketpair": "ok",
        "ptrace": "EPERM",
        "unshare": "EPERM",
    }


def test_the_bridge_variant_also_allows_ip_sockets() -> None:
    found = probe(inet=True)
    assert (found["inet"], found["inet6"], found["netlink"], found["ptrace"]) == ("ok", "ok", "EAFNOSUPPORT", "EPERM")


def test_every_denied_call_has_a_number_on_every_machine() -> None:
    for _arch, numbers in ARCHES.values():
        assert set(DENIED) | set(SELF_ONLY) | set(HOST_IPC) | {
            "socket",
            "clone",
            "clone3",
            "setpriority",
            "ioprio_set",
        } == set(numbers)
        assert len(set(numbers.values())) == len(numbers)


def test_the_program_is_whole_instructions_and_fits_the_kernel_limit() -> None:
    for machine in ARCHES:
        code = program(machine, shared_pids=True)
        assert len(code) % 8 == 0 and len(code) // 8 < 4096


def test_an_unknown_machine_is_refused() -> None:
    with pytest.raises(SeccompError):
        program("sparc64")


NAMESPACES = """
import ctypes, errno, os, platform, socket, threading, subprocess
from switchboard.sandbox.seccomp import install, program
install(program(unix={unix}))
libc = ctypes.CDLL(None, use_errno=True)
results = {{}}
def err() -> str:
    return errno.errorcode[ctypes.get_errno()]
try:
    socket.socket(socket.AF_UNIX).close()
    results["unix"] = "ok"
except OSError as e:
    results["unix"] = errno.errorcode[e.errno]
a, b = socket.socketpair()
results["socketpair"] = "ok"
clone = {{"x86_64": 56, "aarch64": 220}}[platform.machine()]
for name, flag in (("newuser", 0x10000000), ("newns", 0x00020000), ("newnet", 0x40000000), ("newpid", 0x20000000)):
    pid = libc.syscall(clone, flag | 17, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
    results[name] = "ok" if pid > 0 else err()
class Args(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("flags", "pidfd", "ctid", "ptid", "sig", "stack", "size", "tls")]
results["clone3"] = "ok" if libc.syscall(435, ctypes.byref(Args(sig=17)), ctypes.sizeof(Args)) >= 0 else err()
for name, number in (("open_tree", 428), ("move_mount", 429), ("fsopen", 430), ("fsconfig", 431), ("fsmount", 432),
                     ("fspick", 433), ("mount_setattr", 442)):
    results[name] = "ok" if libc.syscall(number, 0, 0, 0, 0, 0) >= 0 else err()
done = []
thread = threading.Thread(target=done.append, args=(1,))
thread.start()
thread.join()
results["thread"] = "ok" if done else "no"
results["fork"] = subprocess.run(["true"], check=False).returncode
print(results)
"""


@pytest.mark.parametrize("unix", [True, False])
def test_namespaces_and_the_mount_api_are_refused_and_plain_processes_still_start(unix: bool) -> None:
    done = subprocess.run(
        [sys.executable, "-c", NAMESPACES.format(unix=unix)], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    found = dict(eval(done.stdout))
    assert found == {
        "unix": "ok" if unix else "EAFNOSUPPORT",  # the Landlock/weak filter refuses AF_UNIX: host sockets
        "socketpair": "ok",
        "newuser": "EPERM",
        "newns": "EPERM",
        "newnet": "EPERM",
        "newpid": "EPERM",
        "clone3": "ENOSYS",  # so that the C library falls back to clone, whose flags the filter reads
        "open_tree": "EPERM",
        "move_mount": "EPERM",
        "fsopen": "EPERM",
        "fsconfig": "EPERM",
        "fsmount": "EPERM",
        "fspick": "EPERM",
        "mount_setattr": "EPERM",
        "thread": "ok",
        "fork": 0,
    }


OTHER_PROCESSES = """
import ctypes, errno, os, platform, resource, subprocess
from switchboard.sandbox.seccomp import install, program
os.setpgid(0, 0)  # a process group of its own: the group-wide calls below reach nothing else
child = subprocess.Popen(["sleep", "30"])
install(program(unix=False, shared_pids={shared}))
libc = ctypes.CDLL(None, use_errno=True)
ioprio_set = {{"x86_64": 251, "aarch64": 30}}[platform.machine()]
def call(fn, *args):
    try:
        fn(*args)
        return "ok"
    except OSError as err:
        return errno.errorcode[err.errno]
def raw(number, *args):
    return "ok" if libc.syscall(number, *args) == 0 else errno.errorcode[ctypes.get_errno()]
results = {{
    "prlimit-other": call(resource.prlimit, child.pid, resource.RLIMIT_CPU, (100, 100)),
    "prlimit-self": call(resource.prlimit, 0, resource.RLIMIT_CPU, (100, 100)),
    "setrlimit": call(resource.setrlimit, resource.RLIMIT_NOFILE, (64, 64)),
    "nice-other": call(os.setpriority, os.PRIO_PROCESS, child.pid, 5),
    "nice-group": call(os.setpriority, os.PRIO_PGRP, 0, 5),
    "nice-user": call(os.setpriority, os.PRIO_USER, os.getuid() + 1, 5),  # a uid with no process: harmless if let
    "nice-self": call(os.setpriority, os.PRIO_PROCESS, 0, 6),
    "ioprio-other": raw(ioprio_set, 1, child.pid, (3 << 13)),
    "ioprio-group": raw(ioprio_set, 2, 0, (3 << 13)),
    "ioprio-self": raw(ioprio_set, 1, 0, (2 << 13) | 4),
    "affinity-other": call(os.sched_setaffinity, child.pid, {{0}}),
    "affinity-self": call(os.sched_setaffinity, 0, os.sched_getaffinity(0)),
    "scheduler-other": call(os.sched_setscheduler, child.pid, os.SCHED_BATCH, os.sched_param(0)),
    "scheduler-self": call(os.sched_setscheduler, 0, os.SCHED_BATCH, os.sched_param(0)),
    "param-other": call(os.sched_setparam, child.pid, os.sched_param(0)),
}}
child.kill()
print(results)
"""


@pytest.mark.parametrize("shared", [True, False])
def test_with_shared_pids_only_the_caller_changes_its_limits_and_scheduling(shared: bool) -> None:
    done = subprocess.run(
        [sys.executable, "-c", OTHER_PROCESSES.format(shared=shared)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = dict(eval(done.stdout))
    others = {name: value for name, value in found.items() if not name.endswith(("-self", "setrlimit"))}
    assert {name: found[name] for name in found if name not in others} == dict.fromkeys(
        ["prlimit-self", "setrlimit", "nice-self", "ioprio-self", "affinity-self", "scheduler-self"], "ok"
    )
    if shared:
        assert others == dict.fromkeys(others, "EPERM")
    else:  # bubblewrap's filter: its pid namespace holds no host process
        assert others["prlimit-other"] == "ok" and others["nice-group"] == "ok"
