"""Versioned packages: add (folder, zip, template), list, show, remove; versions and content hashes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from switchboard.skills.package import SkillError, check_pins, content_sha256
from switchboard.skills.sources import read_folder
from switchboard.skills.store import IndexEntry, SkillLibrary, SkillStore, builtin_skills, template_names
from tests.skills.helpers import make_skill, zip_folder


@pytest.fixture
def store(tmp_path: Path) -> SkillStore:
    return SkillStore(tmp_path / "data" / "skills")


def test_a_folder_is_installed_with_its_hash_version_and_source(store: SkillStore, tmp_path: Path) -> None:
    source = make_skill(tmp_path / "src", "word-count", metadata={"switchboard.version": "1.0"})
    entry, new = store.add(source)
    assert new and (entry.name, entry.version, entry.source) == ("word-count", "1.0", "local")
    assert entry.origin == str(source.resolve()) and len(entry.sha256) == 64
    installed = store.path(entry)
    assert installed == store.root / "word-count" / "1.0"
    assert (installed / "SKILL.md").read_bytes() == (source / "SKILL.md").read_bytes()
    assert (installed / "scripts" / "count.py").read_text() == "print(1)\n"
    index = json.loads((store.root / "index.json").read_text())
    assert index["schema"] == 1 and [s["sha256"] for s in index["skills"]] == [entry.sha256]


def test_a_zip_and_its_folder_have_the_same_hash(store: SkillStore, tmp_path: Path) -> None:
    source = make_skill(tmp_path / "src", "word-count")
    from_zip, _ = SkillStore(tmp_path / "other").add(zip_folder(source, tmp_path / "wc.zip"))
    flat, _ = SkillStore(tmp_path / "flat").add(zip_folder(source, tmp_path / "flat.zip", top=False))
    from_dir, _ = store.add(source)
    assert from_zip.sha256 == from_dir.sha256 == flat.sha256
    assert from_zip.name == flat.name == "word-count"


def test_without_a_declared_version_versions_count_up_and_the_same_content_is_not_added_twice(
    store: SkillStore, tmp_path: Path
) -> None:
    source = make_skill(tmp_path / "src", "word-count")
    first, new = store.add(source)
    again, new_again = store.add(source)
    assert (first.version, new, again, new_again) == ("1", True, first, False)
    (source / "scripts" / "count.py").write_text("print(2)\n")
    second, _ = store.add(source)
    assert second.version == "2" and second.sha256 != first.sha256
    assert [(e.name, e.version) for e in store.entries()] == [("word-count", "1"), ("word-count", "2")]
    assert store.find("word-count") == second, "an unpinned name means the latest added"
    assert store.find("word-count", "1") == first


def test_a_declared_version_with_other_content_is_refused(store: SkillStore, tmp_path: Path) -> None:
    source = make_skill(tmp_path / "src", "word-count", metadata={"version": "3"})
    store.add(source)
    (source / "scripts" / "count.py").write_text("print('changed')\n")
    with pytest.raises(SkillError, match="word-count@3 is installed with other content"):
        store.add(source)
    assert [e.version for e in store.entries()] == ["3"]


def test_an_invalid_package_changes_nothing(store: SkillStore, tmp_path: Path) -> None:
    bad = make_skill(tmp_path / "src", "word-count", folder="renamed")
    with pytest.raises(SkillError, match="must equal its folder's name 'renamed'"):
        store.add(bad)
    assert not (store.root / "index.json").exists() and not (store.root / "word-count").exists()


def test_remove_one_version_or_all(store: SkillStore, tmp_path: Path) -> None:
    source = make_skill(tmp_path / "src", "word-count")
    store.add(source)
    (source / "scripts" / "count.py").write_text("print(2)\n")
    store.add(source)
    [gone] = store.remove("word-count", "1")
    assert gone.version == "1" and not (store.root / "word-count" / "1").exists()
    assert [e.version for e in store.entries()] == ["2"]
    store.remove("word-count")
    assert store.entries() == [] and not (store.root / "word-count").exists()
    with pytest.raises(SkillError, match="word-count is not installed"):
        store.remove("word-count")


def test_templates_install_into_the_store_and_builtins_need_no_install(store: SkillStore) -> None:
    assert "csv-to-sqlite" in template_names()
    entry, new = store.add_template("csv-to-sqlite")
    assert new and entry.source == "template" and entry.origin == "template:csv-to-sqlite"
    assert (store.path(entry) / "scripts" / "load.py").is_file()
    with pytest.raises(SkillError, match="no skill template named 'nope'"):
        store.add_template("nope")
    builtin = {ref.name: ref for ref in builtin_skills()}
    assert {"xlsx-report", "pdf-report"} <= set(builtin)
    library = SkillLibrary(store)
    assert library.resolve("xlsx-report") == builtin["xlsx-report"]
    assert library.resolve("csv-to-sqlite").sha256 == entry.sha256


def test_an_installed_package_takes_a_builtin_name_and_pins_pick_versions(store: SkillStore, tmp_path: Path) -> None:
    mine = make_skill(tmp_path / "src", "xlsx-report", metadata={"switchboard.version": "9"})
    store.add(mine)
    library = SkillLibrary(store)
    assert (library.resolve("xlsx-report").version, library.resolve("xlsx-report").source) == ("9", "local")
    assert library.resolve("xlsx-report@1").source == "builtin", "the built-in stays reachable by its version"
    found, problems = library.resolve_all(["xlsx-report", "ghost", "pdf-report@7"])
    assert [r.name for r in found] == ["xlsx-report"]
    assert len(problems) == 2 and "no skill 'ghost'" in problems[0] and "pdf-report@7" in problems[1]


def sb(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard", "skills", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_the_cli_round_trip(tmp_path: Path) -> None:
    config = tmp_path / "switchboard.yaml"
    config.write_text("agents:\n  assistant:\n    profile: {name: A}\n    instructions: Hi.\n")
    env = {"PATH": "/usr/bin:/bin", "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"), "SWITCHBOARD_CONFIG": str(config)}
    source = make_skill(tmp_path / "src", "word-count", metadata={"switchboard.version": "1.0"})
    added = sb("add", str(zip_folder(source, tmp_path / "wc.zip")), env=env)
    assert added.returncode == 0, added.stdout + added.stderr
    assert added.stdout.startswith("added word-count@1.0 (local, sha256 ")
    assert "already installed: word-count@1.0" in sb("add", str(source), env=env).stdout
    listed = sb("list", env=env).stdout
    assert "word-count" in listed and "1.0" in listed and "xlsx-report" in listed and "builtin" in listed
    assert "csv-to-sqlite" in listed
    shown = sb("show", "word-count@1.0", env=env)
    assert shown.returncode == 0 and "scripts/count.py (9 bytes)" in shown.stdout and "sha256:" in shown.stdout
    bad = make_skill(tmp_path / "bad", "Bad-Name", folder="Bad-Name")
    refused = sb("add", str(bad), env=env)
    assert refused.returncode == 1 and "must be lowercase" in refused.stdout
    assert sb("add", env=env).returncode == 2
    assert sb("remove", "word-count@1.0", env=env).stdout.strip() == "removed word-count@1.0"
    gone = sb("show", "word-count", env=env)
    assert gone.returncode == 1 and "no skill 'word-count'" in gone.stdout


def test_a_package_with_a_builtins_name_and_version_is_refused_at_install(store: SkillStore, tmp_path: Path) -> None:
    builtin = next(ref for ref in builtin_skills() if ref.name == "xlsx-report")
    mine = make_skill(tmp_path / "src", "xlsx-report", metadata={"switchboard.version": builtin.version})
    with pytest.raises(SkillError, match=f"xlsx-report@{builtin.version} is a built-in skill.*another version"):
        store.add(mine)
    assert store.entries() == [] and not (store.root / "xlsx-report").exists()
    assert SkillLibrary(store).resolve(f"xlsx-report@{builtin.version}") == builtin  # still the built-in


def test_an_undeclared_version_counts_past_the_builtins(store: SkillStore, tmp_path: Path) -> None:
    builtin = next(ref for ref in builtin_skills() if ref.name == "pdf-report")
    entry, _ = store.add(make_skill(tmp_path / "src", "pdf-report"))
    assert entry.version == str(int(builtin.version) + 1)
    library = SkillLibrary(store)
    assert library.resolve("pdf-report") == library.resolve(f"pdf-report@{entry.version}") != builtin
    assert library.resolve(f"pdf-report@{builtin.version}") == builtin


def _installed_before_the_check(store: SkillStore, tmp_path: Path, name: str, version: str) -> IndexEntry:
    """A package of a built-in's name and version, as a store written before collisions were refused holds it."""
    source = make_skill(tmp_path / "old", name, metadata={"switchboard.version": version})
    package = read_folder(source)
    entry = IndexEntry(
        name=name,
        version=version,
        sha256=content_sha256(package.files),
        description="mine",
        source="local",
        origin=str(source),
        added_at=1.0,
        seq=1,
    )
    target = store.path(entry)
    shutil.copytree(source, target)
    (store.root / "index.json").write_text(json.dumps({"schema": 1, "skills": [entry.model_dump()]}))
    return entry


def test_a_pin_that_names_two_packages_is_refused_until_it_names_one(store: SkillStore, tmp_path: Path) -> None:
    builtin = next(ref for ref in builtin_skills() if ref.name == "xlsx-report")
    mine = _installed_before_the_check(store, tmp_path, "xlsx-report", builtin.version)
    library = SkillLibrary(store)
    pin = f"xlsx-report@{builtin.version}"
    with pytest.raises(SkillError, match="names two packages") as caught:
        library.resolve(pin)  # before: the installed one, silently (another hash than the pin had meant)
    assert f"builtin:{pin}" in str(caught.value) and f"{pin}#{mine.sha256[:12]}" in str(caught.value)
    assert library.resolve(f"builtin:{pin}") == builtin
    assert library.resolve(f"{pin}#{builtin.sha256[:12]}") == builtin
    by_hash = library.resolve(f"{pin}#{mine.sha256[:12]}")
    assert (by_hash.sha256, by_hash.source) == (mine.sha256, "local")
    assert library.resolve(f"installed:{pin}").sha256 == mine.sha256
    assert library.resolve("xlsx-report").sha256 == mine.sha256  # unpinned: the installed package takes its place
    with pytest.raises(SkillError, match="no skill"):
        library.resolve(f"{pin}#{'0' * 12}")
    found, problems = library.resolve_all([pin, "pdf-report@1"])
    assert [r.name for r in found] == ["pdf-report"] and "names two packages" in problems[0]


@pytest.mark.parametrize(
    "pin", ["xlsx-report", "xlsx-report@1", "builtin:xlsx-report@1", "installed:my-skill", "my-skill@2#0123456789ab"]
)
def test_qualified_pins_are_valid_in_an_agent(pin: str) -> None:
    assert check_pins([pin]) == [pin]


@pytest.mark.parametrize("pin", ["elsewhere:xlsx-report", "builtin:", "xlsx-report@1#", "xlsx-report#xyz", "a@1#12ab"])
def test_malformed_qualified_pins_are_refused(pin: str) -> None:
    with pytest.raises(ValueError, match="skill"):
        check_pins([pin])
