"""Files in the session's own workspace: ``read_file``, ``write_file`` and ``list_files``.

Every path is relative to the workspace and must stay inside it and within the path bounds, refused otherwise with an
error the model can act on. Reads, writes and listings are capped, ``read_file`` pages through a large file, and
every write counts against the workspace quotas. Errors name workspace-relative paths, never the host's.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from switchboard.core.agent.programs import cap_output
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.tools.threads import run_blocking
from switchboard.core.workspaces.disk import Quotas, Workspaces, make_private_dir, path_bound_error
from switchboard.core.workspaces.safepaths import read_inside
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
WORKSPACE_QUOTA_BYTES = Quotas().session_bytes
"""Most a session's workspace may hold when no :class:`Workspaces` is configured (a tool called on its own)."""
MAX_READ_CHARS = 100_000
"""Longest text one ``read_file`` call returns."""
MAX_LIST_ENTRIES = 500


def check_relative_path(path: str) -> str:
    """``path`` normalised (``./`` and doubled slashes removed) if it is a relative path inside a workspace.

    Raises:
        ValueError: empty, absolute, with a ``..`` segment, a home-directory ``~``, a NUL byte or a lone
            surrogate; or too deep or too long (:func:`~switchboard.core.workspaces.disk.path_bound_error`).
    """
    path = path.strip()
    if not path:
        raise ValueError("the path is empty: give a path relative to the session workspace, e.g. notes.md")
    if "\x00" in path:
        raise ValueError("the path contains a NUL byte")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the path is not valid text (it holds a lone surrogate)") from None
    pure = PurePosixPath(path.replace("\\", "/"))
    if pure.is_absolute() or path.startswith("~") or (len(path) > 1 and path[1] == ":"):
        raise ValueError(f"{path!r} is absolute: use a path relative to the session workspace, e.g. notes.md")
    if ".." in pure.parts:
        raise ValueError(f"{path!r} leaves the session workspace: use a path inside it, without '..'")
    if refused := path_bound_error(pure.parts):
        raise ValueError(refused)
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
        make_private_dir(workspace)  # conversation files: this user only
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
    """Arguments of ``read_file``: the whole file (head and tail), or one range of characters or of lines."""

    max_chars: int = Field(
        10_000, ge=100, le=MAX_READ_CHARS, description="Longest text returned (without a range: head and tail kept)."
    )
    offset: int | None = Field(None, ge=0, description="Read from this character (0-based), max_chars of them.")
    start_line: int | None = Field(None, ge=1, description="Read from this line (1-based)...")
    end_line: int | None = Field(None, ge=1, description="...to this line, included (default: as many as fit).")

    @model_validator(mode="after")
    def _one_range(self) -> ReadFileInput:
        if self.offset is not None and (self.start_line is not None or self.end_line is not None):
            raise ValueError("give either offset or start_line/end_line, not both")
        if self.start_line is not None and self.end_line is not None and self.end_line < self.start_line:
            raise ValueError("end_line is before start_line")
        return self


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


def _text_of(args: ReadFileInput, ctx: ToolContext) -> tuple[str, int]:
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
    try:
        data = read_inside(ctx.workspace, target, limit=MAX_FILE_BYTES + 1)  # no link followed, no FIFO waited on
    except OSError:
        raise ToolError(
            f"{args.path!r} is not a regular file in the session workspace", error_class="validation"
        ) from None
    try:
        return data.decode("utf-8"), len(data)
    except UnicodeDecodeError:
        raise ToolError(
            f"{args.path!r} is not UTF-8 text: use read_document for PDF, DOCX, XLSX and other documents",
            error_class="validation",
        ) from None


def _read(args: ReadFileInput, ctx: ToolContext) -> dict[str, Any]:
    text, size = _text_of(args, ctx)
    found: dict[str, Any] = {"path": args.path, "bytes": size, "chars": len(text)}
    if args.offset is not None:
        end = min(len(text), args.offset + args.max_chars)
        found.update(offset=args.offset, end=end, content=text[args.offset : end])
        if end < len(text):
            found["next"] = f"more follows: read_file with offset={end}"
        return found
    if args.start_line is not None or args.end_line is not None:
        return {**found, **_lines(text, args)}
    content = cap_output(text, args.max_chars)
    found.update(truncated=content != text, content=content)
    if content != text:
        found["next"] = "the middle is omitted: read ranges with offset (characters) or start_line/end_line"
    return found


def _lines(text: str, args: ReadFileInput) -> dict[str, Any]:
    lines = text.splitlines(keepends=True)
    first = args.start_line or 1
    last = min(args.end_line or len(lines), len(lines))
    chunk: list[str] = []
    used = 0
    number = first
    while number <= last and used + len(lines[number - 1]) <= args.max_chars:
        chunk.append(lines[number - 1])
        used += len(lines[number - 1])
        number += 1
    if not chunk and number <= last:  # one line longer than max_chars: its start
        chunk.append(lines[number - 1][: args.max_chars])
        number += 1
    found: dict[str, Any] = {
        "lines": len(lines),
        "start_line": first,
        "end_line": number - 1,
        "content": "".join(chunk),
    }
    if number <= len(lines):
        found["next"] = f"more follows: read_file with start_line={number}"
    return found


def _write(args: WriteFileInput, ctx: ToolContext) -> dict[str, Any]:
    target = resolve_in_workspace(ctx.workspace, args.path)
    if target != ctx.workspace.resolve() / args.path:  # a policy decided on the path: write the file it names
        raise ToolError(
            f"{args.path!r} goes through a symlink: write to the real path instead", error_class="validation"
        )
    if target.is_dir():
        raise ToolError(f"{args.path!r} is a directory: name a file inside it", error_class="validation")
    workspaces = ctx.workspaces or Workspaces(None, Quotas(session_bytes=WORKSPACE_QUOTA_BYTES))
    size = workspaces.store(ctx.workspace, target, args.content.encode("utf-8"), append=args.append, shown=args.path)
    return {"path": args.path, "bytes": size, "appended": args.append}


def _entry(root: Path, path: Path) -> dict[str, Any]:
    info = path.lstat()
    kind = "dir" if stat.S_ISDIR(info.st_mode) else "symlink" if stat.S_ISLNK(info.st_mode) else "file"
    entry: dict[str, Any] = {"path": path.relative_to(root).as_posix(), "type": kind}
    if kind == "file":
        entry["bytes"] = info.st_size
    return entry


def _tree(base: Path) -> list[Path]:
    """Everything under ``base`` (symlinked directories not entered), sorted.

    The walk keeps an explicit stack: ``Path.rglob`` recurses once per level and fails on a deep enough tree.
    """
    found: list[Path] = []
    stack = [base]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as scan:
                for entry in scan:
                    found.append(directory / entry.name)
                    with contextlib.suppress(OSError):
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(directory / entry.name)
        except OSError:
            continue
    return sorted(found)


def _list(args: ListFilesInput, ctx: ToolContext) -> dict[str, Any]:
    base = resolve_in_workspace(ctx.workspace, args.path)
    workspace = ctx.workspace.resolve()
    if not base.is_dir():
        raise ToolError(f"no directory {args.path!r} in the session workspace", error_class="validation")
    entries: list[dict[str, Any]] = []
    truncated = False
    walker = _tree(base) if args.recursive else sorted(base.iterdir())
    for path in walker:
        if path.name.startswith(".write-"):
            continue
        if len(entries) >= MAX_LIST_ENTRIES:
            truncated = True
            break
        entries.append(_entry(workspace, path))
    return {"path": _relative_name(workspace, base), "entries": entries, "truncated": truncated}


async def _in_thread(fn: Any, args: _PathInput | ListFilesInput, ctx: ToolContext) -> dict[str, Any]:
    try:
        found: dict[str, Any] = await run_blocking(ctx, fn, args, ctx)
    except OSError as exc:  # e.g. a name too long: say so with the model's own path, never the host's
        raise ToolError(f"{args.path!r}: {exc.strerror or type(exc).__name__}", error_class="validation") from None
    return found


async def read_file(args: ReadFileInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: a text file of the workspace, capped head and tail, or one range of it."""
    return await _in_thread(_read, args, ctx)


async def write_file(args: WriteFileInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: write (or append to) a text file of the workspace, creating directories as needed."""
    return await _in_thread(_write, args, ctx)


async def list_files(args: ListFilesInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: what a directory of the workspace holds."""
    return await _in_thread(_list, args, ctx)


TOOLS: list[Tool] = [
    Tool(
        name="read_file",
        description="Read a UTF-8 text file from your workspace (long files: head and tail), or a range of it: "
        "offset (characters) or start_line/end_line, to page through large files and saved results. "
        "For PDF, DOCX, CSV or XLSX use read_document.",
        input=ReadFileInput,
        fn=read_file,
        side_effect="read",
        output_trust="data",  # outside text: a data block, and later risky writes need confirmation
        timeout_s=10.0,
        connector="files",
        max_inline_bytes=4 * MAX_READ_CHARS + 1024,
    ),
    Tool(
        name="write_file",
        description="Write a UTF-8 text file in your workspace (replaces it unless append is true).",
        input=WriteFileInput,
        fn=write_file,
        side_effect="write",
        risk="low",  # only the session's own workspace, which the agent owns: never gated by default
        reversible=True,
        resources=lambda args: (f"workspace file {args.path}",),
        timeout_s=10.0,
        connector="files",
    ),
    Tool(
        name="list_files",
        description="List the files and directories in your workspace (or one of its directories).",
        input=ListFilesInput,
        fn=list_files,
        side_effect="read",
        timeout_s=10.0,
        connector="files",
    ),
]
"""The workspace file tools."""
