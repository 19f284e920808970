"""The local backend (the default, and a shared volume): the directory is the store, nothing is copied."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard.core.agent.replay import ReplayModel
from switchboard.core.messages import session_key
from switchboard.core.workspaces.disk import Workspaces, workspace_for
from switchboard.core.workspaces.s3 import build_workspace_store
from switchboard.core.workspaces.store import LocalWorkspaces
from switchboard.errors import ToolError
from switchboard.settings import load_settings
from tests.core.turns import MemorySink, MemoryStore, agent, answer_step, calls_step, request, runtime

CHAT = session_key("acme", "a", "web", "default", "c1")


async def test_a_runtime_without_a_store_keeps_todays_layout_and_copies_nothing(tmp_path: Path) -> None:
    model = ReplayModel(
        [calls_step(("write_file", {"path": "n.txt", "content": "kept"}), step=1), answer_step("ok", step=2)]
    )
    rt = runtime(tmp_path, model=model)
    store = rt.gateway.store
    assert isinstance(store, LocalWorkspaces) and store.root == tmp_path / "ws"
    turn = request("write", agent_=agent(tools=("write_file",)))
    await rt.run_turn(turn, MemorySink(), MemoryStore())
    home = workspace_for(tmp_path / "ws", turn.session_key)
    assert (home / "n.txt").read_text() == "kept"
    assert sorted(p.name for p in (tmp_path / "ws").iterdir()) == [".usage", home.parent.name]  # no sync state
    assert await store.hydrate(turn.session_key) == home and await store.read(turn.session_key, "n.txt") == b"kept"


async def test_two_hosts_on_one_shared_volume_see_one_workspace(tmp_path: Path) -> None:
    shared = tmp_path / "mnt" / "workspaces"
    a, b = LocalWorkspaces(shared, Workspaces(shared)), LocalWorkspaces(shared, Workspaces(shared))
    home = await a.hydrate(CHAT)
    a.workspaces.store(home, home / "r.csv", b"1,2")
    await a.persist(CHAT)
    assert await b.hydrate(CHAT) == home and await b.read(CHAT, "r.csv") == b"1,2"


async def test_local_reads_refuse_escapes_and_delete_corrects_the_usage_ledger(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    spaces = Workspaces(root)
    store = LocalWorkspaces(root, spaces)
    other = session_key("acme", "a", "web", "default", "c2")
    for session, size in ((CHAT, 300), (other, 500)):
        home = await store.hydrate(session)
        spaces.store(home, home / "f.bin", b"x" * size)
    (tmp_path / "secret").write_bytes(b"host")
    (workspace_for(root, CHAT) / "link").symlink_to(tmp_path / "secret")
    for path in ("link", "../c2/f.bin", str(tmp_path / "secret")):
        with pytest.raises(ToolError):
            await store.read(CHAT, path)
    with pytest.raises(FileNotFoundError):
        await store.read(CHAT, "missing")
    await store.delete(CHAT)
    assert not workspace_for(root, CHAT).exists()
    home = workspace_for(root, other)
    spaces.store(home, home / "g.bin", b"y")  # the next write rebuilds the ledger from the disk
    assert spaces.total_bytes() == 501


def test_the_local_root_is_the_data_dir_unless_a_shared_volume_is_named(tmp_path: Path) -> None:
    base = {"SWITCHBOARD_DATA_DIR": str(tmp_path / "data")}
    settings = load_settings(base)
    default = build_workspace_store(settings.workspace_path, settings.workspaces)
    assert isinstance(default, LocalWorkspaces) and default.root == tmp_path / "data" / "workspaces"
    nfs = load_settings({**base, "SWITCHBOARD_WORKSPACES__ROOT": str(tmp_path / "nfs")})
    mounted = build_workspace_store(nfs.workspace_path, nfs.workspaces)
    assert isinstance(mounted, LocalWorkspaces) and mounted.root == tmp_path / "nfs"
