"""A hostile model (or a user steering one) against the session workspace and its store.

The sandboxed ``shell`` writes into the workspace; everything else (user attachments, result files, skills, the S3
sync) is written by the worker on the host, with the worker's rights. These tests plant in a workspace what a
command can plant — a symlinked directory, a FIFO, a flood of bytes — and check the host-side writers stay inside
and the quotas hold. Tests marked ``xfail(strict=True)`` pin a defect described in the attack notes of issue #10:
they fail today and the mark goes with the fix.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.builtin.shell import shell_tools
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.tools.results import save_result
from switchboard.core.workspaces.disk import Quotas, Workspaces, workspace_for
from switchboard.errors import ToolError
from switchboard.types import SessionKey
from tests.sandbox.conftest import sandbox_of

SESSION = "t/a/web/default/chat"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "workspaces"


@pytest.fixture
def home(root: Path) -> Path:
    path = workspace_for(root, SESSION)
    path.mkdir(parents=True)
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
