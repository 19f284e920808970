"""SKILL.md validation, case by case against the agentskills.io specification and its reference validator."""

from __future__ import annotations

import pytest

from switchboard.skills.package import SkillError, check_pins, content_sha256, parse_skill_md
from tests.skills.helpers import DESCRIPTION, skill_md


def test_a_minimal_skill_md_parses() -> None:
    manifest = parse_skill_md(skill_md("word-count"), "word-count")
    assert (manifest.name, manifest.description) == ("word-count", DESCRIPTION)
    assert manifest.body == "# Word count\n\nRun scripts/count.py."
    assert manifest.metadata == {} and manifest.declared_version is None


def test_every_optional_field_of_the_spec_is_read() -> None:
    text = (
        "---\nname: pdf-processing\ndescription: Extract PDF text. Use when handling PDFs.\nlicense: Apache-2.0\n"
        "compatibility: Requires python3 and pypdf\nallowed-tools: Bash(git:*) Read\n"
        'metadata:\n  author: example-org\n  version: 1.10\n  switchboard.version: "2.0"\n---\nBody\n'
    )
    manifest = parse_skill_md(text, "pdf-processing")
    assert manifest.license == "Apache-2.0" and manifest.compatibility == "Requires python3 and pypdf"
    assert manifest.allowed_tools == ("Bash(git:*)", "Read")
    assert manifest.metadata == {"author": "example-org", "version": "1.10", "switchboard.version": "2.0"}
    assert manifest.declared_version == "2.0", "our own key wins over the generic one"
    listed = parse_skill_md("---\nname: a\ndescription: d\nallowed-tools: [Read, Write]\n---\n", "a")
    assert listed.allowed_tools == ("Read", "Write")


def test_unicode_lowercase_names_are_valid_as_in_the_reference_validator() -> None:
    assert parse_skill_md(skill_md("données-2"), "données-2").name == "données-2"


BAD = [
    ("---\ndescription: x\n---\n", "missing required field 'name'"),
    ("---\nname: a\n---\n", "missing required field 'description'"),
    (skill_md("PDF-Processing"), "must be lowercase"),
    (skill_md("-pdf"), "must not start or end with a hyphen"),
    (skill_md("pdf-"), "must not start or end with a hyphen"),
    (skill_md("pdf--processing"), "must not contain consecutive hyphens"),
    (skill_md("pdf_processing"), "may hold only lowercase letters, digits and hyphens"),
    (skill_md("a" * 65), "65 characters long (at most 64)"),
    (skill_md("ok", description="x" * 1025), "'description' is 1025 characters long (at most 1024)"),
    (skill_md("ok", description="   "), "'description' must be a non-empty string"),
    (skill_md("ok", compatibility="y" * 501), "'compatibility' is 501 characters long (at most 500)"),
    (skill_md("ok", compatibility=""), "'compatibility' must be a non-empty string"),
    (skill_md("ok", version="1"), "unexpected front matter field(s) version"),
    (
        skill_md("ok", **{"disable-model-invocation": "true"}),
        "unexpected front matter field(s) disable-model-invocation",
    ),
    (skill_md("ok", metadata="v1"), "'metadata' must be a map"),
    (skill_md("ok", metadata={"switchboard": {"version": "2"}}), "metadata 'switchboard' must be a string value"),
    (skill_md("ok", metadata={"switchboard.version": "../../x"}), "version '../../x' must be"),
    ("name: ok\ndescription: d\n", "must start with YAML front matter"),
    ("---\nname: ok\ndescription: d\n", "front matter is not closed"),
    ("---\nname: [ok\n---\n", "not valid YAML"),
    ("---\n- a\n- b\n---\n", "must be a YAML mapping"),
]


@pytest.mark.parametrize(("text", "expected"), BAD, ids=[e for _, e in BAD])
def test_invalid_front_matter_is_refused_with_a_clear_error(text: str, expected: str) -> None:
    with pytest.raises(SkillError) as caught:
        parse_skill_md(text, "ok")
    assert expected in str(caught.value)


def test_the_name_must_equal_its_folder() -> None:
    with pytest.raises(SkillError, match="must equal its folder's name 'other'"):
        parse_skill_md(skill_md("word-count"), "other")


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(SkillError) as caught:
        parse_skill_md("---\nname: Bad--Name\nextra: 1\n---\n", "x")
    message = str(caught.value)
    assert "unexpected front matter field(s) extra" in message and "missing required field 'description'" in message
    assert "must be lowercase" in message and "consecutive hyphens" in message


def test_agent_skill_pins_are_checked_by_the_same_rules() -> None:
    assert check_pins(["xlsx-report", "pdf-report@1.2"]) == ["xlsx-report", "pdf-report@1.2"]
    for bad in (["Bad"], ["x@"], ["x@../1"], ["a--b"]):
        with pytest.raises(ValueError, match="skill"):
            check_pins(bad)


def test_the_content_hash_depends_on_paths_and_bytes_only() -> None:
    one = {"SKILL.md": b"a", "scripts/x.py": b"b"}
    assert content_sha256(one) == content_sha256(dict(reversed(one.items())))
    assert content_sha256(one) != content_sha256({"SKILL.md": b"a", "scripts/y.py": b"b"})
    assert content_sha256(one) != content_sha256({"SKILL.md": b"a", "scripts/x.py": b"c"})
