"""Working copies of remote workspaces: what a worker last synced, what changed since, and safe local writes.

For each copy the worker keeps a manifest (outside every workspace, so nothing a turn runs can edit it) of what it last
synced; compared with the store's listing it says what to download, with the disk what to upload. Only regular files
are synced, and a key becomes a file only if it is a plain relative path (:func:`remote_name`), written where no
symlink leads out.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from switchboard.core.tools.builtin.files import check_relative_path
from switchboard.core.workspaces.disk import SYNC_DIR, make_private_dir, tenant_dir, workspace_for
from switchboard.core.workspaces.safepaths import entry_stat, remove_tree, write_bytes
from switchboard.errors import ToolError

__all__ = [
    "MAX_KEY_BYTES",
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


MAX_KEY_BYTES = 1024
"""The longest key an S3-compatible store holds, in UTF-8 bytes (the session's prefix included)."""


def remote_name(name: str, prefix: str = "") -> str | None:
    """``name`` if a key's part below the session prefix is a plain relative path, else ``None`` (skipped).

    A name with a control character, or one whose key (``prefix`` + ``name``) passes :data:`MAX_KEY_BYTES`, is
    one the store may refuse: it is skipped too, never sent.
    """
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return None
    try:
        if len((prefix + name).encode("utf-8")) > MAX_KEY_BYTES:
            return None
        return name if check_relative_path(name) == name else None
    except (ValueError, UnicodeEncodeError):
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
    """Remove ``names`` (files, symlinks, directories and the like, never followed) from the working copy."""
    for name in names:
        with contextlib.suppress(OSError):
            remove_tree(workspace, tuple(name.split("/")))


def write_copy(workspace: Path, name: str, data: bytes) -> LocalFile:
    """Write a file downloaded from the store into the working copy; returns what the disk then holds.

    Whatever stands in the way is replaced, never followed: a file or symlink where a directory goes, a directory
    where the file goes (:mod:`switchboard.core.workspaces.safepaths`).

    Raises:
        ToolError: (``validation``) the name is not a plain relative path.
        OSError: the disk refused.
    """
    try:
        parts = tuple(check_relative_path(name).split("/"))
    except ValueError as exc:
        raise ToolError(str(exc), error_class="validation") from None
    home = make_private_dir(workspace)
    for depth in range(1, len(parts)):
        found = entry_stat(home, parts[:depth])
        if found is None:
            break
        if not stat.S_ISDIR(found.st_mode):  # a file (or a link) standing where a directory goes is replaced
            remove_tree(home, parts[:depth])
            break
    found = entry_stat(home, parts)
    if found is not None and stat.S_ISDIR(found.st_mode):
        remove_tree(home, parts)
    write_bytes(home, parts, data)
    written = entry_stat(home, parts)
    if written is None:
        raise FileNotFoundError(name)
    return LocalFile(written.st_size, written.st_mtime_ns)
