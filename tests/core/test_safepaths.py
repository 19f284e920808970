"""Reads and writes below a workspace never follow what a command left there (links, FIFOs, sockets, devices)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from switchboard.core.workspaces.disk import Quotas, Workspaces, make_private_dir, workspace_for
from switchboard.core.workspaces.safepaths import (
    UnsafePathError,
    entry_stat,
    missing_dirs,
    open_dir,
    parts_below,
    read_bytes,
    read_inside,
    remove_tree,
    write_bytes,
)
from switchboard.core.workspaces.sync import MAX_KEY_BYTES, remote_name, write_copy

SESSION = "t/a/web/default/chat"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir(mode=0o755)
    (path / "secret.txt").write_bytes(b"host secret")
    return path


@pytest.mark.parametrize("level", [0, 1, 2])
def test_a_symlinked_directory_at_any_level_is_never_written_through(home: Path, outside: Path, level: int) -> None:
    parts = ["a", "b", "c"]
    real = home.joinpath(*parts[:level])
    real.mkdir(parents=True, exist_ok=True)
    (real / parts[level]).symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError):
        write_bytes(home, (*parts, "evil.pth"), b"import os")
    with pytest.raises(UnsafePathError):
        write_bytes(home, (*parts, "evil.pth"), b"import os", append=True)
    with pytest.raises(UnsafePathError):
        read_bytes(home, (*parts[: level + 1], "secret.txt"))
    with pytest.raises(UnsafePathError):
        missing_dirs(home, (*parts, "x"))
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert outside.stat().st_mode & 0o777 == 0o755


def test_a_symlinked_file_is_replaced_by_a_write_and_refused_by_a_read_or_an_append(home: Path, outside: Path) -> None:
    (home / "f.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(UnsafePathError):
        read_bytes(home, ("f.txt",))
    with pytest.raises(UnsafePathError):
        write_bytes(home, ("f.txt",), b"more", append=True)
    assert write_bytes(home, ("f.txt",), b"mine") == 4
    assert not (home / "f.txt").is_symlink() and (home / "f.txt").read_bytes() == b"mine"
    assert (outside / "secret.txt").read_bytes() == b"host secret"
    assert [p.name for p in home.iterdir()] == ["f.txt"], "no temporary file is left behind"


def test_a_fifo_is_refused_at_once_never_waited_on(home: Path) -> None:
    os.mkfifo(home / "data.sqlite")  # nobody writes to it: a blocking open would hang for ever
    with pytest.raises(UnsafePathError):
        read_bytes(home, ("data.sqlite",))
    with pytest.raises(UnsafePathError):
        write_bytes(home, ("data.sqlite",), b"x", append=True)
    write_bytes(home, ("data.sqlite",), b"x")  # a replacing write puts a file in its place
    assert stat.S_ISREG(os.lstat(home / "data.sqlite").st_mode)


def test_a_socket_is_refused(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(home)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("sock")
        with pytest.raises(UnsafePathError):
            read_bytes(home, ("sock",))


def test_a_device_is_refused(home: Path) -> None:
    try:
        os.mknod(home / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError as exc:
        pytest.skip(f"cannot make a device node here: {exc.strerror}")
    with pytest.raises(UnsafePathError):
        read_bytes(home, ("null",))


def test_a_hard_link_is_read_but_never_appended_to_and_a_replacement_leaves_its_twin(
    home: Path, tmp_path: Path
) -> None:
    twin = tmp_path / "twin.txt"  # a name elsewhere on the same file system (a command cannot make one: EXDEV)
    twin.write_bytes(b"shared")
    os.link(twin, home / "linked.txt")
    assert read_bytes(home, ("linked.txt",)) == b"shared"
    with pytest.raises(UnsafePathError):
        write_bytes(home, ("linked.txt",), b"more", append=True)
    write_bytes(home, ("linked.txt",), b"new")
    assert twin.read_bytes() == b"shared"


@pytest.mark.parametrize("parts", [("..", "x"), ("a", "..", "..", "x"), (".", "x"), ("", "x"), ("a/b",)])
def test_dot_dot_and_odd_components_are_refused(home: Path, parts: tuple[str, ...]) -> None:
    with pytest.raises(UnsafePathError):
        write_bytes(home, parts, b"x")
    with pytest.raises(UnsafePathError):
        read_bytes(home, parts)
    assert list(home.parent.glob("x")) == []


def test_parts_below_compares_as_written(home: Path) -> None:
    assert parts_below(home, home / "a" / "b.txt") == ("a", "b.txt")
    with pytest.raises(UnsafePathError):
        parts_below(home, home.parent / "other")
    with pytest.raises(UnsafePathError):
        parts_below(home, home / ".." / "x")


def test_missing_directories_are_made_private_and_counted(home: Path) -> None:
    (home / "a").mkdir()
    assert missing_dirs(home, ("a", "b", "c")) == 2
    write_bytes(home, ("a", "b", "c", "f.txt"), b"x")
    assert (home / "a" / "b" / "c" / "f.txt").read_bytes() == b"x"
    assert (home / "a" / "b").stat().st_mode & 0o777 == 0o700
    assert missing_dirs(home, ("a", "b", "c")) == 0
    found = entry_stat(home, ("a", "b", "c", "f.txt"))
    assert found is not None and found.st_size == 1
    assert entry_stat(home, ("a", "nope", "f.txt")) is None
    with open_dir(home, ("a", "b")) as fd:
        assert "c" in os.listdir(fd)


def test_remove_tree_deletes_the_link_not_what_it_points_at(home: Path, outside: Path) -> None:
    (home / "gone").symlink_to(outside, target_is_directory=True)
    remove_tree(home, ("gone",))
    assert not os.path.lexists(home / "gone") and (outside / "secret.txt").exists()
    (home / "d" / "e").mkdir(parents=True)
    (home / "d" / "e" / "f").write_bytes(b"x")
    (home / "d" / "link").symlink_to(outside, target_is_directory=True)
    remove_tree(home, ("d",))
    assert not (home / "d").exists() and (outside / "secret.txt").exists()


def test_read_inside_refuses_a_link_swapped_in_after_the_path_was_resolved(home: Path, outside: Path) -> None:
    (home / "dir").mkdir()
    (home / "dir" / "secret.txt").write_bytes(b"mine")
    target = home.resolve() / "dir" / "secret.txt"  # what resolve_in_workspace returned a moment ago
    (home / "dir").rename(home / "old")
    (home / "dir").symlink_to(outside, target_is_directory=True)  # a running command swaps it
    with pytest.raises(UnsafePathError):
        read_inside(home, target)


def test_make_private_dir_never_chmods_through_a_link(home: Path, outside: Path) -> None:
    (home / "inbox").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError):
        make_private_dir(home / "inbox")
    assert outside.stat().st_mode & 0o777 == 0o755
    made = make_private_dir(home / "x" / "y")
    assert made.is_dir() and (home / "x").stat().st_mode & 0o777 == 0o700


def test_a_download_replaces_what_stands_in_its_way_without_following_it(home: Path, outside: Path) -> None:
    (home / "reports").symlink_to(outside, target_is_directory=True)
    write_copy(home, "reports/q1.txt", b"from the store")
    assert (home / "reports").is_dir() and not (home / "reports").is_symlink()
    assert (home / "reports" / "q1.txt").read_bytes() == b"from the store"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_remote_names_the_store_cannot_hold_are_skipped() -> None:
    assert remote_name("a/b.txt") == "a/b.txt"
    assert remote_name("evil\nname.txt") is None
    assert remote_name("tab\there") is None
    assert remote_name("del\x7f") is None
    prefix = "p/t-0123456789abcdef/" + "0" * 32 + "/"
    room = MAX_KEY_BYTES - len(prefix)  # the key, prefix included, may be 1,024 bytes at most
    fits = "/".join(["y" * 199] * 4) + "/" + "z" * (room - 4 * 200)
    assert len((prefix + fits).encode()) == MAX_KEY_BYTES
    assert remote_name(fits, prefix) == fits
    assert remote_name(fits + "z", prefix) is None
    assert remote_name(fits + "z") is not None, "without the prefix it would pass: the prefix counts"


def test_settle_takes_back_what_commands_added_past_the_quota_and_keeps_what_was_there(tmp_path: Path) -> None:
    root = tmp_path / "root"
    home = make_private_dir(workspace_for(root, SESSION))
    spaces = Workspaces(root, Quotas(session_bytes=10_000))
    spaces.store(home, home / "kept.txt", b"k" * 3000, shown="kept.txt")
    before = spaces.snapshot(home)
    assert spaces.settle(home, before) is None
    (home / "out").mkdir()
    for index in range(4):  # what a command writes past the store: 3,000 + 4 × 3,000 + a directory
        (home / "out" / f"f{index}").write_bytes(b"x" * 3000)
    (home / "small").write_bytes(b"s")
    told = spaces.settle(home, before)
    assert told is not None and "removed" in told and "quota" in told
    held = sum(p.stat().st_size for p in home.rglob("*") if p.is_file())
    assert (home / "kept.txt").read_bytes() == b"k" * 3000
    assert held + 4096 * sum(1 for p in home.rglob("*") if p.is_dir()) <= 10_000
    spaces.store(home, home / "later.txt", b"ok", shown="later.txt")  # the ledger still adds up: writes go on


def test_settle_cuts_back_a_file_that_was_there_before_and_grew_past_the_quota(tmp_path: Path) -> None:
    root = tmp_path / "root"
    home = make_private_dir(workspace_for(root, SESSION))
    spaces = Workspaces(root, Quotas(session_bytes=10_000))
    spaces.store(home, home / "big.txt", b"x", shown="big.txt")
    before = spaces.snapshot(home)
    (home / "big.txt").write_bytes(b"x" * 20_000)  # a command grew a file it had before
    told = spaces.settle(home, before)
    assert told is not None and "cut 1 grown file back" in told, told
    assert (home / "big.txt").read_bytes() == b"x", "cut back to the size it had, not deleted"
    spaces.store(home, home / "more.txt", b"y", shown="more.txt")  # within the quota again: writes go on


def test_settle_cuts_no_file_through_a_link_and_removes_the_name_instead(tmp_path: Path) -> None:
    root = tmp_path / "root"
    home = make_private_dir(workspace_for(root, SESSION))
    outside = tmp_path / "host.txt"
    outside.write_bytes(b"h" * 20_000)
    spaces = Workspaces(root, Quotas(session_bytes=10_000))
    spaces.store(home, home / "a.txt", b"x", shown="a.txt")
    before = spaces.snapshot(home)
    (home / "a.txt").unlink()
    os.link(outside, home / "a.txt")  # a hard link to a host file the command could reach, in place of a.txt
    told = spaces.settle(home, before)
    assert told is not None and "removed 1 new entry ('a.txt')" in told, told
    assert outside.read_bytes() == b"h" * 20_000, "the host file was cut through its link in the workspace"
    assert not (home / "a.txt").exists()
