"""Workspace quotas that a model (or a CodeAct loop, or an injected instruction) could get around.

Directories counted for nothing in the quota, and ``write_file`` creates every missing directory of its path: one
call with ``"e/" * 1500 + "g"`` made 1,501 directories (about 6 MB of disk on ext4) and was counted as 1 byte.
Worse, from then on every write of the session failed with ``maximum recursion depth exceeded``: the quota
measured the workspace with ``os.walk``, which recurses once per directory level (and the tenant/total ledger,
when rebuilt, walked every workspace of the host the same way; ``list_files(recursive)`` used ``rglob``, likewise).
Now paths are bounded (32 components, 1,024 bytes), directories count, and every walk keeps its own stack: these
tests guard all three, including a deep tree made on disk some other way (before the bound existed).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from switchboard.core.tools.builtin.files import (
    MAX_LIST_ENTRIES,
    ListFilesInput,
    WriteFileInput,
    list_files,
    write_file,
)
from switchboard.core.tools.definition import ToolContext
from switchboard.core.workspaces.disk import DIRECTORY_BYTES, Quotas, Workspaces
from switchboard.errors import ToolError

DEEP = "e/" * 1_500 + "g"


def _remove(root: Path) -> None:
    """Delete ``root`` without recursion: ``shutil.rmtree`` (and pytest's own clean-up of old temporary
    directories, for every later run on the machine) fails with ``RecursionError`` on a chain this deep."""
    found: list[tuple[str, bool]] = []
    stack = [str(root)]
    while stack:
        path = stack.pop()
        found.append((path, True))
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    found.append((entry.path, False))
    for path, is_dir in reversed(found):
        if is_dir:
            os.rmdir(path)
        else:
            os.unlink(path)


@pytest.fixture
def workspaces_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "workspaces"
    yield root
    if root.exists():
        _remove(root)


def _ctx(root: Path) -> ToolContext:
    return ToolContext(
        session_key="t/a/web/default/c1",
        tenant="t",
        run_id="run-1",
        actor="user-1",
        workspace=root / "t-x" / "c1",
        idempotency_key="k",
        workspaces=Workspaces(root),
    )


async def _write(ctx: ToolContext, path: str) -> dict[str, object] | ToolError:
    """The tool body called with ``path`` unvalidated (as if its input model let it through)."""
    try:
        return await write_file(WriteFileInput.model_construct(path=path, content="x", append=False), ctx)
    except ToolError as err:
        return err


async def test_a_path_nested_1500_deep_is_refused(workspaces_root: Path) -> None:
    ctx = _ctx(workspaces_root)
    with pytest.raises(ValidationError, match="1501 components, over the most of 32"):
        WriteFileInput.model_validate({"path": DEEP, "content": "x"})
    found = await _write(ctx, DEEP)
    assert isinstance(found, ToolError) and found.error_class == "validation"
    assert "1501 components, over the most of 32" in str(found) and str(workspaces_root) not in str(found)
    assert not (ctx.workspace / "e").exists()


async def test_a_deep_directory_chain_does_not_break_later_writes(workspaces_root: Path) -> None:
    ctx = _ctx(workspaces_root)
    await _write(ctx, DEEP)  # refused: no directory made
    assert await _write(ctx, "notes.md") == {"path": "notes.md", "bytes": 1, "appended": False}


def _chain(base: Path, depth: int) -> Path:
    """``depth`` nested directories under ``base``, made one ``mkdir`` at a time (``os.makedirs`` recurses)."""
    path = base
    for _ in range(depth):
        path = path / "e"
        path.mkdir(parents=path.parent == base)
    return path


async def test_a_deep_tree_already_on_disk_is_counted_and_breaks_nothing(workspaces_root: Path) -> None:
    """A chain 1,500 deep made some other way (before paths were bounded): writes, the ledger's rebuild and
    ``list_files`` walk it without ``RecursionError``, and its directories count against the quotas."""
    ctx = _ctx(workspaces_root)
    assert ctx.workspaces is not None
    (_chain(ctx.workspace, 1_500) / "g").write_text("x")
    assert await _write(ctx, "notes.md") == {"path": "notes.md", "bytes": 1, "appended": False}
    on_disk = 1_500 * DIRECTORY_BYTES + 1 + 1
    assert ctx.workspaces.total_bytes() == on_disk  # the ledger, rebuilt by walking the whole root
    for ledger in (workspaces_root / ".usage").iterdir():
        ledger.unlink()
    assert ctx.workspaces.total_bytes() == on_disk  # no ledger: one walk over the root
    listed = await list_files(ListFilesInput(recursive=True), ctx)
    assert listed["truncated"] is True and len(listed["entries"]) == MAX_LIST_ENTRIES
    assert listed["entries"][:2] == [{"path": "e", "type": "dir"}, {"path": "e/e", "type": "dir"}]
    tight = Workspaces(workspaces_root, Quotas(session_files=1_502))  # 1,500 directories + g + notes.md
    found = await _write(dataclasses.replace(ctx, workspaces=tight), "more.md")
    assert isinstance(found, ToolError) and "already holds 1502 files and directories" in str(found)
