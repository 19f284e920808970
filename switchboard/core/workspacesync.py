"""Working copies of remote workspaces: what a worker last synced, what changed since, and safe local writes.

A remote store (:mod:`switchboard.s3workspaces`) keeps each session's files under a key prefix; a worker works on
a local copy. For each copy it remembers what it last synced (a small manifest under ``<root>/.sync``, outside
every workspace, so nothing a turn runs can edit it): per file its entity tag in the store, its size and its
modification time as written. Comparing the manifest with the store's listing says what to download; comparing
it with the disk says what to upload. Only regular files are synced: symlinks, sockets and the like never leave
the worker, and a key from the store becomes a file only if it is a plain relative path
(:func:`remote_name`), written where no symlink leads out of the workspace.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from switchboard.core.toolbox.files import check_relative_path, resolve_in_workspace
from switchboard.core.workspaces import SYNC_DIR, make_private_dir, tenant_dir, workspace_for

__all__ = [
    "LocalFile",
    "Synced",
    "load_manifest",
    "manifest_path",
    "prune",
    "remote_name",
    "save_manifest",
    "scan",
    "write_copy",
]

_TEMP_PREFIX = ".write-"


@dataclass(frozen=True, slots=True)
class LocalFile:
    """A regular file of a working copy, as the disk has it."""

    size: int
    mtime_ns: int


@dataclass(frozen=True, slots=True)
class Synced:
    """A file as the worker last synced it: the store's entity tag, and the disk's size and time right after."""

    etag: str
    size: int
    mtime_ns: int

    def matches(self, local: LocalFile | None) -> bool:
        """Whether the disk still holds what was synced."""
        return local is not None and (local.size, local.mtime_ns) == (self.size, self.mtime_ns)


def manifest_path(root: Path, session_key: str) -> Path:
    """Where the worker records what it last synced of the session's workspace (outside every workspace)."""
    return root / SYNC_DIR / tenant_dir(root, session_key).name / f"{workspace_for(root, session_key).name}.json"


def load_manifest(path: Path) -> dict[str, Synced]:
    """The manifest at ``path`` (empty when missing or unreadable: everything is then downloaded again)."""
    try:
        raw = json.loads(path.read_bytes())
        return {name: Synced(str(e[0]), int(e[1]), int(e[2])) for name, e in raw.items()}
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return {}


def save_manifest(path: Path, manifest: dict[str, Synced]) -> None:
    """Replace the manifest at ``path`` atomically."""
    make_private_dir(path.parent)
    body = json.dumps({name: [s.etag, s.size, s.mtime_ns] for name, s in sorted(manifest.items())})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(body)
    tmp.replace(path)


def remote_name(name: str) -> str | None:
    """``name`` if a key's part below the session prefix is a plain relative path, else ``None`` (skipped)."""
    try:
        return name if check_relative_path(name) == name else None
    except ValueError:
        return None


def scan(workspace: Path) -> tuple[dict[str, LocalFile], list[str]]:
    """The working copy's regular files by relative POSIX name, and every other entry that is not a directory.

    The walk keeps its own stack and never follows symlinks; a half-written temporary file is left out.
    """
    files: dict[str, LocalFile] = {}
    others: list[str] = []
    stack = [workspace]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    name = Path(entry.path).relative_to(workspace).as_posix()
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
                        elif entry.is_file(follow_symlinks=False):
                            if not entry.name.startswith(_TEMP_PREFIX):
                                st = entry.stat(follow_symlinks=False)
                                files[name] = LocalFile(st.st_size, st.st_mtime_ns)
                        else:
                            others.append(name)
                    except OSError:
                        continue
        except OSError:
            continue
    return files, others


def prune(workspace: Path, names: list[str]) -> None:
    """Remove ``names`` (files, symlinks and the like, never followed) from the working copy."""
    for name in names:
        try:
            (workspace / name).unlink()
        except FileNotFoundError:
            continue
        except IsADirectoryError:
            shutil.rmtree(workspace / name, ignore_errors=True)


def write_copy(workspace: Path, name: str, data: bytes) -> LocalFile:
    """Write a file downloaded from the store into the working copy; returns what the disk then holds.

    A directory standing where the file goes is replaced; no symlink may lead the write out of the workspace.

    Raises:
        ToolError: (``validation``) the name leads out of the workspace.
        OSError: the disk refused.
    """
    target = resolve_in_workspace(workspace, name)
    if target.is_dir():
        shutil.rmtree(target)
    parent = target.parent
    for below in reversed([parent, *parent.parents]):  # a file standing where a directory goes is replaced
        if below.is_relative_to(workspace.resolve()) and below.is_file():
            below.unlink()
    make_private_dir(parent)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=_TEMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    st = target.stat()
    return LocalFile(st.st_size, st.st_mtime_ns)
