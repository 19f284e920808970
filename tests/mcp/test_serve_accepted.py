"""Accepted draft agents in ``agents.d/<tenant>/``: written once, read with the YAML file, owned by their tenant."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard.channels.registry import Route
from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.errors import ConfigError
from switchboard.settings import load_file
from switchboard.settings.accepted import write_accepted
from switchboard.web.mcpserve.service import tenant_agents
from tests.mcp.serving import CONFIG


def scout() -> Agent:
    return Agent(name="scout", profile=AgentProfile(name="Scout"), instructions="You scout.", tools=[])


def routes() -> dict[tuple[str, str], Route]:
    return {
        ("web", "default"): Route("assistant", "default", "sequential"),
        ("telegram", "default"): Route("rival", "other", "sequential"),
    }


def test_an_accepted_agent_is_read_with_the_file_and_belongs_to_its_tenant(tmp_path: Path) -> None:
    config = tmp_path / "switchboard.yaml"
    config.write_text(CONFIG)
    assert "scout" not in tenant_agents(load_file(config), routes(), "default")
    path = write_accepted(config, "other", scout())
    assert path == tmp_path / "agents.d" / "other" / "scout.yaml"
    with pytest.raises(ValueError, match="exists already"):
        write_accepted(config, "other", scout())  # never overwritten
    loaded = load_file(config)
    assert loaded.agents["scout"].status == "ready" and loaded.agent_tenant("scout") == "other"
    assert loaded.agent_tenant("helper") is None
    assert "scout" in tenant_agents(loaded, routes(), "other")
    assert "scout" not in tenant_agents(loaded, routes(), "default")
    assert tenant_agents(loaded, routes(), "default") == ["assistant", "helper"]


@pytest.mark.parametrize(
    ("name", "body", "message"),
    [
        ("helper", "profile: {name: H}\ninstructions: x\n", "also defined"),
        ("broken", "profile: [\n", "not a valid accepted agent"),
        ("odd", "profile: {name: O}\ninstructions: x\nunknown_field: 1\n", "not a valid accepted agent"),
        ("listed", "- a\n- b\n", "not a valid accepted agent"),
    ],
)
def test_a_bad_accepted_agent_stops_the_load_with_its_file_named(
    tmp_path: Path, name: str, body: str, message: str
) -> None:
    config = tmp_path / "switchboard.yaml"
    config.write_text(CONFIG)
    folder = tmp_path / "agents.d" / "default"
    folder.mkdir(parents=True)
    (folder / f"{name}.yaml").write_text(body)
    with pytest.raises(ConfigError, match=message) as caught:
        load_file(config)
    assert f"{name}.yaml" in str(caught.value)


def test_a_name_that_cannot_be_a_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be"):
        write_accepted(tmp_path / "switchboard.yaml", "../etc", scout())
