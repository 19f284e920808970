"""Session workspaces on disk: where each one lives, and the quotas every write is checked against.

A session's workspace is ``<root>/<tenant digest>/<session digest>``: both parts are SHA-256 digests (of the
tenant and of the full session key), so no session's directory can lie inside another's, whatever the ids
(a Telegram forum topic's key extends its chat's key; their directories are still siblings).

Every write a tool makes (``write_file``, the gateway's result files) goes through :meth:`Workspaces.store`,
which checks three quotas: the session's, the tenant's (all its sessions) and the total of every workspace
under the root. The session's usage is measured on its directory; tenant and total usage are running totals
kept in small ledger files under ``<root>/.usage`` (rebuilt by one scan when missing), updated under a file
lock so that every worker process on the host shares them. The write itself never follows a symlink below the
workspace (:mod:`switchboard.core.safepaths`): a command may have left one anywhere. When the workspaces are kept in
an object store, the local directories are working copies: the store tells :attr:`Workspaces.elsewhere` what the
tenant's other workspaces hold there, and the tenant quota is checked against that instead of the local ledger.

Directories count too: each directory inside a workspace is one entry against the session's file quota and
:data:`DIRECTORY_BYTES` (one file-system block) against every byte quota, so a chain of empty directories costs
what it takes on disk. Paths are bounded (:func:`path_bound_error`: at most :data:`MAX_PATH_PARTS` components,
:data:`MAX_PATH_BYTES` bytes, :data:`MAX_NAME_BYTES` per name), and usage is measured by walks that keep their own
stack, so no tree on disk, however deep, can make a write fail with ``RecursionError``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from switchboard.core.safepaths import (
    UnsafePathError,
    entry_stat,
    missing_dirs,
    parts_below,
    remove_entry,
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
    :class:`~switchboard.core.safepaths.UnsafePathError` and changes nothing through it.
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


def _count(path: Path) -> tuple[int, int]:
    """Bytes and entries (files, symlinks, directories) under ``path``, ``path`` itself not included.

    Each directory counts :data:`DIRECTORY_BYTES`. The walk keeps an explicit stack (``os.walk`` recurses once
    per level, and fails on a deep enough tree); what cannot be read (gone meanwhile, too long a path for the
    host) is skipped.
    """
    total = entries = 0
    stack = [os.fspath(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as scan:
                for entry in scan:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                            total += DIRECTORY_BYTES
                        else:
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
                    entries += 1
        except OSError:
            continue
    return total, entries


def _entries(path: Path) -> dict[tuple[str, ...], tuple[int, bool]]:
    """Every entry under ``path`` by its components: its bytes (as :func:`_count` counts them), and if a directory."""
    found: dict[tuple[str, ...], tuple[int, bool]] = {}
    stack: list[tuple[str, ...]] = [()]
    while stack:
        below = stack.pop()
        try:
            with os.scandir(os.path.join(path, *below)) as scan:
                for entry in scan:
                    parts = (*below, entry.name)
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(parts)
                            found[parts] = (DIRECTORY_BYTES, True)
                        else:
                            found[parts] = (entry.stat(follow_symlinks=False).st_size, False)
                    except OSError:
                        continue
        except OSError:
            continue
    return found


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
        root = self.root.resolve() if self.root is not None else None
        home = workspace.resolve()
        tenant_path = home.parent
        elsewhere = self.elsewhere.get(home)
        shared = elsewhere is None and root is not None and tenant_path.parent == root
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
            self._check("the session workspace", used + delta, self.quotas.session_bytes)
            added = created + (0 if found is not None else 1)
            if added and entries + added > self.quotas.session_files:
                raise ToolError(
                    f"the session workspace already holds {entries} files and directories, and this write would "
                    f"add {added} (the most is {self.quotas.session_files}): write into an existing file",
                    error_class="permanent",
                )
            if elsewhere is not None:
                self._check("this tenant's workspaces", elsewhere + used + delta, self.quotas.tenant_bytes)
            tenant_file = total_file = None
            tenant = total = 0
            if shared and ledger is not None and root is not None:
                tenant_file, total_file = ledger / tenant_path.name, ledger / _TOTAL
                tenant = _read_int(tenant_file, lambda: _workspaces_usage(tenant_path, 1))
                total = _read_int(total_file, lambda: _workspaces_usage(root, 2))
                self._check("this tenant's workspaces", tenant + delta, self.quotas.tenant_bytes)
                self._check("all workspaces", total + delta, self.quotas.total_bytes)
            try:
                size = write_bytes(home, parts, data, append=append)
            except OSError as exc:
                with contextlib.suppress(OSError):  # the directories made before it failed
                    delta = (created - missing_dirs(home, parts[:-1])) * DIRECTORY_BYTES
                self._account(tenant_file, tenant + delta, total_file, total + delta)
                raise ToolError(f"could not write {shown!r}: {exc.strerror or type(exc).__name__}") from None
            self._account(tenant_file, tenant + delta, total_file, total + delta)
            return size

    def snapshot(self, workspace: Path) -> frozenset[tuple[str, ...]]:
        """What ``workspace`` holds now (blocking): give it to :meth:`settle` after commands wrote there."""
        return frozenset(_entries(workspace))

    def settle(self, workspace: Path, before: frozenset[tuple[str, ...]]) -> str | None:
        """Check what commands wrote into ``workspace`` since ``before`` against the quotas (blocking).

        Sandboxed commands write past :meth:`store`. Afterwards the workspace is measured: while it is over the
        session's quotas (bytes, files) or the tenant's or the total (local ledger), the entries the commands
        *added* are deleted, largest first, then their empty directories (deepest first); nothing is followed.
        Files that existed before are never touched: if growing them passed a quota, every later write is
        refused by :meth:`store` until files are removed. The ledger learns the new usage. Returns what the
        model is told (``None``: within every quota).
        """
        home = workspace.resolve()
        root = self.root.resolve() if self.root is not None else None
        tenant_path = home.parent
        elsewhere = self.elsewhere.get(home)
        shared = elsewhere is None and root is not None and tenant_path.parent == root
        with self._locked() as ledger:
            tenant_file = total_file = None
            tenant = total = 0
            if shared and ledger is not None and root is not None:
                tenant_file, total_file = ledger / tenant_path.name, ledger / _TOTAL
                tenant = _read_int(tenant_file, lambda: _workspaces_usage(tenant_path, 1))
                total = _read_int(total_file, lambda: _workspaces_usage(root, 2))
            found = _entries(home)
            used_before = sum(size for parts, (size, _) in found.items() if parts in before)
            used = sum(size for size, _ in found.values())
            if tenant_file is not None:  # the ledgers counted the workspace as it was before (or were rebuilt now)
                tenant, total = tenant - used_before, total - used_before

            def over() -> bool:
                return (
                    used > self.quotas.session_bytes
                    or len(found) > self.quotas.session_files
                    or (elsewhere is not None and elsewhere + used > self.quotas.tenant_bytes)
                    or (tenant_file is not None and tenant + used > self.quotas.tenant_bytes)
                    or (tenant_file is not None and total + used > self.quotas.total_bytes)
                )

            removed = 0
            added = sorted(  # files, largest first; then directories, deepest first (emptied by then)
                (p for p in found if p not in before),
                key=lambda p: (found[p][1], -len(p) if found[p][1] else -found[p][0]),
            )
            for parts in added:
                if not over():
                    break
                with contextlib.suppress(OSError):
                    remove_entry(home, parts)
                    used -= found.pop(parts)[0]
                    removed += 1
            self._account(tenant_file, tenant + used, total_file, total + used)
            if not removed and not over():
                return None
            return (
                f"the commands wrote past the workspace quotas (session: {self.quotas.session_bytes} bytes, "
                f"{self.quotas.session_files} files and directories): {removed} of the entries they made were "
                "deleted"
                + ("; the workspace is still over a quota: delete files before writing more" if over() else "")
                + ". Write less, or replace files"
            )

    @staticmethod
    def _account(tenant_file: Path | None, tenant: int, total_file: Path | None, total: int) -> None:
        if tenant_file is not None and total_file is not None:
            _write_int(tenant_file, tenant)
            _write_int(total_file, total)

    @staticmethod
    def _check(what: str, after: int, quota: int) -> None:
        if after > quota:
            raise ToolError(
                f"{what} would hold {after} bytes, over the {quota}-byte quota: write less, or replace files",
                error_class="permanent",
            )


def _read_int(path: Path, rebuild: Callable[[], int]) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return rebuild()


def _write_int(path: Path, value: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(max(0, value)))
    tmp.replace(path)
