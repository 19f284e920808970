"""What one sandboxed command may use, and how the limits are applied.

Per-process limits (address space, CPU seconds, file size, open files, no core files) are set with
``prlimit`` right before the command itself starts, inside the sandbox, so they bind the command and everything
it starts. The number of processes is capped by ``RLIMIT_NPROC`` where the kernel counts it per sandbox (a
worker that is not root: each bubblewrap sandbox has its own user namespace, so its count starts at one), and by
a ``pids`` cgroup where the worker is root (root's processes are exempt from ``RLIMIT_NPROC``, even in a user
namespace) — :class:`PidsCgroup` creates one per command and removes it afterwards.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CommandLimits", "PidsCgroup", "find_pids_root", "tasks_of_this_user"]

_SEQUENCE = itertools.count()


@dataclass(frozen=True, slots=True)
class CommandLimits:
    """Bounds of one command (``SWITCHBOARD_SANDBOX__*``)."""

    max_wall_s: float = 600.0
    """Longest deadline honoured, whatever the caller asks; the process group is killed when it passes."""
    cpu_s: int = 60
    """``RLIMIT_CPU``."""
    memory_mb: int = 1024
    """``RLIMIT_AS`` (address space)."""
    processes: int = 64
    """Processes and threads of one command (``RLIMIT_NPROC`` or ``pids.max``)."""
    file_mb: int = 64
    """Largest file one command may write (``RLIMIT_FSIZE``)."""
    open_files: int = 256
    """``RLIMIT_NOFILE``."""
    tmp_mb: int = 64
    """Size of the private ``/tmp`` (a tmpfs under bubblewrap)."""

    def prlimit_argv(self, prlimit: str, *, nproc: bool, already: int = 0, file_bytes: int | None = None) -> list[str]:
        """``prlimit`` options applying these limits to the command it starts.

        ``nproc``: cap processes too, at :attr:`processes` more than ``already`` (what the uid runs already, where
        the kernel counts the command's processes together with them: no user namespace of its own).
        ``file_bytes``: a lower file-size limit for this command (``0``: it may write no file at all).
        """
        fsize = self.file_mb * 2**20 if file_bytes is None else min(file_bytes, self.file_mb * 2**20)
        argv = [
            prlimit,
            f"--as={self.memory_mb * 2**20}",
            f"--cpu={self.cpu_s}",
            f"--fsize={fsize}",
            f"--nofile={self.open_files}",
            "--core=0",
        ]
        if nproc:
            argv.append(f"--nproc={self.processes + already}")
        return [*argv, "--"]


def find_pids_root() -> Path | None:
    """A ``pids`` cgroup directory this process may create children in (root only), or ``None``."""
    if os.geteuid() != 0:
        return None
    candidates: list[Path] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split(" - ")
            if len(fields) != 2:
                continue
            mount_point = Path(fields[0].split()[4])
            fstype, _source, options = [*fields[1].split(), "", ""][:3]
            if fstype == "cgroup" and "pids" in options.split(","):
                candidates.append(mount_point)
            elif fstype == "cgroup2":
                with contextlib.suppress(OSError):
                    if "pids" in (mount_point / "cgroup.subtree_control").read_text().split():
                        candidates.append(mount_point)
    for root in candidates:
        base = root / "switchboard-sandbox"
        try:
            base.mkdir(exist_ok=True)
            if (base / "cgroup.subtree_control").exists():  # cgroup v2: hand the controller down
                (base / "cgroup.subtree_control").write_text("+pids")
            if (base / "pids.max").exists():
                return base
        except OSError:
            continue
    return None


class PidsCgroup:
    """One command's ``pids`` cgroup: created before the command starts, removed when it has ended."""

    def __init__(self, base: Path, limit: int) -> None:
        self.path = base / f"{os.getpid()}-{next(_SEQUENCE)}"
        self.path.mkdir()
        (self.path / "pids.max").write_text(str(limit))

    @property
    def procs(self) -> str:
        """The file a process writes its pid to, to join."""
        return str(self.path / "cgroup.procs")

    def remove(self) -> None:
        """Remove the cgroup (every process in it has ended by then: the sandbox's pid namespace is gone)."""
        with contextlib.suppress(OSError):
            self.path.rmdir()


def tasks_of_this_user() -> int:
    """Processes and threads of this process's real uid now (what ``RLIMIT_NPROC`` counts without a namespace).

    One ``stat`` per process (paid by every Landlock command of a worker without a ``pids`` cgroup): the owner of
    ``/proc/PID/task`` is the process's, and its link count is two plus the process's threads.
    """
    uid, count = os.getuid(), 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                tasks = os.stat(f"/proc/{name}/task")
                if tasks.st_uid == uid:
                    count += tasks.st_nlink - 2
    return count
