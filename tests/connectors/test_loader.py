"""The connector loader: packs switched on in the YAML file become REST tools, egress hosts and write rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from switchboard.core.approvals.grants import agent_policy
from switchboard.core.connectors import ConnectorPack, expand_connectors, load_packs
from switchboard.core.tools.rest.tool import build_rest_tool
from switchboard.errors import ConfigError
from switchboard.settings import FileConfig, load_file, load_settings

BASE: dict[str, Any] = {
    "default_agent": "support",
    "connectors": {"tracker": {"repo": "acme/shop", "token": "TRACKER_TOKEN"}},
    "agents": {
        "support": {
            "profile": {"name": "Support"},
            "instructions": "help",
            "connectors": ["tracker"],
            "egress": {"secrets": {"TRACKER_TOKEN": {"env": "GH_TOKEN", "domains": ["api.github.com"]}}},
        }
    },
}


def _with(path: str, value: Any) -> dict[str, Any]:
    """``BASE`` with one dotted ``path`` set (``None``: removed)."""
    raw = yaml.safe_load(yaml.safe_dump(BASE))
    *parents, last = path.split(".")
    node = raw
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if value is None:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return raw


def _load(tmp_path: Path, raw: dict[str, Any], secrets: list[str] | None = None) -> FileConfig:
    path = tmp_path / "switchboard.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_file(path, secrets=secrets)


@pytest.mark.parametrize(
    ("path", "value", "field", "says"),
    [
        ("connectors.tracker.repo", None, "connectors.tracker.repo", "is missing: the tracker pack needs"),
        ("connectors.tracker.repo", "acme", "connectors.tracker.repo", "does not match"),
        ("connectors.tracker.colour", "red", "connectors.tracker.colour", "is not a setting of the tracker pack"),
        ("connectors.trakcer", {}, "connectors.trakcer", "names the connector pack 'trakcer', which does not exist"),
        ("agents.support.connectors", ["trakcer"], "agents.support.connectors.0", "which does not exist"),
        ("agents.support.connectors", "tracker", "agents.support.connectors", "is a list of connector pack names"),
        ("connectors.tracker.token", "ghp_16C7e42F292c6912E7710c838347Ae178B4a", "connectors.tracker.token", "never"),
        ("connectors.tracker.token", "Bearer abc", "connectors.tracker.token", "must name an egress secret"),
        ("connectors.tracker.approve_writes", "no", "connectors.tracker.approve_writes", "is true"),
    ],
)
def test_a_bad_connectors_block_is_refused_naming_the_field(
    tmp_path: Path, path: str, value: Any, field: str, says: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, _with(path, value))
    assert caught.value.field == field
    assert says in str(caught.value)
    assert "ghp_" not in str(caught.value)  # an inlined token is never echoed


def test_a_secret_setting_must_name_a_secret_the_agent_has(tmp_path: Path) -> None:
    raw = _with("agents.support.egress", None)
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, raw, secrets=[])
    assert caught.value.field == "connectors.tracker.token"
    assert "agents.support.egress.secrets" in str(caught.value)
    assert "SWITCHBOARD_EGRESS__SECRETS__TRACKER_TOKEN__VALUE" in str(caught.value)
    assert _load(tmp_path, raw, secrets=["tracker_token"]).agents["support"].connectors == ["tracker"]


def test_the_environment_s_secret_counts_when_settings_load(tmp_path: Path) -> None:
    path = tmp_path / "switchboard.yaml"
    path.write_text(yaml.safe_dump(_with("agents.support.egress", None)))
    env = {"SWITCHBOARD_CONFIG": str(path), "SWITCHBOARD_DATA_DIR": str(tmp_path / "data")}
    with pytest.raises(ConfigError):
        load_settings(env)
    env |= {
        "SWITCHBOARD_EGRESS__SECRETS__TRACKER_TOKEN__VALUE": "t0ken-value",
        "SWITCHBOARD_EGRESS__SECRETS__TRACKER_TOKEN__DOMAINS": "api.github.com",
    }
    assert "tracker_get_issue" in load_settings(env).file.agents["support"].tools


def test_a_switched_on_pack_becomes_tools_hosts_and_rules(tmp_path: Path) -> None:
    cfg = _load(tmp_path, BASE, secrets=[])
    agent = cfg.agents["support"]
    names = [spec.name for spec in cfg.rest_tools]
    assert names == [
        "tracker_search_issues",
        "tracker_get_issue",
        "tracker_list_comments",
        "tracker_comment",
        "tracker_open_issue",
    ]
    assert agent.tools == ["current_time", *names]
    assert agent.egress.allow == ("api.github.com",)
    spec = next(s for s in cfg.rest_tools if s.name == "tracker_get_issue")
    assert spec.url == "https://api.github.com/repos/acme/shop/issues/{number}"
    assert spec.headers["Authorization"] == "Bearer {{secret:TRACKER_TOKEN}}"


def test_an_agent_without_the_pack_gets_nothing_of_it(tmp_path: Path) -> None:
    raw = _with("agents.other", {"profile": {"name": "Other"}, "instructions": "x", "tools": ["current_time"]})
    cfg = _load(tmp_path, raw, secrets=[])
    other = cfg.agents["other"]
    assert other.tools == ["current_time"]
    assert other.egress.allow == ()
    assert other.policy.rules == []


def _decision(cfg: FileConfig, tool: str) -> str:
    spec = next(s for s in cfg.rest_tools if s.name == tool)
    policy = agent_policy(cfg.agents["support"])
    return policy.decide(build_rest_tool(spec, None), {}, actor="web:u1").label


def test_writes_wait_for_approval_by_default_and_reads_do_not(tmp_path: Path) -> None:
    cfg = _load(tmp_path, BASE, secrets=[])
    assert _decision(cfg, "tracker_comment") == "approve:connector:tracker_comment"
    assert _decision(cfg, "tracker_open_issue") == "approve:connector:tracker_open_issue"
    assert _decision(cfg, "tracker_get_issue") == "allow:default:read"


def test_the_operator_may_relax_a_pack_s_writes(tmp_path: Path) -> None:
    cfg = _load(tmp_path, _with("connectors.tracker.approve_writes", False), secrets=[])
    assert _decision(cfg, "tracker_comment") == "allow:connector:tracker_comment"


def test_the_agent_s_own_rules_come_before_the_pack_s(tmp_path: Path) -> None:
    rule = {"tool": "tracker_comment", "decide": "refuse", "reason": "read-only agent"}
    cfg = _load(tmp_path, _with("agents.support.policy", {"rules": [rule]}), secrets=[])
    assert _decision(cfg, "tracker_comment") == "refuse:agent:support#1"
    assert _decision(cfg, "tracker_open_issue") == "approve:connector:tracker_open_issue"


def test_a_name_taken_by_the_operator_s_own_tool_is_refused(tmp_path: Path) -> None:
    mine = {"name": "tracker_comment", "description": "mine", "method": "GET", "url": "https://x.example/a"}
    with pytest.raises(ConfigError, match="tracker_comment"):
        _load(tmp_path, _with("rest_tools", [mine]), secrets=[])


def test_expansion_leaves_the_parsed_file_unchanged() -> None:
    raw = yaml.safe_load(yaml.safe_dump(BASE))
    expand_connectors(raw)
    assert raw == BASE


def test_every_shipped_pack_loads_and_each_operation_states_its_classes() -> None:
    packs = load_packs()
    assert {"calendar", "email", "tracker"} <= set(packs)
    for pack in packs.values():
        for raw in pack.rest_tools:
            assert {"side_effect", "risk", "timeout_s"} <= set(raw), (pack.name, raw["name"])


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"settings": {"token": {"description": "t", "secret": True}}}, "used only as {{secret:token}}"),
        ({"settings": {}}, "names no setting of the pack"),
        ({"rest_tools": [{"name": "x", "method": "GET", "url": "https://a.example/x"}]}, "does not state"),
        ({"settings": {"approve_writes": {"description": "no"}}}, "not an operator option"),
    ],
)
def test_a_broken_pack_file_is_refused(change: dict[str, Any], says: str) -> None:
    pack = {
        "name": "demo",
        "description": "d",
        "settings": {"token": {"description": "t"}},
        "rest_tools": [
            {
                "name": "get",
                "description": "g",
                "method": "GET",
                "url": "https://a.example/x",
                "headers": {"Authorization": "Bearer {{setting:token}}"},
                "side_effect": "read",
                "risk": "low",
                "timeout_s": 5,
            }
        ],
    }
    with pytest.raises(ValueError) as caught:
        ConnectorPack.model_validate(pack | change)
    assert says in str(caught.value)


def test_each_operation_is_owned_by_its_pack(tmp_path: Path) -> None:
    cfg = _load(tmp_path, BASE, secrets=[])
    tools = [build_rest_tool(spec, None) for spec in cfg.rest_tools]
    assert {(tool.owner, tool.cost) for tool in tools} == {("connector:tracker", 1)}


MCP_PACK = ConnectorPack.model_validate(
    {
        "name": "notes",
        "description": "A notes server over MCP.",
        "settings": {
            "folder": {"description": "where notes live", "default": "/srv/notes"},
            "key": {"description": "an egress secret", "secret": True},
        },
        "mcp_server": {
            "transport": "stdio",
            "command": ["python", "-m", "notes_server", "{{setting:folder}}"],
            "env": {"NOTES_KEY": "{{secret:key}}"},
        },
        "mcp_reads": ["search"],
    }
)


def test_an_mcp_pack_becomes_a_server_the_agent_connects_with_its_writes_gated() -> None:
    raw = {
        "connectors": {"notes": {"key": "NOTES_KEY"}},
        "agents": {"a": {"name": "a", "connectors": ["notes"], "mcp": [{"server": "notes", "tools": ["search"]}]}},
    }
    cfg = FileConfig.model_validate(expand_connectors(raw, packs={"notes": MCP_PACK}, secrets=["NOTES_KEY"]))
    server = cfg.mcp_servers["notes"]
    assert server.transport == "stdio"
    assert server.command == ["python", "-m", "notes_server", "/srv/notes"]
    assert server.env == {"NOTES_KEY": "{{secret:NOTES_KEY}}"}  # a placeholder, never a value
    assert server.reads == ["search"]
    agent = cfg.agents["a"]
    assert [(entry.server, entry.tools) for entry in agent.mcp] == [("notes", ["search"])]  # the operator's allowlist
    [rule] = agent.policy.rules
    assert (rule.tool, rule.side_effect, rule.decide) == ("notes__*", "write", "approve")


def test_an_mcp_pack_may_not_take_a_server_name_of_yours() -> None:
    raw = {
        "mcp_servers": {"notes": {"transport": "http", "url": "https://notes.example/mcp"}},
        "agents": {"a": {"name": "a", "connectors": ["notes"]}},
        "connectors": {"notes": {"key": "NOTES_KEY"}},
    }
    with pytest.raises(ConfigError) as caught:
        expand_connectors(raw, packs={"notes": MCP_PACK})
    assert caught.value.field == "mcp_servers.notes"


def test_a_file_without_connectors_is_left_as_it_was() -> None:
    raw = {"agents": {"a": {"name": "a", "instructions": "x"}, "b": {"name": "b", "connectors": []}}}
    assert expand_connectors(raw) == raw
