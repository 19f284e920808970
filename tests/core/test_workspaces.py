"""Session workspaces: disjoint per session whatever the ids, and bounded per session, per tenant and in total."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.messages import session_key
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.builtin.files import TOOLS as FILES
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.workspaces.disk import DIRECTORY_BYTES, Quotas, Workspaces, read_total_bytes, workspace_for
from switchboard.errors import ToolError
from switchboard.types import SessionKey
from switchboard.web.metrics import Metrics

KiB = 1024


def context(workspaces: Workspaces, key: str) -> ToolContext:
    return ToolContext(
        session_key=SessionKey(key),
        tenant=key.split("/", 1)[0],
        run_id="run",
        actor="u",
        workspace=workspaces.path(key),
        idempotency_key="",
    )


def usage_on_disk(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and ".usage" not in p.parts)


def test_no_sessions_directory_lies_inside_anothers(tmp_path: Path) -> None:
    chats = ["-100123", "-1001", "7", "77", "a", "a.b", ".."]
    topics = [None, "77", "7", "88", "1", ".."]
    keys = {session_key("t", "assistant", "telegram", "default", c, th) for c in chats for th in topics}
    keys |= {session_key(tenant, "assistant", "web", "default", "c") for tenant in ("t", "t2", "t/x", "..")}
    paths = {key: workspace_for(tmp_path, key) for key in keys}
    assert len(set(paths.values())) == len(keys)
    for (a, pa), (b, pb) in itertools.permutations(paths.items(), 2):
        assert not pb.is_relative_to(pa), f"{b} lies inside {a}"
        assert pa.resolve().is_relative_to(tmp_path.resolve())


async def test_a_forum_topic_is_private_from_its_chat_and_never_blocked_by_it(tmp_path: Path) -> None:
    spaces = Workspaces(tmp_path)
    gateway = ToolGateway(ToolRegistry(FILES), workspace_root=tmp_path, workspaces=spaces)
    chat = context(spaces, session_key("t", "assistant", "telegram", "default", "-100123"))
    topic = context(spaces, session_key("t", "assistant", "telegram", "default", "-100123", "77"))
    topic_88 = context(spaces, session_key("t", "assistant", "telegram", "default", "-100123", "88"))

    assert (await gateway.call("write_file", {"path": "88", "content": "a file named like a topic"}, chat)).ok
    written = await gateway.call("write_file", {"path": "private.md", "content": "topic 88's notes"}, topic_88)
    assert written.ok, written.error
    assert (await gateway.call("write_file", {"path": "private.md", "content": "topic 77"}, topic)).ok

    listed = await gateway.call("list_files", {"recursive": True}, chat)
    assert [e["path"] for e in listed.value["entries"]] == ["88"]
    for probe in ("77/private.md", "88/private.md"):
        assert not (await gateway.call("read_file", {"path": probe}, chat)).ok
    assert (await gateway.call("read_file", {"path": "private.md"}, topic)).value["content"] == "topic 77"


async def test_one_session_cannot_write_past_its_quota_whatever_the_calls(tmp_path: Path) -> None:
    spaces = Workspaces(tmp_path, Quotas(session_bytes=64 * KiB, tenant_bytes=10**9, total_bytes=10**9))
    gateway = ToolGateway(ToolRegistry(FILES), workspace_root=tmp_path, workspaces=spaces)
    ctx = context(spaces, "t/a/web/default/c")
    big = await gateway.call("write_file", {"path": "big.txt", "content": "x" * (100 * KiB)}, ctx)
    assert not big.ok and big.error_class == "permanent" and "quota" in (big.error or "")
    assert not (spaces.path("t/a/web/default/c") / "big.txt").exists()
    refused = 0
    for _ in range(40):  # a program appending in a loop
        out = await gateway.call("write_file", {"path": "log.txt", "content": "y" * (4 * KiB), "append": True}, ctx)
        refused += not out.ok
    assert refused > 0
    assert usage_on_disk(spaces.path("t/a/web/default/c")) <= 64 * KiB
    assert spaces.total_bytes() == usage_on_disk(tmp_path)


async def test_tenants_and_the_whole_host_have_quotas_too(tmp_path: Path) -> None:
    spaces = Workspaces(tmp_path, Quotas(session_bytes=40 * KiB, tenant_bytes=100 * KiB, total_bytes=140 * KiB))
    gateway = ToolGateway(ToolRegistry(FILES), workspace_root=tmp_path, workspaces=spaces)

    async def fill(key: str) -> Any:
        return await gateway.call("write_file", {"path": "f.txt", "content": "z" * (30 * KiB)}, context(spaces, key))

    for n in range(3):
        assert (await fill(f"t/a/web/default/c{n}")).ok
    over_tenant = await fill("t/a/web/default/c3")
    assert not over_tenant.ok and "this tenant's workspaces" in (over_tenant.error or "")
    assert (await fill("u/a/web/default/c0")).ok
    over_total = await fill("v/a/web/default/c0")
    assert not over_total.ok and "all workspaces" in (over_total.error or "")
    assert read_total_bytes(tmp_path) == usage_on_disk(tmp_path) == 4 * 30 * KiB
    replaced = await gateway.call(
        "write_file", {"path": "f.txt", "content": "small"}, context(spaces, "t/a/web/default/c0")
    )
    assert replaced.ok and spaces.total_bytes() == usage_on_disk(tmp_path)


async def test_the_ledger_is_rebuilt_from_disk_when_missing(tmp_path: Path) -> None:
    spaces = Workspaces(tmp_path, Quotas(session_bytes=10**6, tenant_bytes=10**6, total_bytes=100 * KiB))
    first = spaces.path("t/a/web/default/c")
    first.mkdir(parents=True)
    (first / "already-there.bin").write_bytes(b"q" * (90 * KiB))  # written before the ledger existed
    gateway = ToolGateway(ToolRegistry(FILES), workspace_root=tmp_path, workspaces=spaces)
    ctx = context(spaces, "u/a/web/default/c")
    out = await gateway.call("write_file", {"path": "f.txt", "content": "z" * (20 * KiB)}, ctx)
    assert not out.ok and "all workspaces" in (out.error or "")


def test_metrics_report_the_disk_all_workspaces_hold(tmp_path: Path) -> None:
    metrics = Metrics()
    metrics.watch_workspaces(tmp_path, 5000)
    assert b"switchboard_workspace_bytes 0.0" in metrics.render(None, None)
    spaces = Workspaces(tmp_path)
    workspace = spaces.path("t/a/web/default/c")
    spaces.store(workspace, workspace / "a.txt", b"x" * 1234)
    text = metrics.render(None, None)
    assert b"switchboard_workspace_bytes 1234.0" in text and b"switchboard_workspace_quota_bytes 5000.0" in text


@pytest.mark.parametrize("quota", [0, 10])
def test_store_refuses_before_writing_anything(tmp_path: Path, quota: int) -> None:
    spaces = Workspaces(tmp_path, Quotas(session_bytes=quota))
    workspace = spaces.path("t/a/web/default/c")
    with pytest.raises(ToolError, match="quota"):
        spaces.store(workspace, workspace / "a.txt", b"x" * 11)
    assert not (workspace / "a.txt").exists() and spaces.total_bytes() == 0


def test_the_number_of_files_in_a_workspace_is_bounded(tmp_path: Path) -> None:
    spaces = Workspaces(tmp_path, Quotas(session_files=3))
    workspace = spaces.path("t/a/web/default/c")
    for n in range(3):
        spaces.store(workspace, workspace / f"{n}.txt", b"x")
    with pytest.raises(ToolError, match="already holds 3 files"):
        spaces.store(workspace, workspace / "3.txt", b"x")
    assert spaces.store(workspace, workspace / "0.txt", b"replaced") == len(b"replaced")


def test_directories_count_against_the_byte_and_file_quotas(tmp_path: Path) -> None:
    spaces = Workspaces(tmp_path, Quotas(session_bytes=2 * DIRECTORY_BYTES + 1, session_files=3))
    workspace = spaces.path("t/a/web/default/c")
    assert spaces.store(workspace, workspace / "a" / "b" / "c.txt", b"x") == 1
    assert read_total_bytes(tmp_path) == spaces.total_bytes() == 2 * DIRECTORY_BYTES + 1
    with pytest.raises(ToolError, match="over the 8193-byte quota"):  # a new directory: one more block
        spaces.store(workspace, workspace / "d" / "e.txt", b"")
    with pytest.raises(ToolError, match="already holds 3 files and directories, and this write would add 1"):
        spaces.store(workspace, workspace / "a" / "e.txt", b"")
    assert sorted(p.relative_to(workspace).as_posix() for p in workspace.rglob("*")) == ["a", "a/b", "a/b/c.txt"]
    assert spaces.store(workspace, workspace / "a" / "b" / "c.txt", b"y") == 1  # replacing still works


def test_the_rebuilt_ledger_matches_the_running_one(tmp_path: Path) -> None:
    spaces = Workspaces(tmp_path)
    for key, path in [("t/a/web/default/c", "x/y/z.txt"), ("t/a/web/default/d", "z.txt"), ("u/a/web/default/c", "q/r")]:
        workspace = spaces.path(key)
        spaces.store(workspace, workspace / path, b"12345")
    running = read_total_bytes(tmp_path)
    assert running == 3 * DIRECTORY_BYTES + 3 * 5
    for ledger in (tmp_path / ".usage").iterdir():
        ledger.unlink()
    assert spaces.total_bytes() == running  # rebuilt by one walk: the gateway's own directories are not counted
    workspace = spaces.path("t/a/web/default/d")
    spaces.store(workspace, workspace / "more.txt", b"1")
    assert read_total_bytes(tmp_path) == running + 1


def test_store_refuses_paths_too_deep_whoever_writes(tmp_path: Path) -> None:
    spaces = Workspaces(tmp_path)
    workspace = spaces.path("t/a/web/default/c")
    with pytest.raises(ToolError, match="33 components, over the most of 32") as info:
        spaces.store(workspace, workspace.resolve() / ("d/" * 32 + "f"), b"x", shown="d/…/f")
    assert info.value.error_class == "validation" and str(tmp_path) not in str(info.value)
    assert not workspace.exists() and spaces.total_bytes() == 0
