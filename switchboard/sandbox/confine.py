"""The Landlock launcher: confine the command, run it, and end whatever it leaves behind (stdlib only).

``python -I -S …/confine.py SPEC -- ARGV...`` (by path, without ``site``, so it starts quickly) where ``SPEC`` is
JSON: ``{"landlock": bool, "ro": [paths], "rw": [paths], "seccomp": "<hex>"}``. The process (already in its own
session, with a scrubbed environment) drops every capability if it runs as root (bounding set, ambient,
effective, permitted; securebits locked so that ``execve`` gives none back: uid 0 keeps only what the owner bits
of its files allow), sets ``no_new_privs``, and makes itself a child subreaper. It then forks the command, which
restricts itself with a Landlock ruleset — read and execute beneath ``ro``, everything beneath ``rw``, no TCP bind
or connect (ABI 4+), no signals or abstract unix sockets outside its domain (ABI 6+, so the command cannot kill
its launcher) — loads the seccomp filter (:mod:`switchboard.sandbox.seccomp`), and executes. When the command
exits, or the runner sends SIGTERM at the deadline, the launcher SIGKILLs every process below it — a daemon that
left the process group with ``setsid`` is re-parented to the subreaper, so it is among them — and exits with the
command's status. The weak floor uses the same launcher with seccomp but without Landlock. Any failure to confine
exits with status 126 before the command starts: a command never runs less confined than asked.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import signal
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["abi_version", "drop_capabilities", "main", "restrict", "sweep"]

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on x86_64 and aarch64
_VERSION_FLAG = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1, 2, 4, 8
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | 16384 | 32768  # + truncate (ABI 3), ioctl_dev (ABI 5)
_READ = _EXECUTE | _READ_FILE | _READ_DIR
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_NET_TCP = 1 | 2  # bind, connect
_SCOPES = 1 | 2  # abstract unix sockets, signals
FAILED = 126


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI version, or 0 when Landlock is unavailable."""
    version = _libc().syscall(_CREATE_RULESET, None, 0, _VERSION_FLAG)
    return max(int(version), 0)


def restrict(read_only: list[str], writable: list[str]) -> int:
    """Confine the calling process to ``read_only`` and ``writable`` paths and no TCP; returns the ABI used.

    Raises:
        OSError: Landlock is unavailable or refused a rule.
    """
    libc = _libc()
    abi = abi_version()
    if abi < 1:
        raise OSError("Landlock is not available")
    fs = _FS_BY_ABI.get(abi, (1 << 16) - 1)
    attr = struct.pack("=QQQ", fs, _NET_TCP if abi >= 4 else 0, _SCOPES if abi >= 6 else 0)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.c_char_p(attr[:size]), size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    for paths, rights in ((read_only, _READ), (writable, fs)):
        for path in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # absent on this host
            allowed = rights if os.path.isdir(path) else rights & _FILE_RIGHTS & fs
            rule = struct.pack("=Qi", allowed, fd)
            done = libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.c_char_p(rule), 0)
            os.close(fd)
            if done != 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.syscall(_RESTRICT_SELF, ruleset, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    os.close(ruleset)
    return abi


_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_SECURE_ALL_LOCKED = 0x3F  # noroot, no_setuid_fixup, keep_caps_locked (and their locks)
_CAP_VERSION_3 = 0x20080522
_LAST_CAP = 63


def drop_capabilities() -> None:
    """Give up every capability for good (the process stays uid 0 where it was root, with no privilege).

    Raises:
        OSError: the kernel refused a step.
    """
    libc = _libc()
    if libc.prctl(_PR_SET_SECUREBITS, _SECURE_ALL_LOCKED, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECUREBITS) failed")
    for cap in range(_LAST_CAP + 1):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such cap
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap}) failed")
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = ctypes.create_string_buffer(struct.pack("=Ii", _CAP_VERSION_3, 0))
    data = ctypes.create_string_buffer(bytes(24))  # two {effective, permitted, inheritable} sets, all empty
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _seccomp_installer() -> Callable[[bytes], None]:
    """:func:`switchboard.sandbox.seccomp.install`, imported from beside this file (before Landlock hides it)."""
    spec = importlib.util.spec_from_file_location("_sandbox_seccomp", Path(__file__).with_name("seccomp.py"))
    if spec is None or spec.loader is None:
        raise OSError("the seccomp module is missing")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    install: Callable[[bytes], None] = module.install
    return install


class _Stopped(Exception):
    """The runner asked the launcher to end the command (its deadline passed, or the call was cancelled)."""


def _stop(signum: int, frame: object) -> None:
    raise _Stopped


def _children(pid: int) -> list[int] | None:
    """The children of ``pid`` from ``/proc/PID/task/*/children``; ``None`` when the kernel does not offer them."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone meanwhile
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as children:
                found += [int(each) for each in children.read().split()]
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}"):
                return found  # the process went away meanwhile
            return None  # no CONFIG_PROC_CHILDREN: the caller scans every process
        except OSError:
            continue
    return found


def _descendants(root: int) -> list[int]:
    """Every live process below ``root`` in the process tree (read from ``/proc``)."""
    found: list[int] = []
    todo = _children(root)
    if todo is None:
        return _descendants_by_scan(root)
    while todo:
        pid = todo.pop()
        found.append(pid)
        below = _children(pid)
        if below is None:
            return _descendants_by_scan(root)
        todo += below
    return found


def _descendants_by_scan(root: int) -> list[int]:
    """:func:`_descendants` from the parent of every process (kernels without ``/proc/PID/task/TID/children``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def sweep(rounds: int = 2000) -> None:
    """SIGKILL every process below this one and reap them, until none is left.

    This process is a child subreaper, so whatever a command left behind (a daemon in a session of its own, a
    double fork) is re-parented here when its parent dies and stays in reach.
    """
    me = os.getpid()
    for _ in range(rounds):
        try:  # no child at all means nothing below: an orphan would have been re-parented here
            if os.waitpid(-1, os.WNOHANG)[0] > 0:
                continue
        except ChildProcessError:
            return
        for pid in _descendants(me):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue  # gone meanwhile
        reaped = False
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                reaped = True
        except ChildProcessError:
            return  # no child left: every descendant is gone (orphans come back here as children)
        if not reaped:
            time.sleep(0.01)


def _exec(
    paths: tuple[list[str], list[str]] | None, seccomp: bytes, command: list[str], install: Callable[[bytes], None]
) -> None:
    """In the forked child: confine, then become the command (never returns)."""
    try:
        for signum in _STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        if paths is not None:
            restrict(*paths)
        if seccomp:
            install(seccomp)
        os.execvp(command[0], command)  # noqa: S606 - the command runs as given, confined
    except (OSError, ValueError, KeyError) as err:
        sys.stderr.write(f"sandbox: could not confine the command: {err}\n")
        sys.stderr.flush()
    os._exit(FAILED)


def main(argv: list[str]) -> int:
    """Confine and run ``argv`` after ``--``, then end whatever it left behind; returns the command's exit status.

    The launcher stays as the command's parent and a child subreaper. The command runs confined (Landlock's
    nested domain scopes its signals, so it cannot kill the launcher on ABI 6+); when it exits — or when the
    launcher gets SIGTERM from the runner at the deadline — every process it started, daemons included, is killed.
    """
    try:
        spec = json.loads(argv[0])
        command = argv[argv.index("--") + 1 :]
        paths = ([str(p) for p in spec["ro"]], [str(p) for p in spec["rw"]]) if spec["landlock"] else None
        seccomp = bytes.fromhex(spec["seccomp"])
        install = _seccomp_installer()
        if os.geteuid() == 0:
            drop_capabilities()
        if _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
        if _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    except (OSError, ValueError, KeyError, IndexError) as err:
        sys.stderr.write(f"sandbox: could not confine the command: {err}\n")
        return FAILED
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _stop)
    code = 128 + signal.SIGKILL
    try:
        child = os.fork()
        if child == 0:
            _exec(paths, seccomp, command, install)
        while True:
            pid, status = os.waitpid(-1, 0)  # reaps orphans re-parented here too
            if pid == child:
                code = os.waitstatus_to_exitcode(status)
                code = 128 - code if code < 0 else code
                break
    except _Stopped:
        pass
    finally:
        for signum in _STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        sweep()
    return code


if __name__ == "__main__":  # pragma: no cover - runs in the child
    status = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(status)  # no interpreter shutdown: the runner is waiting for this exit
