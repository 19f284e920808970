"""Hostile packages are refused with nothing installed: traversal, absolute paths, links, bombs, floods."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from switchboard.skills import sources
from switchboard.skills.package import SkillError
from switchboard.skills.store import SkillStore
from tests.skills.helpers import make_skill, skill_md, zip_entries

GOOD = skill_md("evil").encode()


def refused(store: SkillStore, source: Path, match: str) -> None:
    with pytest.raises(SkillError, match=match):
        store.add(source)
    assert store.entries() == []
    assert not (store.root / "evil").exists()
    assert not any(p.name.startswith(".staging") for p in store.root.glob("*")) if store.root.exists() else True


@pytest.fixture
def store(tmp_path: Path) -> SkillStore:
    return SkillStore(tmp_path / "data" / "skills")


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("evil/../../escape.py", "'.' and '..' are not allowed"),
        ("../escape.py", "'.' and '..' are not allowed"),
        ("/etc/cron.d/evil", "paths must be relative"),
        ("evil\\..\\..\\escape.py", "paths must be relative"),
        ("C:/Windows/evil.dll", "paths must be relative"),
        ("evil/" + "/".join(["d"] * 9) + "/x", "too deep"),
    ],
)
def test_unsafe_paths_in_a_zip_are_refused(store: SkillStore, tmp_path: Path, name: str, match: str) -> None:
    archive = zip_entries(tmp_path / "evil.zip", {"evil/SKILL.md": GOOD, name: b"pwned"})
    refused(store, archive, match)
    assert not (tmp_path / "escape.py").exists() and not (tmp_path / "data" / "escape.py").exists()


def test_a_symlink_entry_in_a_zip_is_refused(store: SkillStore, tmp_path: Path) -> None:
    archive = zip_entries(tmp_path / "evil.zip", {"evil/SKILL.md": GOOD}, symlinks={"evil/passwd": "/etc/passwd"})
    refused(store, archive, "is a symbolic link")


def test_a_symlink_in_a_folder_is_refused(store: SkillStore, tmp_path: Path) -> None:
    root = make_skill(tmp_path / "src", "evil")
    os.symlink("/etc/passwd", root / "scripts" / "passwd")
    refused(store, root, "is a symbolic link")
    linked_dir = make_skill(tmp_path / "src2", "evil")
    os.symlink("/etc", linked_dir / "assets")
    refused(store, linked_dir, "is a symbolic link")


def test_a_zip_bomb_is_refused_by_its_declared_size_before_inflating(
    store: SkillStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = zip_entries(
        tmp_path / "evil.zip", {"evil/SKILL.md": GOOD, "evil/bomb.bin": b"\0" * (sources.MAX_FILE_BYTES + 1)}
    )
    assert archive.stat().st_size < 100_000, "a real bomb: tiny on disk"
    read: list[str] = []
    original = zipfile.ZipFile.open

    def spy(self: zipfile.ZipFile, name: object, *args: object, **kw: object) -> object:
        read.append(str(getattr(name, "filename", name)))
        return original(self, name, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(zipfile.ZipFile, "open", spy)
    refused(store, archive, "larger than .* bytes \\(the per-file cap\\)")
    assert read == [], "nothing was inflated"


def test_many_files_adding_up_past_the_total_cap_are_refused(
    store: SkillStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sources, "MAX_TOTAL_BYTES", 10_000)
    entries = {"evil/SKILL.md": GOOD, **{f"evil/assets/{i}.bin": b"x" * 3_000 for i in range(4)}}
    refused(store, zip_entries(tmp_path / "evil.zip", entries), "larger than 10000 bytes uncompressed")
    folder = make_skill(tmp_path / "src", "evil", files={f"assets/{i}.txt": "y" * 3_000 for i in range(4)})
    refused(store, folder, "larger than 10000 bytes uncompressed")


def test_a_header_that_understates_the_size_is_refused(
    store: SkillStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = zip_entries(tmp_path / "evil.zip", {"evil/SKILL.md": GOOD, "evil/big.bin": b"\0" * 50_000})
    real_infolist = zipfile.ZipFile.infolist

    def lying(self: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
        infos = real_infolist(self)
        for info in infos:  # the central directory claims 10 bytes; the data inflates to 50 kB
            if info.filename.endswith("big.bin"):
                info.file_size = 10
        return infos

    monkeypatch.setattr(zipfile.ZipFile, "infolist", lying)
    refused(store, archive, "could not be read from the zip")


def test_too_many_entries_are_refused_before_reading_any(
    store: SkillStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sources, "MAX_ENTRIES", 50)
    entries = {"evil/SKILL.md": GOOD, **{f"evil/assets/{i}.txt": b"" for i in range(60)}}
    refused(store, zip_entries(tmp_path / "evil.zip", entries), "more than 50 files and folders")


def test_not_a_zip_and_duplicates_and_no_skill_md(store: SkillStore, tmp_path: Path) -> None:
    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"PK\x03\x04 not really a zip")
    refused(store, junk, "neither a skill folder nor a zip file|not a readable zip")
    dup = tmp_path / "dup.zip"
    with zipfile.ZipFile(dup, "w") as archive:
        archive.writestr("evil/SKILL.md", GOOD)
        with pytest.warns(UserWarning, match="Duplicate name"):
            archive.writestr("evil/SKILL.md", skill_md("evil", description="Replaced.").encode())
    refused(store, dup, "appears twice")
    refused(store, zip_entries(tmp_path / "two.zip", {"a/SKILL.md": GOOD, "b/x": b""}), "no SKILL.md")
