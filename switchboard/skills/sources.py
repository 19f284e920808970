"""Reading a skill package from a folder or a zip file, safely, into memory before anything is installed.

Both sources pass the same gates (:func:`read_source`), so a hostile package is refused with nothing written; a zip's
sizes are checked as declared and again as inflated, since a zip bomb may lie. Editor and tool litter
(``__MACOSX/``, ``.DS_Store``, ``__pycache__/``, ``.git/``) is skipped.
"""

from __future__ import annotations

import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path

from switchboard.skills.package import SKILL_FILE, SkillError

__all__ = [
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "MAX_FILE_BYTES",
    "MAX_TOTAL_BYTES",
    "PackageFiles",
    "read_folder",
    "read_source",
    "read_zip",
]

MAX_ENTRIES = 1000
MAX_FILE_BYTES = 10 * 2**20
MAX_TOTAL_BYTES = 25 * 2**20
MAX_DEPTH = 8
_SKIPPED = frozenset({"__MACOSX", ".DS_Store", "__pycache__", ".git"})


@dataclass(frozen=True, slots=True)
class PackageFiles:
    """A package's files in memory, by relative POSIX path, and the name of the folder that held them."""

    files: dict[str, bytes]
    folder: str | None
    """The package's folder (``None``: a zip with ``SKILL.md`` at its root)."""


def _checked(path: str) -> tuple[str, ...] | None:
    """The path's parts if it is a safe relative path; ``None`` for litter to skip.

    Raises:
        SkillError: absolute, escaping, or otherwise unsafe.
    """
    if "\\" in path or "\0" in path or path.startswith("/") or (len(path) > 1 and path[1] == ":"):
        raise SkillError(f"unsafe path {path!r} in the package: paths must be relative, with '/' separators")
    parts = tuple(p for p in path.split("/") if p)
    if not parts or any(p in {".", ".."} for p in parts):
        raise SkillError(f"unsafe path {path!r} in the package: '.' and '..' are not allowed")
    if len(parts) > MAX_DEPTH or any(len(p.encode()) > 255 for p in parts):
        raise SkillError(f"path {path!r} in the package is too deep or too long (at most {MAX_DEPTH} levels)")
    return None if any(p in _SKIPPED for p in parts) else parts


class _Budget:
    def __init__(self) -> None:
        self.entries = 0
        self.bytes = 0

    def entry(self) -> None:
        self.entries += 1
        if self.entries > MAX_ENTRIES:
            raise SkillError(f"the package holds more than {MAX_ENTRIES} files and folders")

    def take(self, path: str, size: int) -> None:
        if size > MAX_FILE_BYTES:
            raise SkillError(f"{path!r} is larger than {MAX_FILE_BYTES} bytes (the per-file cap)")
        self.bytes += size
        if self.bytes > MAX_TOTAL_BYTES:
            raise SkillError(f"the package is larger than {MAX_TOTAL_BYTES} bytes uncompressed")


def read_folder(root: Path) -> PackageFiles:
    """Read a package folder; symbolic links and special files are refused.

    Raises:
        SkillError: not a folder, unsafe, or over a cap.
    """
    if root.is_symlink() or not root.is_dir():
        raise SkillError(f"{root} is not a folder (give a skill folder or a .zip file)")
    budget, files = _Budget(), {}
    for current, dirs, names in os.walk(root, followlinks=False):
        base = Path(current)
        for name in [*dirs, *names]:
            budget.entry()
            path = base / name
            relative = path.relative_to(root).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise SkillError(f"{relative!r} is a symbolic link: a skill package may not hold links")
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise SkillError(f"{relative!r} is not a regular file")
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED)
        for name in sorted(names):
            path = base / name
            relative = path.relative_to(root).as_posix()
            if _checked(relative) is None:
                continue
            try:  # O_NOFOLLOW: a link swapped in after the walk is refused; bounded, whatever the size says
                with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as handle:
                    data = handle.read(MAX_FILE_BYTES + 1)
            except OSError as err:
                raise SkillError(f"{relative!r} could not be read ({err.strerror or type(err).__name__})") from None
            budget.take(relative, len(data))
            files[relative] = data
    return PackageFiles(files, root.name)


def _zip_kind(info: zipfile.ZipInfo) -> int:
    return (info.external_attr >> 16) & 0o170000


def read_zip(path: Path) -> PackageFiles:
    """Read a zipped package (one top folder, or ``SKILL.md`` at the root); see the module docstring for the gates.

    Raises:
        SkillError: not a zip, unsafe, or over a cap.
    """
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        raise SkillError(f"{path.name} is not a readable zip file ({err})") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_ENTRIES:
            raise SkillError(f"the package holds more than {MAX_ENTRIES} files and folders")
        budget, found = _Budget(), {}
        for info in infos:
            budget.entry()
            kind = _zip_kind(info)
            if kind == stat.S_IFLNK:
                raise SkillError(f"{info.filename!r} is a symbolic link: a skill package may not hold links")
            parts = _checked(info.filename)
            if info.is_dir() or parts is None:
                continue
            if kind not in (0, stat.S_IFREG):
                raise SkillError(f"{info.filename!r} is not a regular file")
            if info.flag_bits & 0x1:
                raise SkillError(f"{info.filename!r} is encrypted")
            relative = "/".join(parts)
            if relative in found:
                raise SkillError(f"{relative!r} appears twice in the zip")
            budget.take(relative, info.file_size)  # declared sizes first: refuse before inflating anything
            found[relative] = info
        budget = _Budget()
        files: dict[str, bytes] = {}
        for relative, info in found.items():
            try:
                with archive.open(info) as handle:
                    data = handle.read(MAX_FILE_BYTES + 1)
            except (zipfile.BadZipFile, OSError, NotImplementedError, EOFError) as err:
                raise SkillError(f"{relative!r} could not be read from the zip ({err})") from None
            budget.take(relative, len(data))  # the bytes actually inflated, whatever the header said
            files[relative] = data
    return _rooted(files, path)


def _rooted(files: dict[str, bytes], path: Path) -> PackageFiles:
    """The package inside the zip: ``SKILL.md`` at the root, or one top folder holding it."""
    if SKILL_FILE in files:
        return PackageFiles(files, None)
    tops = {name.split("/", 1)[0] for name in files}
    if len(tops) == 1 and "/" in next(iter(files), ""):
        top = tops.pop()
        return PackageFiles({name.split("/", 1)[1]: data for name, data in files.items()}, top)
    raise SkillError(f"{path.name}: no {SKILL_FILE} at the zip's root or in a single top folder")


def read_source(source: Path) -> PackageFiles:
    """Read a package from a folder or a ``.zip`` file.

    - every path is relative and plain: no absolute path, drive letter, backslash, ``.``/``..`` part or NUL, at
      most :data:`MAX_DEPTH` deep;
    - no symbolic links and no special files (devices, FIFOs), in a folder or in a zip's recorded file modes;
    - no encrypted zip entries, no duplicate names;
    - at most :data:`MAX_ENTRIES` entries, :data:`MAX_FILE_BYTES` per file and :data:`MAX_TOTAL_BYTES` in all;
      a zip's declared sizes are checked first, then the bytes actually inflated (a zip bomb may lie about them).

    Raises:
        SkillError: missing, unsafe, or over a cap.
    """
    if not source.exists() and not source.is_symlink():
        raise SkillError(f"{source} does not exist")
    if source.is_dir() and not source.is_symlink():
        return read_folder(source)
    if zipfile.is_zipfile(source):
        return read_zip(source)
    raise SkillError(f"{source} is neither a skill folder nor a zip file")
