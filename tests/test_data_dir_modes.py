"""The data directory holds conversation text (the AOF, session workspaces): readable by its owner only."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from switchboard.core.tools.builtin.files import resolve_in_workspace
from switchboard.queue.embedded import EmbeddedRedis, make_private_dir


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The usual umask of a shell (022), which alone would make everything world-readable."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _modes(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): _mode(p) for p in [root, *root.rglob("*")] if not p.is_socket() and not p.is_symlink()
    }


@pytest.mark.usefixtures("open_umask")
def test_the_embedded_server_writes_a_private_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data" / "redis"
    with EmbeddedRedis(data, appendfsync="always") as server:
        client = redis.Redis.from_url(server.url)
        client.set("conversation", "something private")
        client.close()
    modes = _modes(data)
    assert any(name.startswith("appendonlydir/") for name in modes), modes
    assert {name: mode for name, mode in modes.items() if mode != (0o700 if (data / name).is_dir() else 0o600)} == {}
    assert _mode(tmp_path / "data") == 0o700  # a parent it had to create is private too


@pytest.mark.usefixtures("open_umask")
def test_a_data_dir_left_readable_by_an_older_version_is_tightened(tmp_path: Path) -> None:
    data = tmp_path / "redis"
    (data / "appendonlydir").mkdir(parents=True, mode=0o755)
    data.chmod(0o755)
    old = data / "appendonlydir" / "old.aof"
    old.write_text("hello")
    old.chmod(0o644)
    with EmbeddedRedis(data):
        pass
    assert (_mode(data), _mode(data / "appendonlydir"), _mode(old)) == (0o700, 0o700, 0o600)


@pytest.mark.usefixtures("open_umask")
def test_make_private_dir_creates_every_missing_level_private(tmp_path: Path) -> None:
    path = make_private_dir(tmp_path / "a" / "b")
    assert (_mode(tmp_path / "a"), _mode(path)) == (0o700, 0o700)
    (tmp_path / "c").mkdir(mode=0o755)
    assert _mode(make_private_dir(tmp_path / "c")) == 0o700


@pytest.mark.usefixtures("open_umask")
def test_a_session_workspace_is_private(tmp_path: Path) -> None:
    workspace = tmp_path / "workspaces" / "session-1"
    resolve_in_workspace(workspace, "notes.txt")
    assert _mode(workspace) == 0o700


@pytest.mark.usefixtures("open_umask")
def test_every_level_above_a_workspace_and_its_result_files_is_private(tmp_path: Path) -> None:
    from switchboard.core.workspaces.disk import Workspaces, workspace_for

    root = tmp_path / "workspaces"
    workspace = workspace_for(root, "t1/assistant/web/default/c1")
    Workspaces(root).store(workspace, workspace / "results" / "result_1.json", b"{}")
    private = [root, workspace.parent, workspace, workspace / "results"]
    assert {str(p.relative_to(tmp_path)): _mode(p) for p in private} == {
        str(p.relative_to(tmp_path)): 0o700 for p in private
    }
    assert _mode(workspace / "results" / "result_1.json") == 0o600
