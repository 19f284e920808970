"""The configuration contract of egress: env block, YAML per agent, clear errors, default deny."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchboard.egress.policy import EgressPolicy, host_matches
from switchboard.errors import ConfigError
from switchboard.settings import load_settings


def _settings(tmp_path: Path, yaml: str, **env: str):  # type: ignore[no-untyped-def]
    config = tmp_path / "switchboard.yaml"
    config.write_text("default_agent: a\n" + yaml)
    return load_settings({"SWITCHBOARD_CONFIG": str(config), **env})


def test_env_block_and_yaml_bindings_make_the_policy(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path,
        "agents:\n  a:\n    egress:\n      allow: [API.Example.com, '*.docs.example.com']\n"
        "      secrets:\n        gh_token: {env: GH, domains: [api.github.com]}\n  b: {}\n",
        GH="real",
        SWITCHBOARD_EGRESS__ALLOW="pypi.org, files.pythonhosted.org",
        SWITCHBOARD_EGRESS__METHODS="get,head",
        SWITCHBOARD_EGRESS__SECRETS__SENTRY__VALUE="s",
        SWITCHBOARD_EGRESS__SECRETS__SENTRY__DOMAINS="*.sentry.io",
    )
    policy = EgressPolicy.from_settings(settings)
    a, b = policy.rules("a"), policy.rules("b")
    assert a.allow == ("pypi.org", "files.pythonhosted.org", "api.example.com", "*.docs.example.com")
    assert b.allow == ("pypi.org", "files.pythonhosted.org")
    assert sorted(a.secrets) == ["GH_TOKEN", "SENTRY"]
    assert sorted(b.secrets) == ["SENTRY"]
    assert a.secrets["GH_TOKEN"].value.get_secret_value() == "real"
    assert policy.methods == {"GET", "HEAD"}
    assert policy.rules("unknown").allow == ()
    assert policy.problems == []


def test_a_binding_to_an_unset_variable_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path, "agents:\n  a:\n    egress:\n      secrets:\n        TOKEN: {env: MISSING, domains: [x.com]}\n"
    )
    policy = EgressPolicy.from_settings(settings)
    assert policy.rules("a").secrets == {}
    assert len(policy.problems) == 1 and "$MISSING" in policy.problems[0]


@pytest.mark.parametrize("pattern", ["*", "*.", "http://x.com", "x.com/path", "a.*.com", "-x.com", "", "x..com"])
def test_bad_host_patterns_are_config_errors(tmp_path: Path, pattern: str) -> None:
    with pytest.raises(ConfigError, match="allow"):
        _settings(tmp_path, f"agents:\n  a:\n    egress:\n      allow: ['{pattern}']\n")


def test_secret_values_never_come_from_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="value"):
        _settings(tmp_path, "agents:\n  a:\n    egress:\n      secrets:\n        T: {value: x, domains: [x.com]}\n")


def test_env_secret_needs_domains(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="SWITCHBOARD_EGRESS__SECRETS__T__DOMAINS"):
        _settings(tmp_path, "agents: {a: {}}\n", SWITCHBOARD_EGRESS__SECRETS__T__VALUE="x")


def test_host_matching() -> None:
    patterns = ("api.github.com", "*.example.com")
    assert host_matches("api.github.com", patterns)
    assert host_matches("a.b.example.com", patterns)
    assert not host_matches("example.com", patterns)
    assert not host_matches("github.com", patterns)
    assert not host_matches("xapi.github.com", patterns)
    assert not host_matches("evil-example.com", patterns)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SWITCHBOARD_EGRESS__INTERNAL_NETWORKS", "10.0.0.0/33"),
        ("SWITCHBOARD_EGRESS__ALLOW", "https://x.com"),
        ("SWITCHBOARD_EGRESS__PORTS", "http"),
    ],
)
def test_bad_env_values_name_the_variable(tmp_path: Path, name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        _settings(tmp_path, "agents: {a: {}}\n", **{name: value})
