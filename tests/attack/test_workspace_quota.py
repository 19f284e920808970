"""Hiding bytes from the workspace quota's measurements (``shell`` under each strong sandbox).

The quota is measured by walking the workspace; whatever the walk cannot reach is neither counted nor taken back.
"""

from __future__ import annotations

import os
from pathlib import Path

from switchboard.sandbox.runner import Sandbox
from tests.attack.test_workspaces import QUOTA, Session, _said, box, home, root

__all__ = ["box", "home", "root"]

_DEEP = r"""
import os
for chain in range(2):
    os.chdir(os.environ.get("PWD", "."))
    top = f"c{chain}"
    os.mkdir(top)
    os.chdir(top)
    for _ in range(22):  # past PATH_MAX (4096) below the workspace: a full path no longer opens
        os.mkdir("d" * 200)
        os.chdir("d" * 200)
    for i in range(3):
        with open(f"f{i}", "wb") as out:
            out.write(b"x" * 1_000_000)
print("hidden")
"""


def _held(home: Path) -> int:
    """Bytes under ``home``, walked one directory at a time (no full path: any depth)."""
    total = 0
    stack = [os.open(home, os.O_RDONLY | os.O_DIRECTORY)]
    while stack:
        fd = stack.pop()
        with os.scandir(fd) as scan:
            entries = list(scan)
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd))
            else:
                total += entry.stat(follow_symlinks=False).st_size
        os.close(fd)
    return total


async def test_bytes_below_a_path_too_long_for_the_host_are_counted(box: Sandbox, root: Path, home: Path) -> None:
    session = Session(box, root, home)
    (home / "p.py").write_text(_DEEP)
    outcome = await session.shell("python3 p.py")
    assert _held(home) <= QUOTA, f"{_held(home)} bytes kept in a {QUOTA}-byte workspace: {_said(outcome)}"
