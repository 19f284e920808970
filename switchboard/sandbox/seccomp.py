"""A small seccomp-BPF filter for sandboxed commands, built from a table of syscall numbers.

:func:`program` builds the raw ``struct sock_filter`` array (the policy is on its docstring) that ``bwrap --seccomp``
loads, and the Landlock launcher loads the same bytes; :func:`install` loads it into the calling process. No
libseccomp: the table below is the whole policy, and ``tests/sandbox`` checks it against the kernel.
"""

from __future__ import annotations

import errno
import platform
import struct

from switchboard.sandbox.confine import install_filter

__all__ = ["ARCHES", "DENIED", "HOST_IPC", "SELF_ONLY", "SeccompError", "install", "program"]

# BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_OFF_NR = 0
_OFF_ARCH = 4
_OFF_ARG0 = 16
_OFF_ARG1 = 24
_PRIO_PROCESS = 0
_IOPRIO_WHO_PROCESS = 1
_AF_UNIX = 1
_AF_INET = 2
_AF_INET6 = 10
_X32_BIT = 0x40000000

DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "kexec_load",
    "init_module",
    "finit_module",
    "delete_module",
)
"""System calls refused with ``EPERM`` (besides ``socket()`` of any family but ``AF_UNIX``)."""

SELF_ONLY = ("prlimit64", "sched_setparam", "sched_setscheduler", "sched_setaffinity", "sched_setattr")
"""Calls whose first argument is a pid: with ``shared_pids``, refused with ``EPERM`` unless it is 0 (the caller)."""

HOST_IPC = (
    "shmget",
    "shmat",
    "shmctl",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "mq_open",
    "mq_unlink",
)
"""System V IPC and POSIX message queues: with ``shared_pids`` (the host's IPC namespace too), refused with ``EPERM``.

Their objects outlive the command (memory no cgroup of the command keeps and nothing removes) and reach the
host's and other sessions' objects by id.
"""

ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,  # AUDIT_ARCH_X86_64
        {
            "socket": 41,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "bpf": 321,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "unshare": 272,
            "setns": 308,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "mount_setattr": 442,
            "clone": 56,
            "clone3": 435,
            "kexec_load": 246,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "prlimit64": 302,
            "setpriority": 141,
            "ioprio_set": 251,
            "sched_setparam": 142,
            "sched_setscheduler": 144,
            "sched_setaffinity": 203,
            "sched_setattr": 314,
            "shmget": 29,
            "shmat": 30,
            "shmctl": 31,
            "semget": 64,
            "semop": 65,
            "semctl": 66,
            "msgget": 68,
            "msgsnd": 69,
            "msgrcv": 70,
            "msgctl": 71,
            "semtimedop": 220,
            "mq_open": 240,
            "mq_unlink": 241,
        },
    ),
    "aarch64": (
        0xC00000B7,  # AUDIT_ARCH_AARCH64
        {
            "socket": 198,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "bpf": 280,
            "perf_event_open": 241,
            "userfaultfd": 282,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "unshare": 97,
            "setns": 268,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "mount_setattr": 442,
            "clone": 220,
            "clone3": 435,
            "kexec_load": 104,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "prlimit64": 261,
            "setpriority": 140,
            "ioprio_set": 30,
            "sched_setparam": 118,
            "sched_setscheduler": 119,
            "sched_setaffinity": 122,
            "sched_setattr": 274,
            "mq_open": 180,
            "mq_unlink": 181,
            "msgget": 186,
            "msgctl": 187,
            "msgrcv": 188,
            "msgsnd": 189,
            "semget": 190,
            "semctl": 191,
            "semtimedop": 192,
            "semop": 193,
            "shmget": 194,
            "shmctl": 195,
            "shmat": 196,
        },
    ),
}
"""Per machine: the audit architecture and the syscall numbers of the table."""


class SeccompError(OSError):
    """The filter could not be built for this machine, or the kernel refused it."""


_JSET_K = 0x45
_CLONE_NEW_NAMESPACES = 0x7E020000
"""``CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET`` (``CLONE_NEWTIME`` exists for
``clone3``/``unshare`` only: in ``clone``'s flags its bit is part of the exit signal)."""

_Op = tuple[int, int, str | None, str | None]
"""One instruction before assembly: code, ``k``, and the labels its true/false branches jump to (``None``: next)."""


def _assemble(ops: list[_Op | str]) -> bytes:
    """``struct sock_filter[]`` bytes of ``ops``, where a string marks the position of a label (forward jumps only)."""
    labels: dict[str, int] = {}
    code: list[_Op] = []
    for op in ops:
        if isinstance(op, str):
            labels[op] = len(code)
        else:
            code.append(op)

    def offset(index: int, label: str | None) -> int:
        if label is None:
            return 0
        jump = labels[label] - index - 1
        if not 0 <= jump <= 255:
            raise SeccompError(f"seccomp jump to {label} out of range")
        return jump

    return b"".join(struct.pack("=HBBI", c, offset(i, jt), offset(i, jf), k) for i, (c, k, jt, jf) in enumerate(code))


def program(machine: str | None = None, *, inet: bool = False, unix: bool = True, shared_pids: bool = False) -> bytes:
    """The filter for ``machine`` (default: this one) as ``struct sock_filter[]`` bytes.

    ``inet`` also allows IPv4/IPv6 sockets: only for a sandbox whose network namespace holds nothing but loopback
    (bubblewrap with the egress bridge listening there). ``unix=False`` refuses ``AF_UNIX`` sockets too, for a
    sandbox that shares the host's file system namespace (Landlock, the weak floor): Landlock does not mediate
    ``connect()`` to a pathname socket, so the host's sockets (the embedded Valkey's among them) would be in reach.
    ``socketpair()`` is another system call and stays allowed (pipes between a command's own processes).

    ``shared_pids``: the sandbox shares the host's pid namespace (Landlock, the weak floor), where a pid may name a
    host process of the worker's uid. Neither Landlock nor the capability checks stop ``prlimit64`` on such a
    process (a CPU limit of one second kills the gateway), nor the priority calls on a host process without
    capabilities; so :data:`SELF_ONLY` calls, ``setpriority`` and ``ioprio_set`` are allowed on the caller only (pid
    0; ``PRIO_PROCESS``/``IOPRIO_WHO_PROCESS`` with who 0: a process group or a user would reach the host's
    processes too) and refused with ``EPERM`` otherwise. A command still sets its own limits and priority. Such a
    sandbox shares the host's IPC namespace as well: the :data:`HOST_IPC` calls are refused with ``EPERM``.

    Whatever the options, ``clone`` with a ``CLONE_NEW*`` flag is refused with ``EPERM`` and ``clone3`` with
    ``ENOSYS`` (its flags sit behind a pointer the filter cannot read; C libraries then fall back to ``clone``).

    The filter kills a process that makes a system call under a foreign ABI (x32, 32-bit compat), refuses
    ``socket()`` for every address family but ``AF_UNIX`` (no TCP/UDP/raw/netlink sockets, so no network even where
    a network namespace is missing; sandboxes that share the host's file system refuse ``AF_UNIX`` too, see
    :func:`program`), and refuses with ``EPERM`` the calls a command has no business making: tracing other processes,
    io_uring (it bypasses this very filter), new namespaces (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*``
    flag) and mounts (``mount``, ``umount2``, ``pivot_root`` and the new mount API: ``open_tree``, ``move_mount``,
    ``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``, ``mount_setattr``), kernel keyrings, BPF, perf and module
    loading. ``clone3`` gets ``ENOSYS``: its flags are behind a pointer a filter cannot read, and C libraries fall
    back to ``clone`` on ``ENOSYS``. A sandbox sharing the host's pid namespace (Landlock, the weak floor) also gets
    ``EPERM`` for the calls that change another process's limits or scheduling (``prlimit64``, ``setpriority``,
    ``ioprio_set``, ``sched_setaffinity``/``setscheduler``/``setparam``/``setattr``) unless they name the caller itself
    (see :func:`program`). Everything else is allowed. :func:`program` returns the raw ``struct
    sock_filter`` array that ``bwrap --seccomp FD`` loads (bubblewrap applies it to the command, after it has set up
    its own namespaces); :func:`install` loads it into the calling process. The Landlock launcher's child loads the
    same bytes, built once per worker and handed over with the launcher (:func:`switchboard.sandbox.confine.payload`).

    Raises:
        SeccompError: no table for the machine.
    """
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise SeccompError(f"no seccomp table for {machine}")
    arch, numbers = ARCHES[machine]
    ops: list[_Op | str] = [
        (_LD_W_ABS, _OFF_ARCH, None, None),
        (_JEQ_K, arch, None, "kill"),
        (_LD_W_ABS, _OFF_NR, None, None),
    ]
    if machine == "x86_64":  # x32 system calls share the architecture and set bit 30
        ops.append((_JGE_K, _X32_BIT, "kill", None))
    ops += [
        (_JEQ_K, numbers["socket"], "socket", None),
        (_JEQ_K, numbers["clone"], "clone", None),
        (_JEQ_K, numbers["clone3"], "enosys", None),
    ]
    ops += [(_JEQ_K, numbers[name], "eperm", None) for name in DENIED]
    if shared_pids:
        ops += [(_JEQ_K, numbers[name], "self", None) for name in SELF_ONLY]
        ops += [(_JEQ_K, numbers[name], "eperm", None) for name in HOST_IPC]
        ops += [
            (_JEQ_K, numbers["setpriority"], "priority", None),
            (_JEQ_K, numbers["ioprio_set"], "ioprio", None),
        ]
    ops += [
        (_RET_K, _RET_ALLOW, None, None),
    ]
    if shared_pids:
        ops += [
            "priority",  # setpriority(which, who, prio): PRIO_PROCESS and who 0 only
            (_LD_W_ABS, _OFF_ARG0, None, None),
            (_JEQ_K, _PRIO_PROCESS, "who", "eperm"),
            "ioprio",  # ioprio_set(which, who, ioprio): IOPRIO_WHO_PROCESS and who 0 only
            (_LD_W_ABS, _OFF_ARG0, None, None),
            (_JEQ_K, _IOPRIO_WHO_PROCESS, "who", "eperm"),
            "who",
            (_LD_W_ABS, _OFF_ARG1, None, None),
            (_JEQ_K, 0, "allow", "eperm"),
            "self",  # the pid, an int: the kernel reads the low 32 bits only
            (_LD_W_ABS, _OFF_ARG0, None, None),
            (_JEQ_K, 0, "allow", "eperm"),
        ]
    ops += [
        "clone",
        (_LD_W_ABS, _OFF_ARG0, None, None),  # clone(flags, ...) on x86_64 and aarch64: the low 32 bits of flags
        (_JSET_K, _CLONE_NEW_NAMESPACES, "eperm", "allow"),
        "eperm",
        (_RET_K, _RET_ERRNO | errno.EPERM, None, None),
        "enosys",
        (_RET_K, _RET_ERRNO | errno.ENOSYS, None, None),
        "socket",
        (_LD_W_ABS, _OFF_ARG0, None, None),  # socket(domain, ...): the low 32 bits of the first argument
    ]
    families = ((_AF_UNIX,) if unix else ()) + ((_AF_INET, _AF_INET6) if inet else ())
    ops += [(_JEQ_K, family, "allow", None) for family in families]
    ops += [
        (_RET_K, _RET_ERRNO | errno.EAFNOSUPPORT, None, None),
        "allow",
        (_RET_K, _RET_ALLOW, None, None),
        "kill",
        (_RET_K, _RET_KILL_PROCESS, None, None),
    ]
    return _assemble(ops)


def install(filter_bytes: bytes) -> None:
    """Load the filter into the calling process (after ``no_new_privs``); it holds across ``execve``.

    The Landlock launcher loads it with the same code (:func:`switchboard.sandbox.confine.install_filter`).

    Raises:
        SeccompError: the kernel refused it.
    """
    try:
        install_filter(filter_bytes)
    except OSError as err:
        raise SeccompError(*err.args) from err
