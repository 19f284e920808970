"""What one sandboxed command may use, and how the limits are applied.

Per-process limits are set with ``prlimit`` inside the sandbox right before the command starts, so they bind
everything it starts. Processes are capped by ``RLIMIT_NPROC`` where the kernel counts them per sandbox, else by a
``pids`` cgroup (root is exempt from ``RLIMIT_NPROC``); memory is one budget per command, a memory cgroup where one can
be made, else a watchdog over the process tree (:func:`process_tree`). :class:`CommandCgroup` makes and removes them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CommandCgroup",
    "CommandLimits",
    "find_memory_root",
    "find_pids_root",
    "memfd_memory",
    "memory_enforcement",
    "process_tree",
    "tasks_of_this_user",
]

_SEQUENCE = itertools.count()


@dataclass(frozen=True, slots=True)
class CommandLimits:
    """Bounds of one command (``SWITCHBOARD_SANDBOX__*``)."""

    max_wall_s: float = 600.0
    """Longest deadline honoured, whatever the caller asks; the process group is killed when it passes."""
    cpu_s: int = 60
    """``RLIMIT_CPU``."""
    memory_mb: int = 1024
    """Memory of the whole command (a memory cgroup or the watchdog), and ``RLIMIT_AS`` of each of its processes."""
    memory_total_mb: int = 4096
    """Memory of all the commands of one worker together: bounds how many run at once."""
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

    def slots(self, concurrency: int) -> int:
        """Commands that may run at once: ``concurrency``, fewer where their budgets would pass the worker's total."""
        return max(1, min(concurrency, self.memory_total_mb // self.memory_mb))


def _mounts() -> list[tuple[Path, str, str, str]]:
    """The cgroup mounts of this process: mount point, root within the hierarchy, type, super options."""
    found: list[tuple[Path, str, str, str]] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split(" - ")
            if len(fields) != 2:
                continue
            before = fields[0].split()
            fstype, _source, options = [*fields[1].split(), "", ""][:3]
            if fstype in ("cgroup", "cgroup2"):
                found.append((Path(before[4]), before[3], fstype, options))
    return found


def _own_cgroup(controller: str | None) -> str | None:
    """This process's cgroup in the v1 hierarchy holding ``controller`` (``None``: the v2 hierarchy)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _id, controllers, path = line.split(":", 2)
            if (controller is None and controllers == "") or (controller in controllers.split(",")):
                return path
    return None


def find_memory_root() -> Path | None:
    """A directory where per-command memory cgroups can be made (v1 or v2), or ``None``.

    On v1 this process's own cgroup (commands stay inside whatever bounds the worker, and nothing is left in it once
    they end); on v2 the ``switchboard-sandbox`` cgroup at the root of the mount (where the ``pids`` cgroups are
    made too: a process is in one cgroup per hierarchy), when the ``memory`` controller is delegated there (a cgroup
    holding processes cannot hand a controller down).
    """
    for mount, root, fstype, options in _mounts():
        if fstype == "cgroup" and "memory" in options.split(","):
            own = _own_cgroup("memory")
            if own is None or not (own + "/").startswith(root.rstrip("/") + "/"):
                continue
            base = mount / own[len(root.rstrip("/")) :].lstrip("/")  # nothing left behind once commands end
            limit_file = "memory.limit_in_bytes"
        elif fstype == "cgroup2":
            with contextlib.suppress(OSError):
                if "memory" not in (mount / "cgroup.subtree_control").read_text().split():
                    continue
            base, limit_file = mount / "switchboard-sandbox", "memory.max"
        else:
            continue
        try:
            base.mkdir(exist_ok=True)
            if fstype == "cgroup2":
                (base / "cgroup.subtree_control").write_text("+memory")
            probe = base / f"switchboard-probe-{os.getpid()}"
            probe.mkdir(exist_ok=True)
            try:
                (probe / limit_file).write_text(str(64 * 2**20))
            finally:
                probe.rmdir()
        except OSError:
            continue
        return base
    return None


def memory_enforcement(memory_root: Path | None) -> str:
    """How a command's memory budget is enforced, for ``switchboard check``."""
    if memory_root is None:
        return "memory by a watchdog over the command's processes (no usable memory cgroup)"
    version = "v2" if (memory_root / "cgroup.subtree_control").exists() else "v1"
    return f"memory by a cgroup {version} per command"


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


class CommandCgroup:
    """One command's cgroups: ``pids`` and memory (one directory where both roots are the same, on cgroup v2).

    Created before the command starts, removed when it has ended (its processes killed first).

    Raises:
        OSError: a cgroup could not be made or limited (whatever was made is removed).
    """

    def __init__(self, limits: CommandLimits, *, pids_root: Path | None, memory_root: Path | None) -> None:
        name = f"switchboard-{os.getpid()}-{next(_SEQUENCE)}"
        self.paths: list[Path] = []
        self.memory: Path | None = None
        try:
            for root in dict.fromkeys(r for r in (pids_root, memory_root) if r is not None):
                path = root / name
                path.mkdir()
                self.paths.append(path)
                if root == pids_root:
                    (path / "pids.max").write_text(str(limits.processes))
                if root == memory_root:
                    self.memory = path
                    _limit_memory(path, limits.memory_mb * 2**20)
        except OSError:
            self.remove()
            raise

    @property
    def procs(self) -> list[str]:
        """The files a process writes its pid to, to join."""
        return [str(path / "cgroup.procs") for path in self.paths]

    def members(self) -> list[int]:
        """The processes in the command's cgroups."""
        found: set[int] = set()
        for procs in self.procs:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(pid) for pid in Path(procs).read_text().split())
        return sorted(found)

    def oom_kills(self) -> int:
        """Processes the kernel killed for passing the memory budget (``memory.events`` or ``memory.oom_control``)."""
        if self.memory is None:
            return 0
        for name in ("memory.events", "memory.oom_control"):
            with contextlib.suppress(OSError):
                for line in (self.memory / name).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        return 0

    def remove(self) -> None:
        """Remove the cgroups (every process in them has ended by then)."""
        for path in self.paths:
            with contextlib.suppress(OSError):
                path.rmdir()


def _limit_memory(path: Path, limit: int) -> None:
    """Set a memory cgroup's limit, swap included (v2: ``memory.max``; v1: ``memory.limit_in_bytes``)."""
    if (path / "memory.max").exists():
        (path / "memory.max").write_text(str(limit))
        with contextlib.suppress(OSError):  # no swap accounting: no swap to hide in either
            (path / "memory.swap.max").write_text("0")
        return
    (path / "memory.limit_in_bytes").write_text(str(limit))
    with contextlib.suppress(OSError):
        (path / "memory.memsw.limit_in_bytes").write_text(str(limit))  # only after memory.limit_in_bytes
    with contextlib.suppress(OSError):
        (path / "memory.swappiness").write_text("0")


def process_tree(root: int) -> dict[int, int]:
    """``root`` and every live process below it, each with its resident memory in bytes (one pass over ``/proc``)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        pid = int(name)
        children.setdefault(int(fields[1]), []).append(pid)
        rss[pid] = int(fields[21]) * page  # field 24 of stat: resident pages
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in rss and pid not in found:
            found[pid] = rss[pid]
            todo.extend(children.get(pid, []))
    return found


def memfd_memory(pids: Iterable[int]) -> int:
    """Bytes held by the anonymous files (``memfd_create``) that ``pids`` keep open or mapped, each file once.

    A memfd's pages are memory that no resident size counts until they are mapped and touched: written with
    ``write()`` and kept open, they would pass the watchdog unseen. An open file counts its allocated blocks; a file
    only mapped counts the size of its mappings.
    """
    held: dict[int, int] = {}
    mapped: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                        info = os.stat(f"/proc/{pid}/fd/{fd}")
                        held[info.st_ino] = info.st_blocks * 512
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps", "rb") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith(b"/memfd:"):
                    start, end = (int(bound, 16) for bound in fields[0].split(b"-"))
                    inode = int(fields[4])
                    mapped[inode] = max(mapped.get(inode, 0), end - start)
    return sum(held.values()) + sum(size for inode, size in mapped.items() if inode not in held)


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
