"""Files in the session's own workspace: ``read_file``, ``write_file`` and ``list_files``.

Every path is relative to the workspace (``ToolContext.workspace``, created on first use) and must stay
inside it: absolute paths, ``..`` segments and symlinks that lead out are refused with an error the model
can act on. Reads, writes and listings are capped. File work runs in a thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import os
import stat
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from switchboard.core.programs import cap_output
from switchboard.core.tools import Tool, ToolContext
from switchboard.errors import ToolError

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_LIST_ENTRIES",
    "MAX_WRITE_CHARS",
    "TOOLS",
    "WORKSPACE_QUOTA_BYTES",
    "ListFilesInput",
    "ReadFileInput",
    "WriteFileInput",
    "check_relative_path",
    "resolve_in_workspace",
]

MAX_FILE_BYTES = 8 * 2**20
"""Largest file ``read_file`` opens."""
MAX_WRITE_CHARS = 2 * 2**20
"""Largest content one ``write_file`` call takes."""
WORKSPACE_QUOTA_BYTES = 256 * 2**20
"""Most a session's workspace may hold."""
MAX_LIST_ENTRIES = 500


def check_relative_path(path: str) -> str:
    """``path`` normalised (``./`` and doubled slashes removed) if it is a relative path inside a workspace.

    Raises:
        ValueError: empty, absolute, with a ``..`` segment, a home-directory ``~`` or a NUL byte.
    """
    path = path.strip()
    if not path:
        raise ValueError("the path is empty: give a path relative to the session workspace, e.g. notes.md")
    if "\x00" in path:
        raise ValueError("the path contains a NUL byte")
    pure = PurePosixPath(path.replace("\\", "/"))
    if pure.is_absolute() or path.startswith("~") or (len(path) > 1 and path[1] == ":"):
        raise ValueError(f"{path!r} is absolute: use a path relative to the session workspace, e.g. notes.md")
    if ".." in pure.parts:
        raise ValueError(f"{path!r} leaves the session workspace: use a path inside it, without '..'")
    return str(pure)


def resolve_in_workspace(workspace: Path, path: str, *, create: bool = True) -> Path:
    """The real location of ``path`` inside ``workspace`` (created on demand), following symlinks.

    Raises:
        ToolError: (``validation``) the path is not relative, or it leads out of the workspace.
    """
    try:
        relative = check_relative_path(path)
    except ValueError as exc:
        raise ToolError(str(exc), error_class="validation") from None
    if create:
        workspace.mkdir(parents=True, exist_ok=True)
    root = workspace.resolve()
    target = (root / relative).resolve()
    if not target.is_relative_to(root):
        raise ToolError(f"{path!r} leads out of the session workspace (through a symlink)", error_class="validation")
    return target


class _PathInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="Path relative to the session workspace, e.g. reports/summary.md.")

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        return check_relative_path(value)


class ReadFileInput(_PathInput):
    """Arguments of ``read_file``."""

    max_chars: int = Field(20_000, ge=100, le=200_000, description="Longest text returned (head and tail kept).")


class WriteFileInput(_PathInput):
    """Arguments of ``write_file``."""

    content: str = Field(max_length=MAX_WRITE_CHARS, description="The text to write (UTF-8).")
    append: bool = Field(False, description="Add to the end of the file instead of replacing it.")


class ListFilesInput(BaseModel):
    """Arguments of ``list_files``."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(".", description="Directory relative to the session workspace ('.' for its top).")
    recursive: bool = Field(False, description="Also list what is inside sub-directories.")

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        return "." if value.strip() in {"", ".", "./"} else check_relative_path(value)


def _relative_name(root: Path, target: Path) -> str:
    return target.relative_to(root.resolve()).as_posix() or "."


def _read(args: ReadFileInput, ctx: ToolContext) -> dict[str, Any]:
    target = resolve_in_workspace(ctx.workspace, args.path)
    if not target.is_file():
        raise ToolError(
            f"no file {args.path!r} in the session workspace (list_files shows what is there)",
            error_class="validation",
        )
    size = target.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ToolError(
            f"{args.path!r} is {size} bytes, over the {MAX_FILE_BYTES}-byte read cap: use read_document",
            error_class="validation",
        )
    data = target.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(
            f"{args.path!r} is not UTF-8 text: use read_document for PDF, DOCX, XLSX and other documents",
            error_class="validation",
        ) from None
    content = cap_output(text, args.max_chars)
    return {"path": args.path, "bytes": size, "chars": len(text), "truncated": content != text, "content": content}


def _usage(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def _write(args: WriteFileInput, ctx: ToolContext) -> dict[str, Any]:
    target = resolve_in_workspace(ctx.workspace, args.path)
    if target.is_dir():
        raise ToolError(f"{args.path!r} is a directory: name a file inside it", error_class="validation")
    data = args.content.encode("utf-8")
    existing = target.stat().st_size if target.is_file() else 0
    used = _usage(ctx.workspace.resolve())
    after = used + len(data) - (0 if args.append else existing)
    if after > WORKSPACE_QUOTA_BYTES:
        raise ToolError(
            f"the session workspace would hold {after} bytes, over its {WORKSPACE_QUOTA_BYTES}-byte quota",
            error_class="permanent",
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    if args.append:
        with target.open("ab") as handle:
            handle.write(data)
    else:
        # write then rename: a retried or interrupted call never leaves half a file
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".write-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return {"path": args.path, "bytes": target.stat().st_size, "appended": args.append}


def _entry(root: Path, path: Path) -> dict[str, Any]:
    info = path.lstat()
    kind = "dir" if stat.S_ISDIR(info.st_mode) else "symlink" if stat.S_ISLNK(info.st_mode) else "file"
    entry: dict[str, Any] = {"path": path.relative_to(root).as_posix(), "type": kind}
    if kind == "file":
        entry["bytes"] = info.st_size
    return entry


def _list(args: ListFilesInput, ctx: ToolContext) -> dict[str, Any]:
    base = resolve_in_workspace(ctx.workspace, args.path)
    workspace = ctx.workspace.resolve()
    if not base.is_dir():
        raise ToolError(f"no directory {args.path!r} in the session workspace", error_class="validation")
    entries: list[dict[str, Any]] = []
    truncated = False
    walker = sorted(base.rglob("*")) if args.recursive else sorted(base.iterdir())
    for path in walker:
        if path.name.startswith(".write-"):
            continue
        if len(entries) >= MAX_LIST_ENTRIES:
            truncated = True
            break
        entries.append(_entry(workspace, path))
    return {"path": _relative_name(workspace, base), "entries": entries, "truncated": truncated}


async def read_file(args: ReadFileInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: a text file of the workspace, capped head and tail."""
    return await asyncio.to_thread(_read, args, ctx)


async def write_file(args: WriteFileInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: write (or append to) a text file of the workspace, creating directories as needed."""
    return await asyncio.to_thread(_write, args, ctx)


async def list_files(args: ListFilesInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: what a directory of the workspace holds."""
    return await asyncio.to_thread(_list, args, ctx)


TOOLS: list[Tool] = [
    Tool(
        name="read_file",
        description="Read a UTF-8 text file from your workspace (long files: head and tail). "
        "For PDF, DOCX, CSV or XLSX use read_document.",
        input=ReadFileInput,
        fn=read_file,
        side_effect="read",
        timeout_s=10.0,
    ),
    Tool(
        name="write_file",
        description="Write a UTF-8 text file in your workspace (replaces it unless append is true).",
        input=WriteFileInput,
        fn=write_file,
        side_effect="write",
        timeout_s=10.0,
    ),
    Tool(
        name="list_files",
        description="List the files and directories in your workspace (or one of its directories).",
        input=ListFilesInput,
        fn=list_files,
        side_effect="read",
        timeout_s=10.0,
    ),
]
"""The workspace file tools."""
