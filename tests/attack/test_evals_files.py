"""Hostile scenario, variant and baseline files for ``switchboard eval run``: a clear error naming the file, no hang."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from switchboard.cli.evals import eval_command, parse_variant
from switchboard.core.agent.config import Agent
from switchboard.errors import ConfigError
from switchboard.evals.runner import run_scenario
from switchboard.evals.scenario import Scenario, load_scenarios

_GOOD = """\
id: fine
version: "1"
messages: [hi]
invariants: [{check: answer_contains, text: x}]
"""


def _bomb(levels: int) -> str:
    """A "billion laughs" document: each level 9 aliases of the one before, inside a field typed ``Any``."""
    lines = ['    l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for n in range(1, levels):
        lines.append(f"    l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]")
    return _GOOD + "state:\n  slots:\n" + "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_when_the_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(9))  # 9**9 strings once expanded: gigabytes in the session store
    with pytest.raises(ConfigError, match=r"bomb\.yaml") as caught:
        load_scenarios(path)
    assert "aliases" in str(caught.value)


def test_a_few_aliases_still_load(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text(_bomb(2))
    assert load_scenarios(path)[0].state.slots["l1"] == [["lol"] * 9] * 9


def test_deeply_nested_yaml_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(_GOOD + "description: " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(ConfigError, match=r"deep\.yaml"):
        load_scenarios(path)


def test_a_huge_scenario_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text(_GOOD + "description: " + "x" * (17 * 1024 * 1024) + "\n")
    with pytest.raises(ConfigError, match=r"huge\.yaml.*too large"):
        load_scenarios(path)


def test_an_alias_bomb_in_a_variant_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "variant.yaml"
    path.write_text(_bomb(9).replace(_GOOD, ""))
    with pytest.raises(ConfigError, match=r"variant\.yaml.*aliases"):
        parse_variant(f"v={path}")


@pytest.mark.parametrize("content", ["[" * 200_000 + "]" * 200_000, '{"results": ' + "[" * 200_000])
def test_a_malformed_deep_baseline_is_a_clear_error_and_nothing_runs(tmp_path: Path, content: str) -> None:
    scenario, baseline, out = tmp_path / "s.yaml", tmp_path / "base.json", tmp_path / "out.json"
    scenario.write_text(_GOOD)
    baseline.write_text(content)
    with pytest.raises(ConfigError, match=r"base\.json"):
        eval_command([scenario], json_out=out, baseline=baseline, out=io.StringIO())
    assert not out.exists()


def test_a_huge_baseline_is_refused_unread(tmp_path: Path) -> None:
    scenario, baseline = tmp_path / "s.yaml", tmp_path / "base.json"
    scenario.write_text(_GOOD)
    baseline.write_text('{"results": [], "pad": "' + "x" * (65 * 1024 * 1024) + '"}')
    with pytest.raises(ConfigError, match=r"base\.json.*too large"):
        eval_command([scenario], baseline=baseline, out=io.StringIO())


@pytest.mark.parametrize("path", ["a\x00b.txt", "../up.txt", "/etc/passwd", "a/../../b", ".", "", "x" * 300])
def test_a_workspace_path_that_cannot_be_a_file_inside_is_refused_when_the_file_loads(
    tmp_path: Path, path: str
) -> None:
    scenario = tmp_path / "files.yaml"
    scenario.write_text(_GOOD + "state:\n  files:\n    " + json.dumps(path) + ": text\n")
    with pytest.raises(ConfigError, match=r"files\.yaml.*state\.files"):
        load_scenarios(scenario)


def test_a_variant_that_breaks_a_configured_agent_is_a_clear_error_and_nothing_is_written(tmp_path: Path) -> None:
    scenario, overrides, out = tmp_path / "s.yaml", tmp_path / "empty-classes.yaml", tmp_path / "out.json"
    scenario.write_text(_GOOD + "agent: {configured: classy}\n")
    overrides.write_text("task_classes: {}\n")  # valid for a blank agent, not for one that classifies by model
    classy = Agent.model_validate(
        {"name": "classy", "task_classifier": "model", "task_classes": {"default": {"description": "anything"}}}
    )
    variant = parse_variant(f"bare={overrides}")
    with pytest.raises(ConfigError, match=r"--variant bare.*classy.*task_classes"):
        eval_command([scenario], json_out=out, agents={"classy": classy}, variants=[variant], out=io.StringIO())
    assert not out.exists()


def test_a_scenario_naming_no_configured_agent_is_a_clear_error_and_nothing_is_written(tmp_path: Path) -> None:
    scenario, out = tmp_path / "s.yaml", tmp_path / "out.json"
    scenario.write_text(_GOOD + "agent: {configured: nobody}\n")
    with pytest.raises(ConfigError, match=r"scenario fine.*nobody"):
        eval_command([scenario], json_out=out, agents={}, out=io.StringIO())
    assert not out.exists()


async def test_seeded_tables_and_columns_named_like_sql_keywords_are_seeded_and_read() -> None:
    table = {"columns": ["select", "from"], "rows": [{"select": "shipped", "from": "paris"}], "tenant_column": "group"}
    query = {"tool": "table_query", "arguments": {"table": "order", "columns": ["select", "from"]}}
    seeded = Scenario.model_validate(
        {
            "id": "keywords",
            "version": "1",
            "messages": ["where is it?"],
            "state": {"tables": {"order": table}},
            "agent": {"tools": []},
            "model": [{"calls": [query]}, {"answer": "Shipped from Paris."}],
            "invariants": [{"check": "tool_used", "tool": "table_query"}],
        }
    )
    result = await run_scenario(seeded)
    assert result.error is None, result.error
    assert result.trajectory is not None
    (call,) = result.trajectory.calls
    assert call.ok is True and "paris" in str(call.result)
