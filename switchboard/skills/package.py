"""One skill package: the ``SKILL.md`` front matter of the agentskills.io format, validated as its spec says.

The front matter has exactly the spec's fields (:class:`SkillManifest`); Switchboard's own keys live under
``metadata`` (``switchboard.version``), so the file stays valid for every other client. Any other field is refused,
as ``skills-ref validate`` does, and every scalar is read as a string, as the reference parser reads it.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from switchboard.errors import SwitchboardError

__all__ = [
    "ALLOWED_FIELDS",
    "MAX_COMPATIBILITY_CHARS",
    "MAX_DESCRIPTION_CHARS",
    "MAX_NAME_CHARS",
    "PIN_SOURCES",
    "SKILL_FILE",
    "Pin",
    "SkillError",
    "SkillManifest",
    "SkillRef",
    "SkillSource",
    "check_pins",
    "content_sha256",
    "manifest_problems",
    "name_problems",
    "parse_skill_md",
    "read_manifest",
    "version_problem",
]

SKILL_FILE = "SKILL.md"
MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
MAX_COMPATIBILITY_CHARS = 500
MAX_SKILL_MD_BYTES = 256 * 1024
"""A ``SKILL.md`` larger than this is refused (the spec recommends under 500 lines)."""
ALLOWED_FIELDS = frozenset({"name", "description", "license", "compatibility", "metadata", "allowed-tools"})
VERSION_KEYS = ("switchboard.version", "version")
"""Metadata keys a package's version is read from, first found wins; without one the store counts versions."""
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,31}")

SkillSource = Literal["builtin", "template", "local"]
"""Where a package came from: shipped with Switchboard, a shipped template the operator installed, or their own."""
PinSource = Literal["builtin", "installed"]
PIN_SOURCES: tuple[PinSource, ...] = ("builtin", "installed")
"""What a pin's ``SOURCE:`` prefix may say: a built-in package, or one in the operator's store."""
_HASH = re.compile(r"[0-9a-f]{12,64}")


class SkillError(SwitchboardError):
    """A skill package is invalid, unsafe, or not installed; the message says what and how to fix it."""


@dataclass(frozen=True, slots=True)
class SkillManifest:
    """The validated front matter of one ``SKILL.md``, and its body.

    A skill is a folder holding ``SKILL.md`` (YAML front matter between ``---`` lines, then Markdown instructions)
    and, by convention, ``scripts/``, ``references/`` and ``assets/``. The front matter has exactly the spec's fields:

    - ``name`` (required): 1–64 characters, lowercase letters, digits and hyphens, no leading, trailing or doubled
      hyphen, equal to the folder's name (compared after NFKC normalisation, like the reference validator);
    - ``description`` (required): 1–1024 characters, what the skill does and when to use it;
    - ``license``, ``compatibility`` (1–500 characters), ``allowed-tools`` (space-separated, or a YAML list);
    - ``metadata``: a map of string to string. Switchboard's own keys live here under ``switchboard.``
      (``switchboard.version``), so the file stays valid for every other client.

    Any other top-level field is refused, as ``skills-ref validate`` does. The YAML is read with every scalar as a
    string (``version: 1.10`` stays ``"1.10"``), which is how the reference parser (strictyaml) reads it too.
    """

    name: str
    description: str
    body: str
    license: str | None = None
    compatibility: str | None = None
    allowed_tools: tuple[str, ...] = ()
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def declared_version(self) -> str | None:
        """The version the package declares in ``metadata`` (``switchboard.version``, else ``version``)."""
        return next((self.metadata[k] for k in VERSION_KEYS if k in self.metadata), None)


@dataclass(frozen=True, slots=True)
class SkillRef:
    """One installed version of a skill, as an agent's context and the event log name it."""

    name: str
    version: str
    sha256: str
    """Hash of the package's content (:func:`content_sha256`)."""
    description: str
    source: SkillSource
    path: Path
    """The package's folder (read-only: ``use_skill`` copies it into the session workspace)."""

    @property
    def pin(self) -> str:
        """``name@version``."""
        return f"{self.name}@{self.version}"


def name_problems(name: object, folder: str | None = None) -> list[str]:
    """What is wrong with a skill name by the spec (empty: valid); ``folder``: the folder it must equal."""
    if not isinstance(name, str) or not name.strip():
        return ["field 'name' must be a non-empty string"]
    name = unicodedata.normalize("NFKC", name.strip())
    found = []
    if len(name) > MAX_NAME_CHARS:
        found.append(f"skill name {name!r} is {len(name)} characters long (at most {MAX_NAME_CHARS})")
    if name != name.lower():
        found.append(f"skill name {name!r} must be lowercase")
    if name.startswith("-") or name.endswith("-"):
        found.append(f"skill name {name!r} must not start or end with a hyphen")
    if "--" in name:
        found.append(f"skill name {name!r} must not contain consecutive hyphens")
    if not all(c.isalnum() or c == "-" for c in name):
        found.append(f"skill name {name!r} may hold only lowercase letters, digits and hyphens")
    if folder is not None and unicodedata.normalize("NFKC", folder) != name:
        found.append(f"skill name {name!r} must equal its folder's name {folder!r}")
    return found


def version_problem(version: str) -> str | None:
    """What is wrong with a version string (``None``: usable as a folder name and in ``name@version``)."""
    if _VERSION.fullmatch(version) and ".." not in version:
        return None
    return (
        f"version {version!r} must be 1-32 characters of letters, digits, '.', '+', '_' and '-', starting with a "
        "letter or digit"
    )


@dataclass(frozen=True, slots=True)
class Pin:
    """What an agent's ``skills`` entry names: ``[SOURCE:]NAME[@VERSION][#SHA256]``.

    ``NAME`` alone means the latest added version (else the built-in); ``NAME@VERSION`` must name exactly one
    package, and where an installed package and a built-in share it, the source (``builtin:``, ``installed:``) or
    the content hash (``#`` and at least 12 hex digits of it, as ``skills list`` shows) says which.
    """

    name: str
    version: str | None = None
    source: PinSource | None = None
    sha256: str | None = None
    """A prefix of the package's content hash (lowercase hex)."""

    @classmethod
    def parse(cls, pin: str) -> Pin:
        """Read a pin.

        Raises:
            SkillError: a malformed pin, saying what is wrong.
        """
        rest, hashed, digest = pin.partition("#")
        source: PinSource | None = None
        prefix, colon, tail = rest.partition(":")
        if colon:
            if prefix not in PIN_SOURCES:
                raise SkillError(f"skill {pin!r}: the part before ':' must be {' or '.join(PIN_SOURCES)}")
            source, rest = ("builtin" if prefix == "builtin" else "installed"), tail
        name, at, version = rest.partition("@")
        problems = name_problems(name) + ([problem] if version and (problem := version_problem(version)) else [])
        if at and not version:
            problems.append("give a version after @")
        if hashed and not _HASH.fullmatch(digest):
            problems.append("give 12 to 64 lowercase hex digits of the package's sha256 after #")
        if problems:
            raise SkillError(f"skill {pin!r}: {'; '.join(problems)}")
        return cls(name, version or None, source, digest or None)

    def __str__(self) -> str:
        text = f"{self.source + ':' if self.source else ''}{self.name}"
        return text + (f"@{self.version}" if self.version else "") + (f"#{self.sha256}" if self.sha256 else "")


def check_pins(pins: list[str]) -> list[str]:
    """An agent's ``skills`` list, each a :class:`Pin` (``name``, ``name@version``, qualified), unchanged if valid.

    Raises:
        ValueError: a name breaks the spec's rules, or a version or qualifier is malformed (pydantic reports it on
            the field).
    """
    for pin in pins:
        try:
            Pin.parse(pin)
        except SkillError as err:
            raise ValueError(str(err)) from None
    return pins


def _front_matter(text: str) -> tuple[str, str]:
    """The YAML between the opening and closing ``---`` lines, and the body after them."""
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        raise SkillError("SKILL.md must start with YAML front matter: a first line of `---`")
    for index, line in enumerate(lines[1:], start=1):
        if line.strip() == "---":
            return "\n".join(lines[1:index]), "\n".join(lines[index + 1 :]).strip()
    raise SkillError("SKILL.md front matter is not closed: add a line of `---` after it")


def _text(data: dict[str, Any], key: str, limit: int | None, found: list[str]) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        found.append(f"field {key!r} must be a non-empty string")
        return None
    if limit is not None and len(value) > limit:
        found.append(f"field {key!r} is {len(value)} characters long (at most {limit})")
    return value.strip()


def manifest_problems(data: object, folder: str | None = None) -> list[str]:
    """Every way parsed front matter breaks the spec (empty: valid)."""
    if not isinstance(data, dict):
        return ["SKILL.md front matter must be a YAML mapping of fields"]
    found: list[str] = []
    extra = sorted(str(k) for k in data if k not in ALLOWED_FIELDS)
    if extra:
        allowed = ", ".join(sorted(ALLOWED_FIELDS))
        found.append(
            f"unexpected front matter field(s) {', '.join(extra)}: the spec allows only {allowed} (put your own keys "
            'under `metadata`, e.g. `metadata: {switchboard.version: "2"}`)'
        )
    if "name" not in data:
        found.append("missing required field 'name'")
    else:
        found += name_problems(data["name"], folder)
    if "description" not in data:
        found.append("missing required field 'description'")
    else:
        _text(data, "description", MAX_DESCRIPTION_CHARS, found)
    if "compatibility" in data:
        if data["compatibility"] is None:
            found.append("field 'compatibility' must be a non-empty string")
        _text(data, "compatibility", MAX_COMPATIBILITY_CHARS, found)
    if "license" in data and data["license"] is not None:
        _text(data, "license", None, found)
    tools = data.get("allowed-tools")
    if tools is not None and not (
        isinstance(tools, str) or (isinstance(tools, list) and all(isinstance(t, str) for t in tools))
    ):
        found.append("field 'allowed-tools' must be a space-separated string or a list of strings")
    metadata = data.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            found.append("field 'metadata' must be a map of string keys to string values")
        else:
            found += [
                f"metadata {key!r} must be a string value (metadata is a map of strings)"
                for key, value in metadata.items()
                if not isinstance(value, str)
            ]
            version = next((metadata[k] for k in VERSION_KEYS if isinstance(metadata.get(k), str)), None)
            if version is not None and (problem := version_problem(version)):
                found.append(f"metadata: {problem}")
    return found


def parse_skill_md(text: str, folder: str | None = None) -> SkillManifest:
    """Parse and validate a ``SKILL.md``; ``folder`` is the name of the folder holding it.

    Raises:
        SkillError: the file is not valid by the spec; the message lists every problem.
    """
    raw, body = _front_matter(text)
    try:
        data = yaml.load(raw, Loader=yaml.BaseLoader)  # noqa: S506 - BaseLoader builds only str, list and dict
    except yaml.YAMLError as err:
        raise SkillError(f"SKILL.md front matter is not valid YAML: {err}") from None
    problems = manifest_problems(data, folder)
    if problems:
        raise SkillError("invalid SKILL.md: " + "; ".join(problems))
    tools = data.get("allowed-tools") or ()
    return SkillManifest(
        name=unicodedata.normalize("NFKC", data["name"].strip()),
        description=data["description"].strip(),
        body=body,
        license=(data.get("license") or "").strip() or None,
        compatibility=(data.get("compatibility") or "").strip() or None,
        allowed_tools=tuple(tools.split() if isinstance(tools, str) else tools),
        metadata=dict(data.get("metadata") or {}),
    )


def content_sha256(files: dict[str, bytes]) -> str:
    """The package's content hash: sha256 over each file's relative path and the sha256 of its bytes, sorted.

    The same files give the same hash whether they came from a folder or a zip, whatever their order or times.
    """
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(f"{path}\0{hashlib.sha256(files[path]).hexdigest()}\n".encode())
    return digest.hexdigest()


def read_manifest(files: dict[str, bytes], folder: str | None) -> SkillManifest:
    """The validated ``SKILL.md`` among a package's ``files`` (relative path → bytes); ``folder``: its folder name.

    Raises:
        SkillError: no ``SKILL.md`` at the package's root, too large, not UTF-8, or invalid.
    """
    raw = files.get(SKILL_FILE)
    if raw is None:
        raise SkillError(f"no {SKILL_FILE} at the package's root (a skill is a folder with a SKILL.md file)")
    if len(raw) > MAX_SKILL_MD_BYTES:
        raise SkillError(f"{SKILL_FILE} is larger than {MAX_SKILL_MD_BYTES} bytes")
    try:
        return parse_skill_md(raw.decode("utf-8"), folder)
    except UnicodeDecodeError:
        raise SkillError(f"{SKILL_FILE} is not UTF-8 text") from None
