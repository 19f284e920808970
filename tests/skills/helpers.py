"""Skill packages for tests: folders written from a front matter and files, and zips built entry by entry."""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path

import yaml

DESCRIPTION = "Counts the words of a text file. Use when the user asks how long a text is."


def skill_md(
    name: str, description: str = DESCRIPTION, body: str = "# Word count\n\nRun scripts/count.py.", **extra: object
) -> str:
    front = yaml.safe_dump({"name": name, "description": description, **extra}, sort_keys=False, allow_unicode=True)
    return f"---\n{front}---\n\n{body}\n"


def make_skill(
    parent: Path, name: str, *, folder: str | None = None, files: dict[str, str] | None = None, **extra: object
) -> Path:
    """A skill folder ``parent/folder`` (default: ``name``) with a SKILL.md and a script."""
    root = parent / (folder or name)
    root.mkdir(parents=True)
    (root / "SKILL.md").write_text(skill_md(name, **extra), encoding="utf-8")
    for relative, text in (files if files is not None else {"scripts/count.py": "print(1)\n"}).items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text, encoding="utf-8")
    return root


def zip_folder(root: Path, target: Path, *, top: bool = True) -> Path:
    """Zip a folder (under its own name when ``top``, else its files at the zip's root)."""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                relative = path.relative_to(root).as_posix()
                archive.write(path, f"{root.name}/{relative}" if top else relative)
    return target


def zip_entries(target: Path, entries: dict[str, bytes], *, symlinks: dict[str, str] | None = None) -> Path:
    """A zip of raw entries (any name, even hostile ones) and symbolic-link entries (name → link target)."""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(zipfile.ZipInfo(name), data, compress_type=zipfile.ZIP_DEFLATED)
        for name, link in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.create_system = 3
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, link)
    return target
