"""Session workspaces on disk: where each one lives, and the quotas every write is checked against.

A session's workspace is ``<root>/<tenant digest>/<session digest>``: both parts are SHA-256 digests (of the
tenant and of the full session key), so no session's directory can lie inside another's, whatever the ids
(a Telegram forum topic's key extends its chat's key; their directories are still siblings).

Every write a tool makes (``write_file``, the gateway's result files) goes through :meth:`Workspaces.store`,
which checks three quotas: the session's, the tenant's (all its sessions) and the total of every workspace
under the root. The session's usage is measured on its directory; tenant and total usage are running totals
kept in small ledger files under ``<root>/.usage`` (rebuilt by one scan when missing), updated under a file
lock so that every worker process on the host shares them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from switchboard.errors import ToolError

__all__ = ["Quotas", "Workspaces", "make_private_dir", "read_total_bytes", "tenant_dir", "workspace_for"]

_LEDGER = ".usage"
_TOTAL = "total"
_TEMP_PREFIX = ".write-"


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def make_private_dir(path: Path) -> Path:
    """Create ``path`` and any missing parents as ``0700``; an existing ``path`` is tightened to ``0700``.

    Workspaces and the data directory hold conversation text: readable by their owner only, whatever the umask.
    """
    path = Path(path)
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for part in reversed(missing):
        with contextlib.suppress(FileExistsError):
            part.mkdir(mode=0o700)
        part.chmod(0o700)
    path.chmod(0o700)
    return path


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
    """Most files one workspace may hold (each write measures the workspace, so its cost stays bounded)."""


def _usage(path: Path) -> int:
    return _count(path)[0]


def _count(path: Path) -> tuple[int, int]:
    """Bytes and files under ``path``."""
    total = files_seen = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            files_seen += 1
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total, files_seen


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

    def path(self, session_key: str) -> Path:
        """The session's workspace (see :func:`workspace_for`)."""
        assert self.root is not None
        return workspace_for(self.root, session_key)

    def total_bytes(self) -> int:
        """Bytes held by every workspace under the root."""
        if self.root is None:
            return 0
        found = read_total_bytes(self.root)
        return found if found is not None else _usage(self.root) - _usage(self.root / _LEDGER)

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
        half a file.

        Raises:
            ToolError: (``permanent``) a quota would be passed, or the file system refused (``shown`` names the
                file in the message: a workspace-relative path, never the host's).
        """
        shown = shown or target.name
        root = self.root.resolve() if self.root is not None else None
        tenant_path = workspace.resolve().parent
        shared = root is not None and tenant_path.parent == root
        with self._locked() as ledger:
            try:
                existing = target.stat().st_size if target.is_file() else 0
            except OSError as exc:
                raise ToolError(f"could not write {shown!r}: {exc.strerror or type(exc).__name__}") from None
            delta = len(data) - (0 if append else existing)
            used, files = _count(workspace)
            self._check("the session workspace", used + delta, self.quotas.session_bytes)
            if not target.exists() and files >= self.quotas.session_files:
                raise ToolError(
                    f"the session workspace already holds {files} files, its most: write into an existing file",
                    error_class="permanent",
                )
            tenant_file = total_file = None
            tenant = total = 0
            if shared and ledger is not None and root is not None:
                tenant_file, total_file = ledger / tenant_path.name, ledger / _TOTAL
                tenant = _read_int(tenant_file, lambda: _usage(tenant_path))
                total = _read_int(total_file, lambda: _usage(root) - _usage(ledger))
                self._check("this tenant's workspaces", tenant + delta, self.quotas.tenant_bytes)
                self._check("all workspaces", total + delta, self.quotas.total_bytes)
            try:
                size = _write(target, data, append=append)
            except OSError as exc:
                raise ToolError(f"could not write {shown!r}: {exc.strerror or type(exc).__name__}") from None
            if tenant_file is not None and total_file is not None:
                _write_int(tenant_file, tenant + delta)
                _write_int(total_file, total + delta)
            return size

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


def _write(target: Path, data: bytes, *, append: bool) -> int:
    make_private_dir(target.parent)
    if append:
        with target.open("ab") as handle:
            handle.write(data)
    else:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=_TEMP_PREFIX)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return target.stat().st_size
