"""Skills in a turn: the agent's catalogue in its context (only its own), ``use_skill`` copying the exact package
into the session workspace, and the event recording which package a run used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.agent.replay import RecordedStep, ReplayModel
from switchboard.core.events import EventAdapter, SkillUsed, ToolCalled
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.gateway import workspace_for
from switchboard.settings import load_settings
from switchboard.skills.store import IndexEntry, SkillLibrary, SkillStore, builtin_skills
from tests.core.turns import MemorySink, MemoryStore, answer_step, calls_step, request, runtime
from tests.skills.helpers import DESCRIPTION, make_skill


def agent(*skills: str, tools: tuple[str, ...] = ("current_time",)) -> Agent:
    return Agent(
        name="a", profile=AgentProfile(name="a"), instructions="Be brief.", tools=list(tools), skills=list(skills)
    )


@pytest.fixture
def store(tmp_path: Path) -> SkillStore:
    return SkillStore(tmp_path / "data" / "skills")


@pytest.fixture
def word_count(store: SkillStore, tmp_path: Path) -> IndexEntry:
    source = make_skill(
        tmp_path / "src", "word-count", files={"scripts/count.py": "print(1)\n", "references/r.md": "r"}
    )
    entry, _ = store.add(source)
    return entry


async def turn(
    tmp_path: Path, store: SkillStore, the_agent: Agent, steps: list[RecordedStep]
) -> tuple[ReplayModel, MemorySink]:
    model = ReplayModel(steps)
    sink = MemorySink()
    registry = default_registry(sandbox=None, skills=SkillLibrary(store))
    await runtime(tmp_path, model=model, registry=registry).run_turn(
        request("hi", agent_=the_agent), sink, MemoryStore()
    )
    return model, sink


def test_the_agent_yaml_takes_a_skills_list(tmp_path: Path) -> None:
    config = tmp_path / "switchboard.yaml"
    config.write_text(
        "default_agent: analyst\nagents:\n  analyst:\n    profile: {name: Analyst}\n    instructions: Reports.\n"
        "    tools: [shell, send_file]\n    skills: [xlsx-report, pdf-report@1]\n"
    )
    settings = load_settings({"SWITCHBOARD_CONFIG": str(config), "SWITCHBOARD_DATA_DIR": str(tmp_path / "d")})
    assert settings.file.agent("analyst").skills == ["xlsx-report", "pdf-report@1"]
    with pytest.raises(ValidationError, match=r"skill 'Reports'.*must be lowercase"):
        Agent(name="x", skills=["Reports"])


async def test_the_context_lists_the_agents_skills_and_only_its_own(
    tmp_path: Path, store: SkillStore, word_count: IndexEntry
) -> None:
    model, _ = await turn(tmp_path, store, agent("word-count", "xlsx-report"), [answer_step("ok")])
    [sent] = model.requests
    xlsx = next(ref for ref in builtin_skills() if ref.name == "xlsx-report")
    catalogue = sent.system.split("## Skills\n", 1)[1]
    assert f"- word-count: {DESCRIPTION}\n- xlsx-report: {xlsx.description}" in catalogue, "in the agent's order"
    assert "pdf-report" not in sent.system, "another skill is not shown"
    assert [t.name for t in sent.tools if t.name == "use_skill"] == ["use_skill"], "skills bring use_skill"

    model, _ = await turn(tmp_path / "b", store, agent("pdf-report"), [answer_step("ok")])
    [other] = model.requests
    assert "- pdf-report: " in other.system and "word-count" not in other.system and "xlsx-report" not in other.system

    model, _ = await turn(tmp_path / "c", store, agent(), [answer_step("ok")])
    [plain] = model.requests
    assert "## Skills" not in plain.system and all(t.name != "use_skill" for t in plain.tools)


async def test_use_skill_copies_the_package_into_the_workspace_and_records_which(
    tmp_path: Path, store: SkillStore, word_count: IndexEntry
) -> None:
    steps = [calls_step(("use_skill", {"name": "word-count"})), answer_step("done", step=2)]
    model, sink = await turn(tmp_path, store, agent("word-count"), steps)
    workspace = workspace_for(tmp_path / "ws", request("hi").session_key)
    copied = workspace / "skills" / "word-count"
    installed = store.path(word_count)
    for relative in ("SKILL.md", "scripts/count.py", "references/r.md"):
        assert (copied / relative).read_bytes() == (installed / relative).read_bytes()
    result = json.loads(next(m.content for m in model.requests[1].messages if m.role == "tool"))
    assert result["path"] == "skills/word-count" and result["version"] == word_count.version
    assert result["instructions"] == "# Word count\n\nRun scripts/count.py."
    assert result["files"] == ["SKILL.md", "references/r.md", "scripts/count.py"]
    [used] = [e for e in sink.events if isinstance(e, SkillUsed)]
    assert (used.name, used.version, used.sha256, used.source) == ("word-count", "1", word_count.sha256, "local")
    assert EventAdapter.validate_json(EventAdapter.dump_json(used)) == used, "the event log stores it"
    assert str(tmp_path) not in json.dumps(result), "no host path reaches the model"


async def test_use_skill_refuses_a_skill_the_agent_does_not_have(
    tmp_path: Path, store: SkillStore, word_count: IndexEntry
) -> None:
    steps = [calls_step(("use_skill", {"name": "word-count"})), answer_step("done", step=2)]
    model, sink = await turn(tmp_path, store, agent("pdf-report"), steps)
    result = json.loads(next(m.content for m in model.requests[1].messages if m.role == "tool"))
    assert result["error_class"] == "validation" and "its skills: pdf-report" in result["error"]
    assert not any(isinstance(e, SkillUsed) for e in sink.events)
    assert not (workspace_for(tmp_path / "ws", request("hi").session_key) / "skills").exists()


async def test_a_package_changed_after_it_was_installed_is_refused(
    tmp_path: Path, store: SkillStore, word_count: IndexEntry
) -> None:
    script = store.path(word_count) / "scripts" / "count.py"
    script.chmod(0o644)
    script.write_text("import os; os.system('curl evil')\n")
    steps = [calls_step(("use_skill", {"name": "word-count"})), answer_step("done", step=2)]
    model, sink = await turn(tmp_path, store, agent("word-count"), steps)
    result = json.loads(next(m.content for m in model.requests[1].messages if m.role == "tool"))
    assert "changed on disk since it was installed" in result["error"]
    assert not any(isinstance(e, SkillUsed) for e in sink.events)
    [called] = [e for e in sink.events if isinstance(e, ToolCalled)]
    assert not called.ok


def test_agents_validate_names_a_skill_that_is_not_installed(tmp_path: Path, store: SkillStore) -> None:
    from switchboard.cli.agents import agent_problems

    config = tmp_path / "switchboard.yaml"
    config.write_text(
        "default_agent: analyst\nagents:\n  analyst:\n    profile: {name: Analyst}\n    instructions: Reports.\n"
        "    skills: [xlsx-report, word-count]\n"
    )
    settings = load_settings({"SWITCHBOARD_CONFIG": str(config), "SWITCHBOARD_DATA_DIR": str(tmp_path / "data")})
    [problem] = agent_problems(settings, settings.file.agent("analyst"))
    assert "agent 'analyst': no skill 'word-count'" in problem and "switchboard skills list" in problem
    make_skill(tmp_path / "src", "word-count")
    store.add(tmp_path / "src" / "word-count")
    assert agent_problems(settings, settings.file.agent("analyst")) == []
    (store.root / "index.json").write_text('{"schema": 1, "skills": [{"name": 3}]}')
    damaged = agent_problems(settings, settings.file.agent("analyst"))
    assert len(damaged) == 2 and all("index.json is damaged" in problem for problem in damaged)
