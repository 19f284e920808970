"""Skills as versioned packages: the operator's store under the data directory, and the shipped ones.

Installed versions live under ``<data>/skills/<name>/<version>/`` with an ``index.json``; changes take a file lock,
stage the package and replace the index atomically, so an interrupted ``add`` leaves nothing half-done. Built-in
skills are always available, templates are copied on request, and a pin ``name@version`` names exactly one package
(:class:`~switchboard.skills.package.Pin`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import time
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from switchboard.skills.package import (
    Pin,
    SkillError,
    SkillManifest,
    SkillRef,
    SkillSource,
    content_sha256,
    name_problems,
    read_manifest,
)
from switchboard.skills.sources import PackageFiles, read_folder, read_source

__all__ = [
    "BUILTIN_DIR",
    "TEMPLATE_DIR",
    "IndexEntry",
    "SkillLibrary",
    "SkillStore",
    "builtin_skills",
    "parse_pin",
    "template_names",
]

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
INDEX_FILE = "index.json"


class IndexEntry(BaseModel):
    """One installed version, as the index records it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: str
    sha256: str
    description: str
    source: SkillSource
    origin: str
    """The folder or zip it was added from, or ``template:NAME``."""
    added_at: float
    seq: int
    """Order of addition; the latest added version is the one an unpinned name means."""


class _Index(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = Field(1, alias="schema")
    skills: list[IndexEntry] = Field(default_factory=list)


def parse_pin(pin: str) -> tuple[str, str | None]:
    """``name`` or ``name@version`` → (name, version or ``None``).

    Raises:
        SkillError: a malformed pin, or one qualified by a source or hash (the store takes names and versions only).
    """
    parsed = Pin.parse(pin)
    if parsed.source is not None or parsed.sha256 is not None:
        raise SkillError(f"{pin!r}: give the installed skill as NAME or NAME@VERSION (see `switchboard skills list`)")
    return parsed.name, parsed.version


def _ref(entry: IndexEntry, path: Path) -> SkillRef:
    return SkillRef(entry.name, entry.version, entry.sha256, entry.description, entry.source, path)


def _exact(ref: SkillRef) -> str:
    """A pin naming only ``ref``: ``builtin:name@version`` for a built-in, ``name@version#sha256[:12]`` otherwise."""
    return f"builtin:{ref.pin}" if ref.source == "builtin" else f"{ref.pin}#{ref.sha256[:12]}"


@cache
def _shipped(folder: Path) -> tuple[SkillRef, ...]:
    found = []
    for root in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
        package = read_folder(root)
        manifest = read_manifest(package.files, package.folder)
        version = manifest.declared_version or "1"
        found.append(
            SkillRef(manifest.name, version, content_sha256(package.files), manifest.description, "builtin", root)
        )
    return tuple(found)


def builtin_skills() -> tuple[SkillRef, ...]:
    """The skills shipped with Switchboard, always available to the agents that list them."""
    return _shipped(BUILTIN_DIR)


def template_names() -> list[str]:
    """The installable templates shipped with Switchboard (``skills add --template NAME``)."""
    return [ref.name for ref in _shipped(TEMPLATE_DIR)]


class SkillStore:
    """The operator's installed packages under ``root`` (``<data>/skills``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.root / ".lock", "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _read(self) -> _Index:
        try:
            raw = (self.root / INDEX_FILE).read_text(encoding="utf-8")
        except FileNotFoundError:
            return _Index()
        try:
            return _Index.model_validate_json(raw)
        except ValidationError as err:
            raise SkillError(
                f"{self.root / INDEX_FILE} is damaged ({err.error_count()} problem(s)); restore it"
            ) from None

    def _write(self, index: _Index) -> None:
        tmp = self.root / f".{INDEX_FILE}.{secrets.token_hex(4)}"
        tmp.write_text(index.model_dump_json(by_alias=True, indent=2), encoding="utf-8")
        tmp.replace(self.root / INDEX_FILE)

    def path(self, entry: IndexEntry) -> Path:
        """Where an installed version's files are."""
        return self.root / entry.name / entry.version

    def entries(self) -> list[IndexEntry]:
        """Every installed version, by name, then in the order they were added."""
        return sorted(self._read().skills, key=lambda e: (e.name, e.seq))

    def find(self, name: str, version: str | None = None) -> IndexEntry | None:
        """The installed ``name@version`` (``None``: the latest added version of ``name``)."""
        found = [e for e in self._read().skills if e.name == name and version in (None, e.version)]
        return max(found, key=lambda e: e.seq) if found else None

    def add(self, source: Path) -> tuple[IndexEntry, bool]:
        """Validate and install a package folder or zip; returns its entry and whether it is new.

        Raises:
            SkillError: invalid or unsafe package, or that version is installed with other content.
        """
        package = read_source(source)
        return self._install(package, "local", str(source.resolve()))

    def add_template(self, name: str) -> tuple[IndexEntry, bool]:
        """Copy a shipped template into the store.

        Raises:
            SkillError: no template of that name.
        """
        if name not in template_names():
            known = ", ".join(template_names()) or "none"
            raise SkillError(f"no skill template named {name!r} (templates: {known})")
        return self._install(read_folder(TEMPLATE_DIR / name), "template", f"template:{name}")

    def _install(self, package: PackageFiles, source: SkillSource, origin: str) -> tuple[IndexEntry, bool]:
        manifest = read_manifest(package.files, package.folder)
        digest = content_sha256(package.files)
        with self._locked():
            index = self._read()
            same = [e for e in index.skills if e.name == manifest.name]
            version = self._version(manifest, digest, same)
            if any(ref.name == manifest.name and ref.version == version for ref in builtin_skills()):
                raise SkillError(
                    f"{manifest.name}@{version} is a built-in skill, and a pin must name one package: give yours "
                    f'another version in SKILL.md (metadata: switchboard.version: "{version}-local", say) or '
                    "another name"
                )
            existing = next((e for e in same if e.version == version), None)
            if existing is not None:
                if existing.sha256 != digest:
                    raise SkillError(
                        f"{manifest.name}@{version} is installed with other content (sha256 {existing.sha256[:12]}…):"
                        " raise metadata.version in SKILL.md, or remove that version first"
                    )
                return existing, False
            entry = IndexEntry(
                name=manifest.name,
                version=version,
                sha256=digest,
                description=manifest.description,
                source=source,
                origin=origin,
                added_at=time.time(),
                seq=max((e.seq for e in index.skills), default=0) + 1,
            )
            self._place(package.files, self.path(entry))
            index.skills.append(entry)
            self._write(index)
            return entry, True

    @staticmethod
    def _version(manifest: SkillManifest, digest: str, same: Sequence[IndexEntry]) -> str:
        if manifest.declared_version is not None:
            return manifest.declared_version
        for entry in same:  # the same content again: that version
            if entry.sha256 == digest:
                return entry.version
        taken = [e.version for e in same] + [ref.version for ref in builtin_skills() if ref.name == manifest.name]
        return str(max((int(v) for v in taken if v.isdigit()), default=0) + 1)

    def _place(self, files: dict[str, bytes], target: Path) -> None:
        staging = self.root / f".staging-{secrets.token_hex(6)}"
        try:
            for relative, data in files.items():
                path = staging / relative
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                path.write_bytes(data)
                path.chmod(0o444)
            staging.mkdir(exist_ok=True, mode=0o700)
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if target.exists():  # left by an add interrupted before the index was written
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)

    def remove(self, name: str, version: str | None = None) -> list[IndexEntry]:
        """Uninstall ``name@version`` (``None``: every version of ``name``); returns what was removed.

        Raises:
            SkillError: nothing of that name (and version) is installed.
        """
        with self._locked():
            index = self._read()
            gone = [e for e in index.skills if e.name == name and version in (None, e.version)]
            if not gone:
                raise SkillError(f"{name}{'@' + version if version else ''} is not installed (see `skills list`)")
            index.skills = [e for e in index.skills if e not in gone]
            self._write(index)
            for entry in gone:
                shutil.rmtree(self.path(entry), ignore_errors=True)
            with contextlib.suppress(OSError):
                (self.root / name).rmdir()
            return gone


class SkillLibrary:
    """Every skill an agent may name: the operator's store first, then the built-ins."""

    def __init__(self, store: SkillStore | None = None) -> None:
        self.store = store

    def resolve(self, pin: str) -> SkillRef:
        """The one package ``pin`` names (:class:`~switchboard.skills.package.Pin`).

        ``name`` alone is the latest added version, else the built-in; with a source only, the latest of that
        source. Otherwise the version, source and hash given must match exactly one package.

        Raises:
            SkillError: a malformed pin, no such skill or version, or a pin that names two packages (the message
                gives the pins that name each).
        """
        wanted = Pin.parse(pin)
        if problems := name_problems(wanted.name):
            raise SkillError(f"skill {pin!r}: {problems[0]}")
        found = self._candidates(wanted)
        if wanted.version is None and wanted.sha256 is None:  # the latest installed, else the built-in
            installed = [ref for ref in found if ref.source != "builtin"]
            found = installed[-1:] or found[:1]
        if not found:
            raise SkillError(f"no skill {pin!r} (installed and built-in: {', '.join(self.names()) or 'none'})")
        if len(found) > 1:
            exact = ", ".join(_exact(ref) for ref in found)
            raise SkillError(f"skill {pin!r} names two packages; pin one of them: {exact}")
        return found[0]

    def _candidates(self, wanted: Pin) -> list[SkillRef]:
        """The packages matching ``wanted``: installed ones in the order they were added, then the built-ins."""
        found: list[SkillRef] = []
        if self.store is not None and wanted.source != "builtin":
            for entry in self.store.entries():
                if entry.name == wanted.name and wanted.version in (None, entry.version):
                    found.append(_ref(entry, self.store.path(entry)))
        if wanted.source != "installed":
            found += [
                ref for ref in builtin_skills() if ref.name == wanted.name and wanted.version in (None, ref.version)
            ]
        if wanted.sha256 is not None:
            found = [ref for ref in found if ref.sha256.startswith(wanted.sha256)]
        return found

    def names(self) -> list[str]:
        """Every skill name available, sorted."""
        installed = {e.name for e in self.store.entries()} if self.store is not None else set()
        return sorted(installed | {ref.name for ref in builtin_skills()})

    def resolve_all(self, pins: Sequence[str]) -> tuple[list[SkillRef], list[str]]:
        """The packages of an agent's ``skills`` list, in its order, and the problems of those that did not resolve."""
        found: list[SkillRef] = []
        problems: list[str] = []
        for pin in pins:
            try:
                ref = self.resolve(pin)
            except SkillError as err:
                problems.append(str(err))
                continue
            if all(r.name != ref.name for r in found):
                found.append(ref)
        return found, problems
