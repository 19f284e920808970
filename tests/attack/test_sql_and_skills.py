"""A hostile model (or a user steering one) against the ``sql`` tool, the session database card and skills.

The sandboxed ``shell`` can leave anything in the session workspace: a symlink, a FIFO, a hand-made SQLite file.
Host-side code then opens those paths with the worker's rights, outside every sandbox. Tests marked
``xfail(strict=True)`` pin a defect described in the attack notes of issue #10: they fail today and the mark goes
with the fix (an XPASS fails the suite).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from switchboard.core.sql.card import database_card
from switchboard.core.sql.guard import SqlLimits, deadline_handler
from switchboard.core.sql.store import SESSION_DB
from switchboard.core.tools.builtin.skills import UseSkillInput, skill_tools
from switchboard.core.tools.builtin.sql import SqlInput, sql_tools
from switchboard.core.tools.definition import ToolContext
from switchboard.core.workspaces.disk import Workspaces, workspace_for
from switchboard.errors import ToolError
from switchboard.skills.package import SkillError, parse_skill_md
from switchboard.skills.store import SkillLibrary, builtin_skills
from switchboard.types import SessionKey
from tests.sandbox.conftest import sandbox_of

MINE = "t/a/web/default/mine"
THEIRS = "t/a/web/default/theirs"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "workspaces"


@pytest.fixture
def mine(root: Path) -> Path:
    path = workspace_for(root, MINE)
    path.mkdir(parents=True)
    return path


@pytest.fixture
def theirs(root: Path) -> Path:
    """Another session of the same tenant, with a private table."""
    path = workspace_for(root, THEIRS)
    path.mkdir(parents=True)
    con = sqlite3.connect(path / SESSION_DB)
    con.execute("CREATE TABLE notes (body TEXT)")
    con.execute("INSERT INTO notes VALUES ('their-private-note')")
    con.commit()
    con.close()
    return path


def context(workspace: Path, root: Path, **kw: Any) -> ToolContext:
    return ToolContext(
        session_key=SessionKey(MINE),
        tenant="t",
        run_id="r",
        actor="u",
        workspace=workspace,
        idempotency_key="",
        workspaces=Workspaces(root),
        **kw,
    )


async def sql(ctx: ToolContext, statement: str) -> dict[str, Any]:
    [tool] = sql_tools(SqlLimits())
    found: dict[str, Any] = await tool.fn(SqlInput(statement=statement), ctx)
    return found


def _outcome(ctx: ToolContext, statement: str) -> str:
    import asyncio

    try:
        return str(asyncio.run(sql(ctx, statement)))
    except ToolError as err:
        return f"refused: {err}"


# --- the session database ------------------------------------------------------------------------------------------


async def test_a_symlinked_session_database_does_not_read_another_sessions_rows(
    root: Path, mine: Path, theirs: Path
) -> None:
    (mine / SESSION_DB).symlink_to(f"../{theirs.name}/{SESSION_DB}")  # what `ln -s` in the sandbox makes
    ctx = context(mine, root)
    try:
        shown = str(await sql(ctx, "SELECT body FROM notes"))
    except ToolError as err:
        shown = str(err)
    card = database_card(mine, {}).text
    assert "their-private-note" not in shown
    assert "notes" not in card, "the other session's tables reached this session's context"


async def test_a_write_through_a_symlinked_session_database_copies_nothing_of_another_session(
    root: Path, mine: Path, theirs: Path
) -> None:
    (mine / SESSION_DB).symlink_to(theirs / SESSION_DB)
    ctx = context(mine, root)
    with contextlib.suppress(ToolError):  # refusing is one good answer; starting a fresh database of its own is another
        await sql(ctx, "CREATE TABLE mine (x)")
    assert not (mine / SESSION_DB).exists() or b"their-private-note" not in (mine / SESSION_DB).read_bytes()


def test_a_fifo_named_like_the_session_database_does_not_freeze_the_prompt(mine: Path) -> None:
    os.mkfifo(mine / SESSION_DB)  # `mkfifo data.sqlite` in the shell
    done: list[str] = []
    worker = threading.Thread(target=lambda: done.append(database_card(mine, {}).text), daemon=True)
    worker.start()
    worker.join(15)  # a hang detector, not a speed limit: the card returns at once or never
    if worker.is_alive():  # let the stuck open() return, so the daemon thread does not outlive the test
        with open(mine / SESSION_DB, "wb"):
            pass
        worker.join(5)
        pytest.fail("building the card hung on a FIFO")
    assert done and CARD_OK in done[0]


CARD_OK = "main: this conversation's own database"


def test_a_hand_made_database_of_slow_views_cannot_hold_the_prompt_up(
    mine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    con = sqlite3.connect(mine / SESSION_DB)  # what the shell's sqlite3 can write
    slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c WHERE x < 0"
    for index in range(40):
        con.execute(f"CREATE VIEW v{index} AS {slow}")
    con.commit()
    con.close()
    granted: list[float] = []
    real = deadline_handler

    def spy(connection: sqlite3.Connection, timeout_s: float) -> None:
        granted.append(timeout_s)
        real(connection, min(timeout_s, 0.01))  # the same decisions, without waiting out each deadline

    monkeypatch.setattr("switchboard.core.sql.card.deadline_handler", spy)
    card = database_card(mine, {})
    assert "v0 (? rows)" in card.text, card.text
    assert sum(granted) <= 1.0, f"the card may spend {sum(granted):.2f} s of the event loop on one database"


def test_the_authoriser_refuses_the_classic_escapes(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    ctx = context(workspace, tmp_path / "root")
    _outcome(ctx, "CREATE TABLE t (a)")
    refused = {
        "SELECT length(randomblob(1000000000))": "too big",
        "SELECT length(zeroblob(2000000000))": "too big",
        "SELECT readfile('/etc/passwd')": "no such function",
        "SELECT writefile('x', 'y')": "no such function",
        "SELECT edit('a')": "no such function",
        "INSERT INTO sqlite_master VALUES ('table', 'x', 'x', 0, 'CREATE TABLE x (a)')": "may not be modified",
        "PRAGMA main.writable_schema = 1": "not allowed",
        "SELECT * FROM pragma_function_list": "not allowed",
        "PRAGMA temp_store_directory = '/tmp'": "not allowed",
        "PRAGMA mmap_size = 1000000000": "not allowed",
        "SELECT fts3_tokenizer('simple')": "not allowed",
        "VACUUM INTO '/tmp/copy.sqlite'": "not allowed",
        f"ATTACH DATABASE '{tmp_path / 'x.sqlite'}' AS x": "not allowed",
        "SELECT load_extension('/tmp/x')": "not allowed",
        "CREATE TEMP TRIGGER t AFTER INSERT ON t BEGIN SELECT 1; END": "not allowed",
    }
    for statement, why in refused.items():
        shown = _outcome(ctx, statement)
        assert shown.startswith("refused") and why in shown, (statement, shown)
    assert not (tmp_path / "x.sqlite").exists() and not Path("/tmp/copy.sqlite").exists()


# --- skills ----------------------------------------------------------------------------------------------------------


def _xlsx() -> Any:
    return next(ref for ref in builtin_skills() if ref.name == "xlsx-report")


async def test_use_skill_never_writes_through_a_symlink_out_of_the_workspace(
    root: Path, mine: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    (mine / "skills").mkdir()
    (mine / "skills" / "xlsx-report").symlink_to(outside, target_is_directory=True)
    [tool] = skill_tools(SkillLibrary())
    with contextlib.suppress(ToolError):  # refusing is one good answer; writing where the link leads is not
        await tool.fn(UseSkillInput(name="xlsx-report"), context(mine, root, skills=(_xlsx(),)))
    assert list(outside.iterdir()) == [], "the skill's files landed outside the workspace"
    assert outside.stat().st_mode & 0o777 == 0o755, "a directory outside the workspace was chmod-ed"


async def test_a_sandboxed_command_cannot_aim_use_skill_outside_through_its_mount_table(
    root: Path, mine: Path, tmp_path: Path
) -> None:
    box = sandbox_of("bwrap")
    target = tmp_path / "worker-owned"  # stands for the worker's venv, its data directory, /etc/cron.d …
    target.mkdir()
    mine.chmod(0o777)
    # the command learns its workspace's host path from /proc/self/mountinfo, then links to a sibling of it
    command = (
        "host=$(awk '$5 == \"/workspace\" {print $4}' /proc/self/mountinfo); "
        f'mkdir -p skills && ln -s "$host/../../../{target.name}" skills/xlsx-report && echo linked'
    )
    done = await box.run(command, mine, timeout_s=30, max_output=2000)
    assert "linked" in done.stdout, done
    [tool] = skill_tools(SkillLibrary())
    with contextlib.suppress(ToolError):
        await tool.fn(UseSkillInput(name="xlsx-report"), context(mine, root, skills=(_xlsx(),)))
    assert list(target.iterdir()) == []


def test_skill_front_matter_tricks_are_refused_without_running_anything(tmp_path: Path) -> None:
    bomb = "".join(
        f"  {level}: &{level} [{', '.join([f'*{prev}'] * 9)}]\n"
        for prev, level in zip("abcdefgh", "bcdefghi", strict=True)
    )
    cases = {
        "bomb": "---\nname: bomb\ndescription: x\nmetadata:\n  a: &a [x, x, x, x, x, x, x, x, x]\n" + bomb + "---\nb\n",
        "object": "---\nname: !!python/object/apply:os.system ['touch " + str(tmp_path / "pwned") + "']\n"
        "description: x\n---\nb\n",
        "merge": "---\nname: bomb\ndescription: x\n<<: {license: MIT}\n---\nb\n",
    }
    for case, text in cases.items():
        with pytest.raises(SkillError) as refused:
            parse_skill_md(text, "bomb")
        assert len(str(refused.value)) < 5000, case
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "hostile",
    [
        "s/./../../planted.txt",
        "s/scripts/..\\..\\..\\planted.txt",
        "s/\u2025/planted.txt",
        "s/\uff0e\uff0e/\uff0e\uff0e/planted.txt",
        "s//../planted.txt",
        "s/scripts/cafe\u0301.py",  # NFD beside the NFC name below: two files on Linux, never one overwriting
        "s/SKILL.MD",  # differs from SKILL.md by case only
    ],
)
def test_zip_slip_variants_never_write_outside_the_store(tmp_path: Path, hostile: str) -> None:
    from switchboard.skills.store import SkillStore
    from tests.skills.helpers import skill_md, zip_entries

    store = SkillStore(tmp_path / "data" / "skills")
    source = zip_entries(
        tmp_path / "in.zip",
        {"s/SKILL.md": skill_md("s").encode(), "s/scripts/caf\u00e9.py": b"print(1)\n", hostile: b"planted"},
    )
    with contextlib.suppress(SkillError):
        store.add(source)
    planted = [p for p in tmp_path.rglob("*") if p.is_file() and p.read_bytes() == b"planted"]
    assert all(p.resolve().is_relative_to((tmp_path / "data" / "skills").resolve()) for p in planted), planted
