"""Session workspaces on disk: where each one lives, and the quotas every write is checked against.

A workspace is ``<root>/<tenant digest>/<session digest>``, so no session's directory lies inside another's. Every
write goes through :meth:`Workspaces.store`, checked against the session's, the tenant's and the total quota (running
totals in ledger files shared by every worker on the host); sandboxed commands are measured and settled afterwards.
Paths are bounded and directories count, so no tree on disk can make a write fail with ``RecursionError``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import os
import shutil
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from switchboard.core.workspaces.safepaths import (
    UnsafePathError,
    entry_stat,
    missing_dirs,
    parts_below,
    remove_entry,
    truncate_entry,
    write_bytes,
)
from switchboard.errors import ToolError

__all__ = [
    "DIRECTORY_BYTES",
    "MAX_NAME_BYTES",
    "MAX_PATH_BYTES",
    "MAX_PATH_PARTS",
    "SYNC_DIR",
    "Quotas",
    "Snapshot",
    "Workspaces",
    "make_private_dir",
    "path_bound_error",
    "read_total_bytes",
    "tenant_dir",
    "workspace_for",
]

_LEDGER = ".usage"
SYNC_DIR = ".sync"
"""Directory under the root where a remote store keeps what each working directory last synced (not a tenant)."""
_NOT_TENANTS = frozenset({_LEDGER, SYNC_DIR})
_TOTAL = "total"

DIRECTORY_BYTES = 4096
"""What one directory inside a workspace counts against the byte quotas (one ext4 block), besides one entry."""
MAX_PATH_PARTS = 32
"""Most components a workspace-relative path may have (``a/b/c.txt`` has 3)."""
MAX_PATH_BYTES = 1024
"""Longest workspace-relative path, in UTF-8 bytes."""
MAX_NAME_BYTES = 255
"""Longest file or directory name, in UTF-8 bytes (the limit of common Linux file systems)."""


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def make_private_dir(path: Path) -> Path:
    """Create ``path`` and any missing parents as ``0700``; an existing ``path`` is tightened to ``0700``.

    Workspaces and the data directory hold conversation text: readable by their owner only, whatever the umask.
    ``path`` itself is never followed: if it is a symlink (a command may have planted one), this raises
    :class:`~switchboard.core.workspaces.safepaths.UnsafePathError` and changes nothing through it.
    """
    path = Path(path)
    missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
    for part in reversed(missing):
        with contextlib.suppress(FileExistsError):
            part.mkdir(mode=0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in {errno.ELOOP, errno.ENOTDIR}:
            raise UnsafePathError(errno.ELOOP, "a symlink or a file stands where a directory was to be") from None
        raise
    try:
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path


def path_bound_error(parts: Sequence[str]) -> str | None:
    """Why a workspace-relative path made of ``parts`` is refused (too deep, too long), or ``None`` if it is not.

    The message names no path at all (the model's own may be kilobytes long; a host path never appears).
    """
    if len(parts) > MAX_PATH_PARTS:
        return f"the path has {len(parts)} components, over the most of {MAX_PATH_PARTS}: use fewer directories"
    sizes = [len(part.encode("utf-8", "surrogatepass")) for part in parts]
    length = sum(sizes) + max(0, len(parts) - 1)
    if length > MAX_PATH_BYTES:
        return f"the path is {length} bytes long, over the most of {MAX_PATH_BYTES}: use a shorter path"
    if sizes and max(sizes) > MAX_NAME_BYTES:
        return f"a name in the path is {max(sizes)} bytes long, over the most of {MAX_NAME_BYTES}: use shorter names"
    return None


def tenant_dir(root: Path, session_key: str) -> Path:
    """The directory holding every workspace of the session's tenant (the key's first component)."""
    return root / f"t-{_digest(session_key.split('/', 1)[0], 16)}"


@functools.lru_cache(maxsize=4096)
def workspace_for(root: Path, session_key: str) -> Path:
    """The session's own directory under ``root``: disjoint from every other session's, whatever the ids."""
    return tenant_dir(root, session_key) / _digest(session_key, 32)


@dataclass(frozen=True, slots=True)
class Quotas:
    """Most bytes workspaces may hold (``SWITCHBOARD_WORKSPACES__*``)."""

    session_bytes: int = 100 * 2**20
    tenant_bytes: int = 1000 * 2**20
    total_bytes: int = 10_000 * 2**20
    session_files: int = 10_000
    """Most files and directories one workspace may hold (each write measures the workspace, so its cost stays
    bounded)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a workspace held before commands wrote into it, and how much it may hold (:meth:`Workspaces.snapshot`)."""

    entries: Mapping[tuple[str, ...], tuple[int, bool]]
    """Every entry by its components: its bytes (as the quotas count them), and if it is a directory."""
    used: int
    """Bytes the workspace held."""
    most_bytes: int
    """Most bytes it may hold: the tightest of the session's, the tenant's and the total quota, given the rest."""
    most_entries: int
    """Most files and directories it may hold."""
    over: str | None
    """Why the workspace was over a quota already (its commands may then only read and delete), or ``None``."""

    def exceeded(self, used: int, entries: int) -> bool:
        """If a workspace holding ``used`` bytes in ``entries`` entries is past what it may hold.

        A workspace over a quota already may not grow past what it held.
        """
        return used > max(self.most_bytes, self.used) or entries > max(self.most_entries, len(self.entries))


def _size(count: int) -> str:
    """``count`` bytes for a message: in MiB from one MiB on (quotas are set in MiB), else in bytes."""
    if count < 2**20:
        return f"{count} bytes"
    return f"{count // 2**20} MiB" if count % 2**20 == 0 else f"{count / 2**20:.1f} MiB"


def _shown_parts(parts: Sequence[tuple[str, ...]], most: int = 5) -> str:
    names = ", ".join(repr("/".join(p)) for p in parts[:most])
    return names + (f" and {len(parts) - most} more" if len(parts) > most else "")


_ANCHOR_AFTER = 2048
"""Bytes of a path below an open directory past which the walk opens the next one (``PATH_MAX`` is 4096)."""


def _walk(path: Path) -> Iterator[tuple[tuple[str, ...], str, int, bool]]:
    """Every entry under ``path``: the components of its directory, its name, its bytes, whether it is a directory.

    Each directory is opened relative to an open ancestor, at most :data:`_ANCHOR_AFTER` bytes of path above it, so
    a tree deeper than the host's ``PATH_MAX`` is walked whole (a command can build one, one ``chdir`` at a time,
    and what a walk cannot reach is neither counted nor taken back). The walk keeps an explicit stack (``os.walk``
    recurses once per level); what cannot be read (gone meanwhile) is skipped; nothing is followed.
    """
    try:
        root = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    users = {root: 1}  # the open directories the stack opens others from, and how many entries still need each
    stack: list[tuple[int, str, tuple[str, ...]]] = [(root, ".", ())]
    try:
        while stack:
            anchor, relative, below = stack.pop()
            try:
                fd = os.open(relative, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=anchor)
            except OSError:
                fd = -1
            if fd >= 0:
                deep = len(os.fsencode(relative)) > _ANCHOR_AFTER
                try:
                    with os.scandir(fd) as scan:
                        for entry in scan:
                            try:
                                folder = entry.is_dir(follow_symlinks=False)
                                size = DIRECTORY_BYTES if folder else entry.stat(follow_symlinks=False).st_size
                            except OSError:
                                continue
                            yield below, entry.name, size, folder
                            if folder:
                                opener = fd if deep else anchor
                                users[opener] = users.get(opener, 0) + 1
                                stack.append(
                                    (opener, entry.name if deep else f"{relative}/{entry.name}", (*below, entry.name))
                                )
                finally:
                    if fd not in users:
                        os.close(fd)
            users[anchor] -= 1
            if not users[anchor]:
                del users[anchor]
                os.close(anchor)
    finally:
        for fd in users:
            os.close(fd)


def _count(path: Path) -> tuple[int, int]:
    """Bytes and entries (files, symlinks, directories) under ``path``, ``path`` itself not included.

    Each directory counts :data:`DIRECTORY_BYTES`; see :func:`_walk`.
    """
    total = entries = 0
    for _, _, size, _ in _walk(path):
        total += size
        entries += 1
    return total, entries


def _entries(path: Path) -> dict[tuple[str, ...], tuple[int, bool]]:
    """Every entry under ``path`` by its components: its bytes (as :func:`_count` counts them), and if a directory."""
    return {(*below, name): (size, folder) for below, name, size, folder in _walk(path)}


def _workspaces_usage(path: Path, depth: int) -> int:
    """Bytes of every workspace ``depth`` levels under ``path`` (1: a tenant's directory; 2: the root).

    Only what workspaces hold counts, as :meth:`Workspaces.store` adds it up: not the tenants' and workspaces'
    own directories, nor the ledger.
    """
    if depth == 0:
        return _count(path)[0]
    try:
        with os.scandir(path) as scan:
            below = [Path(e.path) for e in scan if e.name not in _NOT_TENANTS and e.is_dir(follow_symlinks=False)]
    except OSError:
        return 0
    return sum(_workspaces_usage(child, depth - 1) for child in below)


def read_total_bytes(root: Path) -> int | None:
    """Bytes held by every workspace under ``root``, from the ledger (``None`` before any write)."""
    try:
        return int((root / _LEDGER / _TOTAL).read_text() or 0)
    except (OSError, ValueError):
        return None


class Workspaces:
    """Every session workspace under one root, with its quotas."""

    def __init__(self, root: Path | None, quotas: Quotas | None = None) -> None:
        """Wire the workspaces.

        Args:
            root: Where the workspaces live; ``None`` checks the session quota only (a tool called on its own).
            quotas: The limits (default: :class:`Quotas`).
        """
        self.root = root
        self.quotas = quotas or Quotas()
        self.elsewhere: dict[Path, int] = {}
        """Bytes the tenant's *other* workspaces hold in a remote store, by resolved working directory (set by the
        store when it hydrates or persists one): its tenant quota is checked against this, not the local ledger."""

    def remove(self, workspace: Path) -> None:
        """Delete ``workspace`` and its files; the usage ledger is rebuilt by one scan at the next write."""
        with self._locked() as ledger:
            shutil.rmtree(workspace, ignore_errors=True)
            if ledger is not None:
                for stale in (ledger / workspace.parent.name, ledger / _TOTAL):
                    stale.unlink(missing_ok=True)
        self.elsewhere.pop(workspace.resolve(), None)

    def path(self, session_key: str) -> Path:
        """The session's workspace (see :func:`workspace_for`)."""
        assert self.root is not None
        return workspace_for(self.root, session_key)

    def total_bytes(self) -> int:
        """Bytes held by every workspace under the root."""
        if self.root is None:
            return 0
        found = read_total_bytes(self.root)
        return found if found is not None else _workspaces_usage(self.root, 2)

    @contextmanager
    def _locked(self) -> Iterator[Path | None]:
        if self.root is None:
            yield None
            return
        ledger = self.root / _LEDGER
        make_private_dir(ledger)
        with open(ledger / "lock", "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield ledger
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def store(self, workspace: Path, target: Path, data: bytes, *, append: bool = False, shown: str = "") -> int:
        """Write ``data`` to ``target`` (inside ``workspace``) if every quota allows it; returns the file's size.

        Replacing writes go to a temporary file renamed over the target, so an interrupted call never leaves
        half a file. The directories the write creates count against the quotas too (:data:`DIRECTORY_BYTES`
        and one entry each).

        Raises:
            ToolError: (``permanent``) a quota would be passed, or the file system refused; (``validation``) the
                path is too deep or too long (:func:`path_bound_error`). ``shown`` names the file in the message:
                a workspace-relative path, never the host's.
        """
        shown = shown or target.name
        home = workspace.resolve()
        elsewhere = self.elsewhere.get(home)
        try:
            parts = parts_below(home, target) if Path(target).is_relative_to(home) else parts_below(workspace, target)
        except UnsafePathError:
            raise ToolError(f"{shown!r} is not inside the session workspace", error_class="validation") from None
        if refused := path_bound_error(parts):
            raise ToolError(refused, error_class="validation")
        if not os.path.lexists(workspace):
            make_private_dir(workspace)
        with self._locked() as ledger:
            try:
                found = entry_stat(home, parts)
                created = missing_dirs(home, parts[:-1])
            except OSError as exc:
                raise ToolError(f"could not write {shown!r}: {exc.strerror or type(exc).__name__}") from None
            existing = found.st_size if found is not None and stat.S_ISREG(found.st_mode) else 0
            delta = len(data) - (0 if append else existing) + created * DIRECTORY_BYTES
            used, entries = _count(home)
            self._check("session", used, delta, self.quotas.session_bytes)
            added = created + (0 if found is not None else 1)
            if added and entries + added > self.quotas.session_files:
                if entries > self.quotas.session_files:
                    raise ToolError(_over_files(entries, self.quotas.session_files), error_class="permanent")
                raise ToolError(
                    f"the session workspace already holds {entries} files and directories, and this write would "
                    f"add {added} (the most is {self.quotas.session_files}): write into an existing file",
                    error_class="permanent",
                )
            if elsewhere is not None:
                self._check("tenant", elsewhere + used, delta, self.quotas.tenant_bytes)
            tenant_file, total_file, tenant, total = self._ledgers(home, ledger)
            if tenant_file is not None:
                self._check("tenant", tenant, delta, self.quotas.tenant_bytes)
                self._check("total", total, delta, self.quotas.total_bytes)
            try:
                size = write_bytes(home, parts, data, append=append)
            except OSError as exc:
                with contextlib.suppress(OSError):  # the directories made before it failed
                    delta = (created - missing_dirs(home, parts[:-1])) * DIRECTORY_BYTES
                self._account(tenant_file, tenant + delta, total_file, total + delta)
                raise ToolError(f"could not write {shown!r}: {exc.strerror or type(exc).__name__}") from None
            self._account(tenant_file, tenant + delta, total_file, total + delta)
            return size

    def _ledgers(self, home: Path, ledger: Path | None) -> tuple[Path | None, Path | None, int, int]:
        """The tenant's and the total ledger files of the workspace ``home`` and what they hold (under the lock).

        ``None`` files: the workspace is not counted in the local ledgers (no root, or its tenant's usage is in a
        remote store: :attr:`elsewhere`).
        """
        root = self.root.resolve() if self.root is not None else None
        tenant_path = home.parent
        if ledger is None or root is None or home in self.elsewhere or tenant_path.parent != root:
            return None, None, 0, 0
        tenant_file, total_file = ledger / tenant_path.name, ledger / _TOTAL
        tenant = _read_int(tenant_file, lambda: _workspaces_usage(tenant_path, 1))
        total = _read_int(total_file, lambda: _workspaces_usage(root, 2))
        return tenant_file, total_file, tenant, total

    def _over(self, home: Path, used: int, entries: int, others: tuple[int, int] | None) -> str | None:
        """Why a workspace holding ``used`` bytes in ``entries`` entries is over a quota, or ``None``.

        ``others``: what the tenant's other workspaces and all other workspaces hold (local ledgers), if counted.
        """
        quotas = self.quotas
        elsewhere = self.elsewhere.get(home)
        if used > quotas.session_bytes:
            return _OVER["session"].format(quota=_size(quotas.session_bytes), now=_size(used))
        if entries > quotas.session_files:
            return _over_files(entries, quotas.session_files)
        if elsewhere is not None and elsewhere + used > quotas.tenant_bytes:
            return _OVER["tenant"].format(quota=_size(quotas.tenant_bytes), now=_size(elsewhere + used))
        if others is not None and others[0] + used > quotas.tenant_bytes:
            return _OVER["tenant"].format(quota=_size(quotas.tenant_bytes), now=_size(others[0] + used))
        if others is not None and others[1] + used > quotas.total_bytes:
            return _OVER["total"].format(quota=_size(quotas.total_bytes), now=_size(others[1] + used))
        return None

    def snapshot(self, workspace: Path) -> Snapshot:
        """What ``workspace`` holds now and how much it may hold (blocking): give it to :meth:`settle` afterwards.

        While commands run, :meth:`Snapshot.exceeded` on :meth:`usage` tells when they wrote past the quotas.
        """
        home = workspace.resolve()
        with self._locked() as ledger:
            tenant_file, _, tenant, total = self._ledgers(home, ledger)
            found = _entries(home)
        used = sum(size for size, _ in found.values())
        most = self.quotas.session_bytes
        elsewhere = self.elsewhere.get(home)
        if elsewhere is not None:
            most = min(most, self.quotas.tenant_bytes - elsewhere)
        others = None
        if tenant_file is not None:  # the ledgers count the workspace as it is now
            others = tenant - used, total - used
            most = min(most, self.quotas.tenant_bytes - others[0], self.quotas.total_bytes - others[1])
        over = self._over(home, used, len(found), others)
        return Snapshot(found, used, max(0, most), self.quotas.session_files, over)

    @staticmethod
    def usage(workspace: Path) -> tuple[int, int]:
        """Bytes and entries ``workspace`` holds now, as the quotas count them (blocking)."""
        return _count(workspace)

    def settle(self, workspace: Path, before: Snapshot, *, stopped: bool = False) -> str | None:
        """Take back what commands wrote into ``workspace`` since ``before`` past the quotas (blocking).

        Sandboxed commands write past :meth:`store`. Afterwards the workspace is measured; while it is over the
        session's quotas (bytes, files) or the tenant's or the total (local ledger), the commands' writes are
        taken back, the largest first: entries they added are deleted, files that were there before and grew are
        cut back to their earlier size, then the directories they added (deepest first); nothing is followed.
        When the workspace was over a quota before (``before.over``), every entry added and every growth is taken
        back. The ledger learns the new usage. ``stopped``: the commands were killed for passing the quotas.
        Returns what the model is told (``None``: within every quota, nothing taken back).
        """
        home = workspace.resolve()
        with self._locked() as ledger:
            tenant_file, total_file, tenant, total = self._ledgers(home, ledger)
            found = _entries(home)
            used = sum(size for size, _ in found.values())
            others = None
            if tenant_file is not None and total_file is not None:
                # the ledgers counted the workspace as it was before, or were rebuilt just now from the disk
                others = (
                    tenant - (before.used if tenant_file.exists() else used),
                    total - (before.used if total_file.exists() else used),
                )

            def over() -> bool:
                return self._over(home, used, len(found), others) is not None

            def bytes_over() -> bool:
                return self._over(home, used, 0, others) is not None

            kept = before.entries
            added = {p for p in found if p not in kept or kept[p][1] != found[p][1]}
            grown = [p for p in found if p not in added and not found[p][1] and found[p][0] > kept[p][0]]
            # the largest first: a new file by its size, a grown one by its growth; then new directories, deepest first
            files = sorted(
                [(found[p][0], p, True) for p in added if not found[p][1]]
                + [(found[p][0] - kept[p][0], p, False) for p in grown],
                key=lambda item: -item[0],
            )
            folders = sorted((p for p in added if found[p][1]), key=len, reverse=True)
            everything = before.over is not None
            removed: list[tuple[str, ...]] = []
            cut: list[tuple[str, ...]] = []
            for _, parts, new in files:
                if not everything and not (over() if new else bytes_over()):
                    continue
                with contextlib.suppress(OSError):
                    if new:
                        remove_entry(home, parts)
                        used -= found.pop(parts)[0]
                        removed.append(parts)
                    else:
                        try:
                            truncate_entry(home, parts, kept[parts][0])
                        except UnsafePathError:  # a link, a special file, a hard link: the name goes instead
                            remove_entry(home, parts)
                            used -= found.pop(parts)[0]
                            removed.append(parts)
                            continue
                        used -= found[parts][0] - kept[parts][0]
                        found[parts] = (kept[parts][0], False)
                        cut.append(parts)
            for parts in folders:
                if not everything and not over():
                    break
                with contextlib.suppress(OSError):
                    remove_entry(home, parts)
                    used -= found.pop(parts)[0]
                    removed.append(parts)
            if others is not None:
                self._account(tenant_file, others[0] + used, total_file, others[1] + used)
            still = self._over(home, used, len(found), others)
        return _settled(before, still, removed, cut, stopped=stopped)

    @staticmethod
    def _account(tenant_file: Path | None, tenant: int, total_file: Path | None, total: int) -> None:
        if tenant_file is not None and total_file is not None:
            _write_int(tenant_file, tenant)
            _write_int(total_file, total)

    @staticmethod
    def _check(what: str, now: int, delta: int, quota: int) -> None:
        """Refuse a write of ``delta`` bytes where ``now`` are held of ``quota`` (``what``: a key of :data:`_OVER`)."""
        if now + delta <= quota:
            return
        if now > quota:
            raise ToolError(
                f"{_OVER[what].format(quota=_size(quota), now=_size(now))}: {_REFUSED}", error_class="permanent"
            )
        raise ToolError(
            f"{_HOLDERS[what]} would hold {now + delta} bytes, over the {quota}-byte quota: write less, or replace "
            "files",
            error_class="permanent",
        )


_OVER = {
    "session": "the session workspace is over its {quota} quota (it holds {now})",
    "tenant": "this tenant's workspaces are over their {quota} quota (they hold {now})",
    "total": "the workspaces of this host are over their {quota} quota (they hold {now})",
}
"""Why a workspace is over a byte quota, by quota."""
_HOLDERS = {"session": "the session workspace", "tenant": "this tenant's workspaces", "total": "all workspaces"}
_REFUSED = (
    "writing is refused until you delete files (with rm in shell, which can still read and delete); reading works"
)


def _over_files(entries: int, most: int) -> str:
    return f"the session workspace is over its limit of {most} files and directories (it holds {entries}): {_REFUSED}"


def _settled(
    before: Snapshot,
    still: str | None,
    removed: list[tuple[str, ...]],
    cut: list[tuple[str, ...]],
    *,
    stopped: bool,
) -> str | None:
    """What the model is told after :meth:`Workspaces.settle` (``None``: nothing to say)."""
    taken = []
    if removed:
        taken.append(
            f"removed {len(removed)} new {_plural(len(removed), 'entry', 'entries')} ({_shown_parts(removed)})"
        )
    if cut:
        taken.append(
            f"cut {len(cut)} grown {_plural(len(cut), 'file', 'files')} back to the size "
            f"{_plural(len(cut), 'it', 'they')} had ({_shown_parts(cut)})"
        )
    back = f"; this call's writes were taken back: {' and '.join(taken)}" if taken else ""
    if before.over is not None:
        now = (
            f"; it is still over a quota: {_REFUSED}" if still else "; it is now within its quotas: writing works again"
        )
        return f"{before.over} when this call started, so its commands could only read and delete files{back}{now}"
    if not (taken or stopped or still):
        return None
    return (
        ("the commands were stopped: they wrote" if stopped else "the commands wrote")
        + f" past the workspace's quota ({_size(before.most_bytes)}, {before.most_entries} files and directories)"
        + back
        + (f"; {still}: {_REFUSED}" if still else ". Write less, or delete files to make room")
    )


def _plural(count: int, one: str, many: str) -> str:
    return one if count == 1 else many


def _read_int(path: Path, rebuild: Callable[[], int]) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return rebuild()


def _write_int(path: Path, value: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(max(0, value)))
    tmp.replace(path)
