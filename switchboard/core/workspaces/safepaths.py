"""Reading and writing below a session workspace without ever following a symlink a command left there.

The sandboxed ``shell`` may leave anything in its workspace (a symlink aimed at ``site-packages``, a FIFO, a
socket), so everything the worker itself reads or writes there resolves the path one component at a time from a
descriptor of the workspace (:func:`open_dir`). There is no check-then-use window: every step acts on the descriptor
it verified. ``""``, ``.``, ``..`` and names with ``/`` or NUL are refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "UnsafePathError",
    "entry_stat",
    "missing_dirs",
    "open_dir",
    "parts_below",
    "read_bytes",
    "read_inside",
    "read_regular",
    "remove_entry",
    "remove_tree",
    "truncate_entry",
    "write_bytes",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_PREFIX = ".write-"


class UnsafePathError(OSError):
    """A symlink, a special file or a name like ``..`` stands where the worker was to read or write."""


def _refuse(code: int, why: str) -> UnsafePathError:
    return UnsafePathError(code, why)


def _check_parts(parts: Sequence[str]) -> None:
    for part in parts:
        if part in {"", ".", ".."} or "/" in part or "\x00" in part:
            raise _refuse(errno.EINVAL, "the path holds an empty, '.' or '..' component")


def parts_below(home: Path, target: Path) -> tuple[str, ...]:
    """The components of ``target`` below ``home``, compared as written (no symlink is resolved).

    Raises:
        UnsafePathError: ``target`` is not below ``home``, or holds ``..``.
    """
    try:
        parts = Path(target).relative_to(home).parts
    except ValueError:
        raise _refuse(errno.EXDEV, "the path is not inside the session workspace") from None
    _check_parts(parts)
    return parts


def _open_home(home: Path) -> int:
    try:
        return os.open(home, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in {errno.ELOOP, errno.ENOTDIR}:
            raise _refuse(errno.ELOOP, "the session workspace is not a directory") from None
        raise


def _step(parent: int, name: str, *, create: bool) -> int:
    """Open ``name`` below the directory ``parent`` as a directory, never through a symlink (made if missing)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as exc:
        if exc.errno in {errno.ELOOP, errno.ENOTDIR}:
            raise _refuse(errno.ELOOP, f"{name!r} in the path is a symlink or not a directory: refused") from None
        raise
    with contextlib.suppress(FileExistsError):  # made meanwhile: opened (and checked) below
        os.mkdir(name, 0o700, dir_fd=parent)
    return _step(parent, name, create=False)


@contextmanager
def open_dir(home: Path, parts: Sequence[str], *, create: bool = False) -> Iterator[int]:
    """A descriptor of the directory ``home/parts…``, reached without following any symlink (closed on exit).

    - each directory is opened with ``O_DIRECTORY | O_NOFOLLOW`` relative to the one above it (``dir_fd=``), and a
      missing one is made there (``0700``); a symlink anywhere in the chain is refused, never followed;
    - a replacing write goes to a fresh temporary name made with ``O_CREAT | O_EXCL | O_NOFOLLOW`` in the verified
      directory, renamed over the final name with ``os.replace(..., src_dir_fd=, dst_dir_fd=)`` (a rename never
      follows a link: a planted one is replaced, not written through);
    - an append or a read opens the final name with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO never blocks) and checks with
      ``fstat`` that it is a regular file; an append also refuses a file with other hard links (its other name may lie
      elsewhere), a read accepts one (a command cannot link across its mount, and reading is what it could do itself).

    Args:
        home: The workspace (its own path is trusted; from it on, nothing is followed).
        parts: The components below it (``()`` for the workspace itself).
        create: Make missing directories (``0700``).

    Raises:
        UnsafePathError: a component is a symlink, not a directory, or ``..``.
        FileNotFoundError: a component is missing and ``create`` is off.
    """
    _check_parts(parts)
    fd = _open_home(home)
    try:
        for part in parts:
            below = _step(fd, part, create=create)
            os.close(fd)
            fd = below
        yield fd
    finally:
        os.close(fd)


def missing_dirs(home: Path, parts: Sequence[str]) -> int:
    """How many of the directories ``home/parts…`` are missing (what a write there would make).

    Raises:
        UnsafePathError: an existing component is a symlink or not a directory.
    """
    _check_parts(parts)
    fd = _open_home(home)
    try:
        for index, part in enumerate(parts):
            try:
                below = _step(fd, part, create=False)
            except FileNotFoundError:
                return len(parts) - index
            os.close(fd)
            fd = below
        return 0
    finally:
        os.close(fd)


def entry_stat(home: Path, parts: Sequence[str]) -> os.stat_result | None:
    """``lstat`` of ``home/parts…`` (a link is described, not followed); ``None`` when it or a directory is missing.

    Raises:
        UnsafePathError: a directory on the way is a symlink or not a directory.
    """
    _check_parts(parts)
    if not parts:
        return os.stat(home, follow_symlinks=False)
    try:
        with open_dir(home, parts[:-1]) as parent:
            return os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _regular(fd: int, *, single: bool) -> os.stat_result:
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode):
        raise _refuse(errno.EINVAL, "not a regular file (a FIFO, socket, device or directory): refused")
    if single and found.st_nlink > 1:
        raise _refuse(errno.EMLINK, "the file has other hard links: refused (replace it instead)")
    return found


def _open_file(home: Path, parts: Sequence[str], flags: int, *, create: bool, single: bool) -> int:
    _check_parts(parts)
    if not parts:
        raise _refuse(errno.EISDIR, "the path names the session workspace itself")
    with open_dir(home, parts[:-1], create=create) as parent:
        try:
            fd = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refuse(errno.ELOOP, f"{parts[-1]!r} is a symlink: refused") from None
            if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened for writing with no reader
                raise _refuse(errno.ENXIO, "not a regular file (a socket or a FIFO): refused") from None
            raise
    try:
        _regular(fd, single=single)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(home: Path, parts: Sequence[str], *, limit: int | None = None) -> tuple[os.stat_result, bytes]:
    """The ``fstat`` and the bytes of the regular file ``home/parts…`` (see :func:`read_bytes`), from one descriptor.

    Raises:
        UnsafePathError: a symlink, a special file or ``..`` on the way.
        FileNotFoundError: it is missing.
    """
    fd = _open_file(home, parts, os.O_RDONLY, create=False, single=False)
    with os.fdopen(fd, "rb") as handle:
        found = os.fstat(fd)
        return found, handle.read() if limit is None else handle.read(limit)


def read_bytes(home: Path, parts: Sequence[str], *, limit: int | None = None) -> bytes:
    """The bytes of the regular file ``home/parts…``, opened without following links or blocking on a FIFO.

    Args:
        home: The workspace.
        parts: The components below it.
        limit: Read at most this many bytes (``None``: all).

    Raises:
        UnsafePathError: a symlink, a special file or ``..`` on the way.
        FileNotFoundError: it is missing.
    """
    return read_regular(home, parts, limit=limit)[1]


def read_inside(workspace: Path, target: Path, *, limit: int | None = None) -> bytes:
    """:func:`read_bytes` of ``target``, a path inside ``workspace`` (as ``resolve_in_workspace`` returns it).

    Raises:
        UnsafePathError: ``target`` is not inside ``workspace``, or a symlink or special file is in the way now.
        FileNotFoundError: it is missing.
    """
    home = workspace.resolve()
    return read_bytes(home, parts_below(home, target), limit=limit)


def write_bytes(home: Path, parts: Sequence[str], data: bytes, *, append: bool = False) -> int:
    """Write ``data`` to ``home/parts…`` (directories made ``0700``); returns the file's size.

    A replacing write goes to a temporary file renamed over the name, so an interrupted call never leaves half a
    file and a planted link at the name is replaced, not followed. An append opens the existing regular file.

    Raises:
        UnsafePathError: a symlink, a special file, a hard-linked file (append) or ``..`` on the way.
    """
    _check_parts(parts)
    if not parts:
        raise _refuse(errno.EISDIR, "the path names the session workspace itself")
    if append:
        fd = _open_file(home, parts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, create=True, single=True)
        with os.fdopen(fd, "ab") as handle:
            handle.write(data)
            handle.flush()
            return os.fstat(handle.fileno()).st_size
    with open_dir(home, parts[:-1], create=True) as parent:
        tmp = f"{_TEMP_PREFIX}{secrets.token_hex(8)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                size = os.fstat(handle.fileno()).st_size
            os.replace(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=parent)
            raise
        return size


def remove_entry(home: Path, parts: Sequence[str]) -> None:
    """Delete the file, link or empty directory ``home/parts…`` (the name itself; nothing is followed).

    Raises:
        UnsafePathError: a directory on the way is a symlink.
        OSError: it is gone, or a directory that is not empty.
    """
    _check_parts(parts)
    if not parts:
        raise _refuse(errno.EISDIR, "the path names the session workspace itself")
    with open_dir(home, parts[:-1]) as parent:
        try:
            os.unlink(parts[-1], dir_fd=parent)
        except IsADirectoryError:
            os.rmdir(parts[-1], dir_fd=parent)


def truncate_entry(home: Path, parts: Sequence[str], size: int) -> None:
    """Cut the regular file ``home/parts…`` to ``size`` bytes if it is longer (nothing is followed).

    A file with other hard links is refused: its other name may lie outside the workspace.

    Raises:
        UnsafePathError: a symlink, a special file or a hard-linked file in the way.
        OSError: it is gone.
    """
    fd = _open_file(home, parts, os.O_WRONLY, create=False, single=True)
    try:
        if os.fstat(fd).st_size > size:
            os.ftruncate(fd, size)
    finally:
        os.close(fd)


def remove_tree(home: Path, parts: Sequence[str]) -> None:
    """Delete ``home/parts…`` whatever it is (a directory with all it holds); a missing one is no error.

    Raises:
        UnsafePathError: a directory on the way is a symlink.
    """
    _check_parts(parts)
    if not parts:
        raise _refuse(errno.EISDIR, "the path names the session workspace itself")
    try:
        with open_dir(home, parts[:-1]) as parent:
            found = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            if stat.S_ISDIR(found.st_mode):
                shutil.rmtree(parts[-1], dir_fd=parent)  # descriptor-based: never follows a link
            else:
                os.unlink(parts[-1], dir_fd=parent)
    except FileNotFoundError:
        return
