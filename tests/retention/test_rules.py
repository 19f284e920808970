"""The ``retention:`` block: durations, defaults and per-tenant overrides, and clear errors for what is not a rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from switchboard.core.retention import RetentionConfig
from switchboard.errors import ConfigError
from switchboard.settings import load_file


def test_a_tenant_rule_overrides_the_default_and_keep_keeps() -> None:
    config = RetentionConfig.model_validate(
        {"defaults": {"events": "30d", "history": "12h"}, "tenants": {"acme": {"events": "keep", "memory": "2w"}}}
    )
    assert config.rule("acme", "events") is None
    assert config.rule("acme", "memory") == 14 * 86400
    assert config.rule("acme", "history") == 12 * 3600
    assert config.rule("globex", "events") == 30 * 86400
    assert config.rule("globex", "memory") is None
    assert config.rules("globex") == {"history": 43200.0, "events": 2592000.0}
    assert config.active and config.every == 3600
    assert config.describe() == ["defaults: history 12h, events 30d", "tenant acme: events keep, memory 2w"]


def test_no_block_means_no_rule() -> None:
    config = RetentionConfig()
    assert not config.active
    assert config.rules("acme") == {}
    assert not RetentionConfig.model_validate({"tenants": {"acme": {"events": "keep"}}}).active


@pytest.mark.parametrize(
    ("block", "says"),
    [
        ({"defaults": {"events": "30 days"}}, "'30 days' is not a duration: write a number and a unit"),
        ({"defaults": {"events": 30}}, "30 is not a duration"),
        ({"defaults": {"events": "0d"}}, "'0d' is not a duration"),
        ({"defaults": {"chats": "1d"}}, "'chats' is not a kind of data with a retention rule (kinds: history,"),
        ({"defaults": {"traces": "1d"}}, "traces are exported over OTLP and not stored by Switchboard"),
        ({"tenants": {"acme": {"caches": "1d"}}}, "caches are not kept past their own expiry"),
        ({"every": "keep"}, "retention.every must be a duration"),
        ({"tenants": {"a/b": {"events": "1d"}}}, "'a/b' is not a tenant id"),
        ({"defaults": {"events": "1d"}, "often": "1h"}, "often"),
    ],
)
def test_a_bad_rule_is_a_clear_error_naming_where(tmp_path: Path, block: object, says: str) -> None:
    path = tmp_path / "switchboard.yaml"
    path.write_text(yaml.safe_dump({"retention": block}))
    with pytest.raises(ConfigError) as caught:
        load_file(path)
    assert says in str(caught.value)
    assert "retention" in str(caught.value)


def test_the_yaml_block_loads(tmp_path: Path) -> None:
    path = tmp_path / "switchboard.yaml"
    path.write_text(
        "retention:\n  every: 10m\n  defaults: {dead_letters: 14d}\n  tenants:\n    acme: {workspaces: 7d}\n"
    )
    config = load_file(path).retention
    assert config.every == 600
    assert config.rule("acme", "workspaces") == 7 * 86400
    assert config.rule("acme", "dead_letters") == 14 * 86400


def test_a_validated_config_dumps_and_loads_again() -> None:
    # Settings(file=...) and the console's config views re-validate a dumped file: durations must survive that
    from switchboard.settings import FileConfig, Settings

    block = {"every": "90m", "defaults": {"events": "30d", "history": "keep"}, "tenants": {"acme": {"memory": "2w"}}}
    config = RetentionConfig.model_validate(block)
    assert config.model_dump(exclude_none=True, exclude_defaults=False)["defaults"] == {
        "events": "30d",
        "history": "keep",
    }
    assert RetentionConfig.model_validate(config.model_dump()) == config
    assert RetentionConfig.model_validate_json(config.model_dump_json()) == config
    settings = Settings(file=FileConfig.model_validate({"retention": block}))
    assert settings.file.retention == config
