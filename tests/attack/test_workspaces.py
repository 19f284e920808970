"""A hostile model (or a user steering one) against the session workspace, its quota and its store.

The sandboxed ``shell`` writes into the workspace; everything else is written by the worker on the host, with the
worker's rights. These tests plant what a command can plant (a symlinked directory, a FIFO, a deep tree, a flood of
bytes) and check that host-side writers stay inside, paths stay bounded and the quota holds, also against ``shell``
under each strong sandbox. ``xfail(strict=True)`` pins a known defect; the mark goes with the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.builtin.files import (
    MAX_LIST_ENTRIES,
    ListFilesInput,
    WriteFileInput,
    list_files,
    write_file,
)
from switchboard.core.tools.builtin.files import TOOLS as FILE_TOOLS
from switchboard.core.tools.builtin.shell import shell_tools
from switchboard.core.tools.calls import ToolOutcome
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.tools.results import save_result
from switchboard.core.workspaces.disk import DIRECTORY_BYTES, Quotas, Workspaces, workspace_for
from switchboard.errors import ToolError
from switchboard.sandbox.runner import Sandbox
from switchboard.types import SessionKey
from tests.sandbox.conftest import LIMITS, sandbox_of

SESSION = "t/a/web/default/chat"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "workspaces"


@pytest.fixture
def home(root: Path) -> Path:
    path = workspace_for(root, SESSION)
    path.mkdir(parents=True, mode=0o700)
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory the worker owns outside every workspace (its venv's site-packages, /etc/cron.d, …)."""
    path = tmp_path / "site-packages"
    path.mkdir(mode=0o755)
    return path


def test_a_users_attachment_is_never_written_through_a_planted_symlink(root: Path, home: Path, outside: Path) -> None:
    (home / "inbox").symlink_to(outside, target_is_directory=True)  # `ln -s <host path> inbox` in the shell
    spaces = Workspaces(root)
    with contextlib.suppress(ToolError):  # how core/attachments.py stores the next file the user sends
        spaces.store(home, home / "inbox" / "m1-1-evil.pth", b"import os; os.system('id')\n", shown="inbox/x")
    assert list(outside.iterdir()) == [], "a .pth file in the worker's site-packages runs at its next start"
    assert outside.stat().st_mode & 0o777 == 0o755, "make_private_dir chmod-ed a directory outside the workspace"


def test_a_large_tool_result_is_never_written_through_a_planted_symlink(root: Path, home: Path, outside: Path) -> None:
    (home / "results").symlink_to(outside, target_is_directory=True)
    with contextlib.suppress(ToolError):
        save_result(Workspaces(root), home, "results/read_file-0123456789ab.json", '{"x": 1}')
    assert list(outside.iterdir()) == []


async def test_file_tools_and_reads_refuse_planted_links(root: Path, home: Path, outside: Path) -> None:
    from switchboard.core.tools.builtin.files import resolve_in_workspace
    from switchboard.core.workspaces.store import LocalWorkspaces

    (outside / "secret.txt").write_text("host secret")
    (home / "link").symlink_to(outside, target_is_directory=True)
    (home / "file.txt").symlink_to(outside / "secret.txt")
    for path in ("link/secret.txt", "file.txt", "link/new.txt"):
        with pytest.raises(ToolError):
            resolve_in_workspace(home, path)
    store = LocalWorkspaces(root)
    for path in ("link/secret.txt", "file.txt"):
        with pytest.raises(ToolError):
            await store.read(SESSION, path)


def _context(home: Path, root: Path) -> ToolContext:
    return ToolContext(
        session_key=SessionKey(SESSION),
        tenant="t",
        run_id="r",
        actor="u",
        workspace=home,
        idempotency_key="",
        workspaces=Workspaces(root, Quotas(session_bytes=2 * 2**20)),
    )


async def test_shell_commands_cannot_fill_the_disk_past_the_session_quota(root: Path, home: Path) -> None:
    box = sandbox_of("bwrap")  # 1 MB per file (tests/sandbox/conftest.LIMITS)
    home.chmod(0o777)
    ctx = _context(home, root)
    gateway = ToolGateway(ToolRegistry(shell_tools(box)), workspace_root=root, workspaces=ctx.workspaces)
    command = "for i in $(seq 8); do head -c 1000000 /dev/zero > f{n}-$i; done; echo wrote"
    outcome = await gateway.call("shell", {"commands": [command.format(n=n) for n in range(4)]}, ctx)
    held = sum(p.stat().st_size for p in home.rglob("*") if p.is_file())
    assert ctx.workspaces is not None
    assert held <= ctx.workspaces.quotas.session_bytes, (
        f"{held} bytes left in a workspace with a {ctx.workspaces.quotas.session_bytes}-byte quota "
        f"(call ok={outcome.ok})"
    )


def test_fifos_sockets_and_floods_in_a_workspace_do_not_hang_the_quota_walk(
    root: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.mkfifo(home / "pipe")
    monkeypatch.chdir(home)  # a socket's path is bounded (108 bytes): bind it by a relative name
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("sock")
        flood = home / "flood"
        flood.mkdir()
        for index in range(2000):
            (flood / f"{index}").touch()
        spaces = Workspaces(root, Quotas(session_files=1000))
        with pytest.raises(ToolError) as refused:  # the walk counts them (never opens them), and the cap holds
            spaces.store(home, home / "new.txt", b"x")
        assert "files and directories" in str(refused.value)
    assert not (home / "new.txt").exists()


# --- the S3 store (moto) -------------------------------------------------------------------------------------------

try:  # the S3 tests need aiobotocore and moto's server (the `s3` extra and the dev extra)
    from tests.workspaces.conftest import StoreFactory, bucket, keys, make_store, s3, s3_url

    HAVE_S3 = importlib.util.find_spec("moto") is not None
except ImportError:
    HAVE_S3 = False
s3_only = pytest.mark.skipif(not HAVE_S3, reason="aiobotocore and moto are needed for the S3 tests")

__all__ = ["bucket", "make_store", "s3", "s3_url"]  # fixtures of the S3 tests, used by name

CHAT = "acme/a/telegram/default/42"
OTHER = "globex/a/telegram/default/42"


@s3_only
@pytest.mark.parametrize(
    "hostile",
    [
        "%2e%2e/%2e%2e/escape.txt",
        "..\\..\\escape.txt",
        "a\\..\\..\\..\\escape.txt",
        "\uff0e\uff0e/escape.txt",  # fullwidth dots
        "\u2025/escape.txt",  # two-dot leader
        "a/./../../../escape.txt",
        "a//..//..//../escape.txt",
        "\u202e/../escape.txt",
    ],
)
async def test_hostile_keys_in_the_bucket_never_become_files_outside(
    make_store: StoreFactory, tmp_path: Path, s3: Any, bucket: str, hostile: str
) -> None:
    store = make_store(tmp_path / "worker")
    home = await store.hydrate(CHAT)
    prefix = "deploy/" + workspace_for(Path(), CHAT).as_posix() + "/"
    await s3.put_object(Bucket=bucket, Key=prefix + hostile, Body=b"planted")
    await store.hydrate(CHAT)
    planted = [p for p in tmp_path.rglob("*") if p.is_file() and p.read_bytes() == b"planted"]
    assert all(p.resolve().is_relative_to(home.resolve()) for p in planted), planted
    assert not list(tmp_path.rglob("escape.txt")) or all(
        p.resolve().is_relative_to(home.resolve()) for p in tmp_path.rglob("escape.txt")
    )


@s3_only
async def test_a_session_cannot_read_another_tenants_files_by_path_tricks(
    make_store: StoreFactory, tmp_path: Path, s3: Any, bucket: str
) -> None:
    store = make_store(tmp_path / "worker")
    home = await store.hydrate(OTHER)
    store.workspaces.store(home, home / "secret.txt", b"globex secret", shown="secret.txt")
    await store.persist(OTHER)
    theirs = workspace_for(Path(), OTHER).as_posix()
    for path in (f"../../{theirs}/secret.txt", f"..%2f..%2f{theirs}/secret.txt", f"..\\..\\{theirs}\\secret.txt"):
        with pytest.raises((ToolError, FileNotFoundError)):
            await store.read(CHAT, path)


@s3_only
async def test_non_regular_files_are_neither_uploaded_nor_waited_on(
    make_store: StoreFactory, tmp_path: Path, s3: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(tmp_path / "worker")
    home = await store.hydrate(CHAT)
    store.workspaces.store(home, home / "real.txt", b"ok", shown="real.txt")
    os.mkfifo(home / "pipe")
    monkeypatch.chdir(home)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("sock")
        await store.persist(CHAT)  # returns: a FIFO is never opened
    names = [k.rsplit("/", 1)[-1] for k in await keys(s3, bucket)]
    assert names == ["real.txt"]


@s3_only
async def test_one_file_name_the_store_refuses_does_not_poison_every_persist(
    make_store: StoreFactory, tmp_path: Path, s3: Any, bucket: str
) -> None:
    store = make_store(tmp_path / "worker")
    home = await store.hydrate(CHAT)
    store.workspaces.store(home, home / "report.xlsx", b"the user's report", shown="report.xlsx")
    # what `printf x > "$(printf 'a\nb')"` in the shell leaves; on AWS a name whose key passes 1,024 bytes (the
    # path bound does not count the prefix) is refused the same way
    (home / "evil\nname.txt").write_bytes(b"x")
    await store.persist(CHAT)  # raises today: in_workspace lets the OSError fail the turn, and the retry again
    names = [k.rsplit("/", 1)[-1] for k in await keys(s3, bucket)]
    assert "report.xlsx" in names


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


QUOTA = 2 * 2**20
FILL = 1_000_000
"""Bytes written into one file: under the sandbox's file-size limit (1 MiB), so only the quota can stop it.

Written with ``yes | head -c``: Landlock lets a command read no device but ``/dev/null``."""


@pytest.fixture(params=["bwrap", "landlock"])
def box(request: pytest.FixtureRequest) -> Sandbox:
    return sandbox_of(request.param)


class Session:
    """One session's tools through the real gateway: ``shell`` and the file tools, under a 2 MiB quota."""

    def __init__(self, box: Sandbox, root: Path, home: Path) -> None:
        self.spaces = Workspaces(root, Quotas(session_bytes=QUOTA))
        self.home = home
        registry = ToolRegistry([*shell_tools(box), *FILE_TOOLS])
        self.gateway = ToolGateway(registry, workspace_root=root, workspaces=self.spaces)
        self.ctx = ToolContext(
            session_key=SessionKey(SESSION),
            tenant="t",
            run_id="r",
            actor="u",
            workspace=home,
            idempotency_key="",
            workspaces=self.spaces,
        )

    async def shell(self, *commands: str, timeout_ms: int = 20_000) -> ToolOutcome:
        return await self.gateway.call("shell", {"commands": list(commands), "timeout_ms": timeout_ms}, self.ctx)

    async def tool(self, name: str, args: dict[str, Any]) -> ToolOutcome:
        return await self.gateway.call(name, args, self.ctx)

    def held(self) -> int:
        return sum(p.lstat().st_size for p in self.home.rglob("*") if p.is_file() and not p.is_symlink())


def _said(outcome: ToolOutcome) -> str:
    """Everything the model is told about a call: its error, or the result's ``error``."""
    if not outcome.ok:
        return str(outcome.error)
    assert isinstance(outcome.value, dict)
    return str(outcome.value.get("error", ""))


async def test_files_made_empty_in_one_call_and_filled_in_the_next_stay_within_the_quota(
    box: Sandbox, root: Path, home: Path
) -> None:
    """The reproduction: 20 empty files, then each filled, left 20× the file limit in the workspace."""
    session = Session(box, root, home)
    made = await session.shell("for i in $(seq 20); do : > f$i; done; echo made")
    assert made.ok and _said(made) == "", made
    filled = await session.shell(f"for i in $(seq 20); do yes | head -c {FILL} > f$i; done; echo filled")
    assert session.held() <= QUOTA, f"{session.held()} bytes left in a {QUOTA}-byte workspace"
    told = _said(filled)
    assert "quota" in told and "delete" in told, told
    assert sorted(p.name for p in home.iterdir()) == sorted(f"f{i}" for i in range(1, 21)), "the earlier files stay"


async def test_one_call_growing_files_that_were_there_before_is_cut_back(box: Sandbox, root: Path, home: Path) -> None:
    session = Session(box, root, home)
    for i in range(20):
        (home / f"f{i}").write_bytes(b"a" * 100)
    grown = await session.shell(f"for i in $(seq 0 19); do yes | head -c {FILL} >> f$i; done; echo grown")
    assert session.held() <= QUOTA, f"{session.held()} bytes left in a {QUOTA}-byte workspace"
    assert "quota" in _said(grown)
    for i in range(20):  # cut back, never below what the file held before
        assert (home / f"f{i}").read_bytes()[:100] == b"a" * 100


async def test_a_command_writing_past_the_quota_is_stopped_while_it_runs(box: Sandbox, root: Path, home: Path) -> None:
    session = Session(box, root, home)
    started = time.monotonic()
    outcome = await session.shell(f"for i in $(seq 60); do yes | head -c {FILL} > f$i; done; sleep 30")
    took = time.monotonic() - started
    assert took < 10, f"the command ran {took:.1f} s past the quota"
    assert outcome.ok and outcome.value["output"][0]["outcome"] != {"type": "timeout"}
    told = _said(outcome)
    assert "stopped" in told and "quota" in told, told
    assert session.held() <= QUOTA


@pytest.mark.parametrize(
    "start",
    [
        "( {loop} ) >/dev/null 2>&1 &",
        "setsid sh -c '{loop}' </dev/null >/dev/null 2>&1 &",
        "nohup sh -c '{loop}' </dev/null >/dev/null 2>&1 &",
    ],
    ids=["subshell", "setsid", "nohup"],
)
async def test_a_process_left_behind_writes_nothing_after_the_call(
    box: Sandbox, root: Path, home: Path, start: str
) -> None:
    session = Session(box, root, home)
    loop = "sleep 1; for i in $(seq 30); do yes | head -c 100000 >> bg$i; done"
    outcome = await session.shell(start.format(loop=loop) + " echo started")
    assert outcome.ok and outcome.value["output"][0]["stdout"] == "started\n"
    await asyncio.sleep(2.5)
    assert not list(home.glob("bg*")), "a process of the call kept writing after it returned"


async def test_while_over_the_quota_writes_are_refused_and_reads_and_deletions_work(
    box: Sandbox, root: Path, home: Path
) -> None:
    session = Session(box, root, home)
    for i in range(3):  # more than the quota (it was lowered, say): the workspace is over it
        (home / f"big{i}.txt").write_bytes(b"a" * FILL)
    refused = await session.tool("write_file", {"path": "new.txt", "content": "hello"})
    assert not refused.ok
    assert "over its" in str(refused.error) and "delete files" in str(refused.error), refused.error
    written = await session.shell("echo hi > new.txt; mkdir d; echo done")
    assert not (home / "new.txt").exists() and not (home / "d").exists()
    told = _said(written)
    assert "over its" in told and "delete files" in told, told
    read = await session.tool("read_file", {"path": "big0.txt", "offset": 0})
    assert read.ok, read.error
    deleted = await session.shell("rm big0.txt big1.txt; echo removed")
    assert deleted.ok and deleted.value["output"][0]["stdout"] == "removed\n", deleted
    assert sorted(p.name for p in home.iterdir()) == ["big2.txt"]
    assert "writing works again" in _said(deleted)
    again = await session.tool("write_file", {"path": "new.txt", "content": "hello"})
    assert again.ok, again.error
    shell = await session.shell("echo hi > new2.txt; cat new2.txt")
    assert shell.ok and shell.value["output"][0]["stdout"] == "hi\n" and _said(shell) == ""


async def test_a_sandbox_with_a_larger_file_limit_is_held_by_the_quota_alone(
    box: Sandbox, root: Path, home: Path
) -> None:
    """The reproduction's sizes: 60 MB files (under the worker's 64 MiB file limit), here in a 2 MiB workspace."""
    session = Session(replace(box, limits=replace(LIMITS, file_mb=64)), root, home)
    await session.shell("for i in $(seq 5); do : > f$i; done")
    filled = await session.shell("for i in $(seq 5); do yes | head -c 60000000 > f$i; done; echo filled")
    assert session.held() <= QUOTA
    assert "quota" in _said(filled)
