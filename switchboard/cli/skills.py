"""``switchboard skills add|list|show|remove``: the operator's skill packages, and the shipped ones."""

from __future__ import annotations

from pathlib import Path

from switchboard.settings import Settings
from switchboard.skills.package import SkillError, SkillRef
from switchboard.skills.sources import read_folder
from switchboard.skills.store import SkillLibrary, SkillStore, builtin_skills, parse_pin, template_names

__all__ = ["skill_store", "skills_command"]


def skill_store(settings: Settings) -> SkillStore:
    """The operator's store: ``<data dir>/skills``."""
    return SkillStore(settings.data_path / "skills")


def _list(store: SkillStore) -> None:
    entries = store.entries()
    installed = {e.name for e in entries}
    print(f"{'NAME':<24} {'VERSION':<10} {'SOURCE':<9} {'SHA256':<12}  ORIGIN")
    for entry in entries:
        print(f"{entry.name:<24} {entry.version:<10} {entry.source:<9} {entry.sha256[:12]}  {entry.origin}")
    for ref in builtin_skills():
        note = "  (replaced by an installed package)" if ref.name in installed else ""
        print(f"{ref.name:<24} {ref.version:<10} {'builtin':<9} {ref.sha256[:12]}{note}")
    names = template_names()
    if names:
        print(f"templates (skills add --template NAME): {', '.join(names)}")


def _show(store: SkillStore, pin: str) -> None:
    ref: SkillRef = SkillLibrary(store).resolve(pin)
    files = read_folder(ref.path).files
    print(f"skill:        {ref.name}")
    print(f"version:      {ref.version}")
    print(f"source:       {ref.source}")
    print(f"sha256:       {ref.sha256}")
    print(f"description:  {ref.description}")
    versions = [e.version for e in store.entries() if e.name == ref.name]
    if versions:
        print(f"installed:    {', '.join(versions)}")
    print("files:")
    for path in sorted(files):
        print(f"  {path} ({len(files[path])} bytes)")


def skills_command(settings: Settings, action: str, target: str | None, template: str | None = None) -> int:
    """Run one ``skills`` subcommand; returns the exit code (2: bad usage, 1: refused)."""
    store = skill_store(settings)
    try:
        if action == "list":
            _list(store)
            return 0
        if action == "add":
            if (template is None) == (target is None):
                print("switchboard: `skills add` needs a skill folder or .zip file, or --template NAME")
                return 2
            entry, new = store.add_template(template) if template else store.add(Path(target or ""))
            verb = "added" if new else "already installed:"
            print(f"{verb} {entry.name}@{entry.version} ({entry.source}, sha256 {entry.sha256[:12]})")
            return 0
        if not target:
            print(f"switchboard: `skills {action}` needs a skill NAME or NAME@VERSION (see `switchboard skills list`)")
            return 2
        if action == "show":
            _show(store, target)
            return 0
        name, version = parse_pin(target)
        for entry in store.remove(name, version):
            print(f"removed {entry.name}@{entry.version}")
        return 0
    except SkillError as err:
        print(f"switchboard: {err}")
        return 1
