"""Workspace quotas that a model (or a CodeAct loop, or an injected instruction) can still get around.

Directories count for nothing in the quota, and ``write_file`` creates every missing directory of its path: one
call with ``"e/" * 1500 + "g"`` made 1,501 directories (about 6 MB of disk on ext4) and was counted as 1 byte.
Worse, from then on every write of the session failed with ``maximum recursion depth exceeded``: the quota
measures the workspace with ``os.walk``, which recurses once per directory level (and the tenant/total ledger,
when rebuilt, walks every workspace of the host the same way).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchboard.core.toolbox.files import WriteFileInput, write_file
from switchboard.core.tools import ToolContext
from switchboard.core.workspaces import Workspaces
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
    try:
        return await write_file(WriteFileInput(path=path, content="x"), ctx)
    except ToolError as err:
        return err


@pytest.mark.xfail(
    strict=True,
    reason="files.write_file creates any depth of directories, and Workspaces counts no directory: 1,500 levels "
    "for a 1-byte file are accepted",
)
async def test_a_path_nested_1500_deep_is_refused(workspaces_root: Path) -> None:
    ctx = _ctx(workspaces_root)
    found = await _write(ctx, DEEP)
    assert isinstance(found, ToolError) and found.error_class == "validation"


@pytest.mark.xfail(
    strict=True,
    reason="after a directory chain ~1,000 deep exists, Workspaces._count (os.walk, recursive) raises "
    "RecursionError: every later write of the session fails",
)
async def test_a_deep_directory_chain_does_not_break_later_writes(workspaces_root: Path) -> None:
    ctx = _ctx(workspaces_root)
    await _write(ctx, DEEP)  # accepted today; refused once paths are bounded (then this test passes too)
    assert await _write(ctx, "notes.md") == {"path": "notes.md", "bytes": 1, "appended": False}
