"""Where session workspaces are kept: the :class:`WorkspaceStore` interface, and the local-directory store.

A workspace belongs to the session, not to a worker: turns work on a local directory that the store hydrates before
the turn and persists after it (and at safe points within it), checking the quotas on the store, so any worker can
take the next turn. :class:`LocalWorkspaces` is the default: the working directory *is* the store, so nothing is
copied. The S3 backend lives in :mod:`switchboard.core.workspaces.s3`: it needs a network client.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from switchboard.core.tools.builtin.files import resolve_in_workspace
from switchboard.core.workspaces.disk import Workspaces, tenant_dir, workspace_for
from switchboard.core.workspaces.safepaths import UnsafePathError, read_inside
from switchboard.errors import ToolError

__all__ = ["MAX_READ_BYTES", "LocalWorkspaces", "WorkspaceStore", "in_workspace", "persist_quietly"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

MAX_READ_BYTES = 2 * 2**30
"""The most :meth:`WorkspaceStore.read` returns by default (one byte more means "too large")."""


@runtime_checkable
class WorkspaceStore(Protocol):
    """Keeps every session's workspace between turns, whichever worker runs them."""

    root: Path
    """The local working directories live under it (see :func:`~switchboard.core.workspaces.disk.workspace_for`)."""

    def path(self, session_key: str) -> Path:
        """The session's local working directory."""

    async def hydrate(self, session_key: str) -> Path:
        """Bring the session's working directory up to date with the store; returns it.

        Raises:
            OSError: the store could not be reached, or the local disk refused (the turn fails and is retried).
        """

    async def persist(self, session_key: str) -> None:
        """Save what changed in the working directory since the last hydrate or persist.

        Raises:
            ToolError: (``permanent``) a quota would be passed: nothing was stored, and the working directory is
                back as the store has it.
            OSError: the store could not be reached.
        """

    async def read(self, session_key: str, path: str, limit: int = MAX_READ_BYTES) -> bytes:
        """Up to ``limit + 1`` bytes of ``path`` (relative to the workspace), from the store.

        Raises:
            ToolError: (``validation``) the path is absolute, leaves the workspace or goes through a symlink.
            FileNotFoundError: no such file.
            OSError: the store could not be reached.
        """

    async def delete(self, session_key: str) -> None:
        """Remove the session's files from the store and from this worker's disk."""

    async def delete_tenant(self, tenant: str) -> int:
        """Remove every workspace of ``tenant`` from the store and this worker's disk; objects (or directories) gone."""

    async def aclose(self) -> None:
        """Release connections (the store is not used afterwards)."""


def _read(workspace: Path, path: Path, limit: int) -> bytes:
    try:
        return read_inside(workspace, path, limit=limit + 1)  # never through a link, never blocked on a FIFO
    except UnsafePathError:
        raise ToolError("the path goes through a symlink or names no regular file", error_class="validation") from None


class LocalWorkspaces:
    """Workspaces in a local directory (or a shared volume): the working directory is the store itself."""

    def __init__(self, root: Path, workspaces: Workspaces | None = None) -> None:
        """Keep workspaces under ``root``.

        Args:
            root: Where the workspaces live: ``<data dir>/workspaces`` by default, or a shared volume mounted at
                the same path on every host (``SWITCHBOARD_WORKSPACES__ROOT``).
            workspaces: The quotas' bookkeeping under ``root`` (its usage ledger is corrected on delete).
        """
        self.root = root
        self.workspaces = workspaces or Workspaces(root)

    def path(self, session_key: str) -> Path:
        """The session's directory (see :func:`~switchboard.core.workspaces.disk.workspace_for`)."""
        return workspace_for(self.root, session_key)

    async def hydrate(self, session_key: str) -> Path:
        """Nothing to copy: the directory is the store (it is created by the first write)."""
        return self.path(session_key)

    async def persist(self, session_key: str) -> None:
        """Nothing to copy: every write already went through the quotas into the store."""

    async def read(self, session_key: str, path: str, limit: int = MAX_READ_BYTES) -> bytes:
        """Read ``path`` from the session's directory (symlinks may not lead out of it)."""
        target = resolve_in_workspace(self.path(session_key), path, create=False)
        return await asyncio.to_thread(_read, self.path(session_key), target, limit)

    async def delete(self, session_key: str) -> None:
        """Remove the session's directory; the usage ledger is rebuilt by the next write."""
        await asyncio.to_thread(self.workspaces.remove, self.path(session_key))

    async def delete_tenant(self, tenant: str) -> int:
        """Remove the tenant's directory (every workspace of it, and its usage ledger); 1 if there was one."""
        home = tenant_dir(self.root, f"{tenant}/-")
        if not home.exists():
            return 0
        await asyncio.to_thread(shutil.rmtree, home, ignore_errors=True)
        return 1

    async def aclose(self) -> None:
        """Nothing to release."""


async def persist_quietly(store: WorkspaceStore, session_key: str) -> None:
    """Persist the session's workspace; a refusal over a quota is logged (it kept nothing, and the copy is reset).

    Raises:
        OSError: the store could not be reached (a turn that ends so fails, and is retried).
    """
    try:
        await store.persist(session_key)
    except ToolError as refused:
        logger.warning("a session workspace was not saved: %s", refused)


async def in_workspace(store: WorkspaceStore, session_key: str, turn: Callable[[], Awaitable[_T]]) -> _T:
    """Run ``turn`` over the session's workspace: hydrated before, persisted after (not when it raised).

    A turn cancelled because its worker lost the session's lease persists nothing: the worker that took the session
    over owns its files from then on.
    """
    await store.hydrate(session_key)  # the session's files, whichever worker wrote them
    result = await turn()
    await persist_quietly(store, session_key)
    return result
