"""The session quota against ``shell`` (issue #18, finding 2), under each strong sandbox.

Found through the web chat with the offline model's ``/tool shell …`` calls: files that existed before a call were
never taken back, so twenty files made empty in one call and filled in the next stayed, whatever the quota; and
``shell`` kept running while the workspace was over it. Over the quota now means the call's writes are taken back
(new entries removed, grown files cut back to their earlier size) and, while the workspace is still over it,
every write is refused with a message saying how to get back under, while reads and deletions still work.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.builtin.files import TOOLS as FILE_TOOLS
from switchboard.core.tools.builtin.shell import shell_tools
from switchboard.core.tools.calls import ToolOutcome
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.workspaces.disk import Quotas, Workspaces, workspace_for
from switchboard.sandbox.runner import Sandbox
from switchboard.types import SessionKey
from tests.sandbox.conftest import LIMITS, sandbox_of

SESSION = "t/a/web/default/chat"
QUOTA = 2 * 2**20
FILL = 1_000_000
"""Bytes written into one file: under the sandbox's file-size limit (1 MiB), so only the quota can stop it.

Written with ``yes | head -c``: Landlock lets a command read no device but ``/dev/null``."""


@pytest.fixture(params=["bwrap", "landlock"])
def box(request: pytest.FixtureRequest) -> Sandbox:
    return sandbox_of(request.param)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "workspaces"


@pytest.fixture
def home(root: Path) -> Path:
    path = workspace_for(root, SESSION)
    path.mkdir(parents=True, mode=0o700)
    return path


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
