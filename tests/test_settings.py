"""The configuration contract of docs/ARCHITECTURE.md §10: names, defaults, precedence and clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from switchboard import settings
from switchboard.channels import registry
from switchboard.channels.telegram.settings import TelegramSettings
from switchboard.errors import ConfigError
from switchboard.settings import channels as channelsettings
from switchboard.settings import load_settings
from switchboard.settings.channels import ChannelSettings


def _block(loaded: settings.Settings, channel: str) -> Any:
    """A channel's env block, read the one way there is: through the channel registry."""
    found = registry.factory(channel)
    assert found is not None
    return registry.env_block(loaded, found)


def test_defaults_follow_the_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no config/switchboard.yaml here: built-in defaults
    s = load_settings({})
    assert s.file.agent(None).status == "ready"
    assert (s.host, s.port, s.redis_url) == ("127.0.0.1", 8080, None)
    assert s.default_model == "offline"
    assert _block(s, "telegram").api_base_url == "https://api.telegram.org"
    assert _block(s, "slack").api_base_url == "https://slack.com/api/"
    assert _block(s, "whatsapp").graph_base_url == "https://graph.facebook.com/v23.0"
    assert s.queue.dedup_ttl_s >= 24 * 3600


def test_nested_env_names_and_provider_keys() -> None:
    s = load_settings(
        {
            "SWITCHBOARD_TELEGRAM__BOT_TOKEN": "1:abc",
            "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": "s3cret_token",
            "SWITCHBOARD_QUEUE__LEASE_MS": "2500",
            "ANTHROPIC_API_KEY": "k",
            "OPENAI_BASE_URL": "http://127.0.0.1:11434/v1",
        }
    )
    assert _block(s, "telegram").enabled and not _block(s, "slack").enabled
    lower = load_settings({"switchboard_telegram__bot_token": "1:abc"})  # names are case-insensitive, as before
    assert _block(lower, "telegram").enabled
    assert s.queue.lease_ms == 2500
    assert s.default_model.startswith("anthropic:")
    assert s.openai_wire_api == "chat"


def test_openai_key_wins_over_anthropic_and_model_env_wins_over_both() -> None:
    both = {"OPENAI_API_KEY": "a", "ANTHROPIC_API_KEY": "b"}
    assert load_settings(both).default_model.startswith("openai:")
    assert load_settings(both | {"SWITCHBOARD_MODEL": "offline"}).default_model == "offline"
    assert load_settings(both).openai_wire_api == "responses"


def test_errors_name_the_variable_and_the_fix() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"SWITCHBOARD_PORT": "eighty"})
    assert "SWITCHBOARD_PORT" in str(info.value)
    # a channel's block is validated through the registry (the CLI does it right after loading, before anything runs)
    bad = {"SWITCHBOARD_TELEGRAM__SECRET_TOKEN": "has space", "SWITCHBOARD_SLACK__NO_SUCH": "x"}
    with pytest.raises(ConfigError) as info:
        registry.check_env_blocks(load_settings(bad))
    lines = str(info.value).splitlines()
    assert lines[0] == "invalid configuration in the environment:"
    assert any(
        line.startswith("  SWITCHBOARD_TELEGRAM__SECRET_TOKEN: ") and "A-Z a-z 0-9 _ -" in line for line in lines
    )
    assert "  SWITCHBOARD_SLACK__NO_SUCH: Extra inputs are not permitted" in lines


def test_redis_url_scheme_is_checked_and_unix_accepted() -> None:
    assert load_settings({"SWITCHBOARD_REDIS_URL": "unix:///tmp/r.sock"}).redis_url == "unix:///tmp/r.sock"
    with pytest.raises(ConfigError, match="SWITCHBOARD_REDIS_URL"):
        load_settings({"SWITCHBOARD_REDIS_URL": "localhost:6379"})


def test_yaml_agents_status_and_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "sb.yaml"
    cfg.write_text(
        "default_agent: a\nagents:\n  a:\n    profile: {name: A}\n    instructions: Be brief.\n  b:\n    tools: []\n"
    )
    s = load_settings({"SWITCHBOARD_CONFIG": str(cfg)})
    assert s.file.agents["a"].status == "ready"
    assert s.file.agents["b"].status == "draft"
    assert any("profile" in p for p in s.file.agents["b"].problems())
    cfg.write_text("agents:\n  a:\n    profile: {name: A}\n    limits: {max_steps: 0}\n")
    with pytest.raises(ConfigError, match=r"agents\.a\.limits\.max_steps"):
        load_settings({"SWITCHBOARD_CONFIG": str(cfg)})
    cfg.write_text("default_agent: ghost\nagents:\n  a: {}\n")
    with pytest.raises(ConfigError, match="ghost"):
        load_settings({"SWITCHBOARD_CONFIG": str(cfg)})


def test_missing_explicit_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings({"SWITCHBOARD_CONFIG": str(tmp_path / "missing.yaml")})


def test_shipped_example_config_is_valid() -> None:
    root = Path(__file__).resolve().parent.parent
    s = load_settings({"SWITCHBOARD_CONFIG": str(root / "config" / "switchboard.yaml")})
    assert s.file.agent(None).status == "ready"
    assert s.file.agents["analyst"].codeact


def test_web_session_retention_settings_and_the_channel_blocks_moved_out_of_this_module() -> None:
    s = load_settings({"SWITCHBOARD_LIMITS__IDLE_SESSION_TTL_S": "0", "SWITCHBOARD_LIMITS__WEB_HISTORY_KIB": "512"})
    assert (s.limits.idle_session_ttl_s, s.limits.web_history_kib) == (0, 512)
    default = load_settings({}).limits
    assert default.idle_session_ttl_s == 30 * 24 * 3600  # as long as a web chat token lives unused
    with pytest.raises(ConfigError, match="SWITCHBOARD_LIMITS__IDLE_SESSION_TTL_S"):
        load_settings({"SWITCHBOARD_LIMITS__IDLE_SESSION_TTL_S": "-1"})
    # the shared bases live in their own module; each platform's block lives in its channel's folder, and the
    # settings name no platform
    assert settings.ChannelOptions is channelsettings.ChannelOptions
    assert issubclass(TelegramSettings, ChannelSettings) and not hasattr(settings, "TelegramSettings")
    blocks = [name for name, f in settings.Settings.model_fields.items() if "Channel" in str(f.annotation)]
    assert blocks == []


def test_channel_transport_app_token_and_when_slack_is_enabled() -> None:
    assert _block(load_settings({}), "telegram").transport == "webhook"
    assert _block(load_settings({"SWITCHBOARD_TELEGRAM__TRANSPORT": "polling"}), "telegram").transport == "polling"
    with pytest.raises(ConfigError, match="SWITCHBOARD_TELEGRAM__TRANSPORT"):
        _block(load_settings({"SWITCHBOARD_TELEGRAM__TRANSPORT": "carrier-pigeon"}), "telegram")
    # a bot token alone cannot receive anything: Slack needs the signing secret (HTTP) or an app token (Socket Mode)
    assert not _block(load_settings({"SWITCHBOARD_SLACK__BOT_TOKEN": "xoxb-1"}), "slack").enabled
    http = _block(
        load_settings({"SWITCHBOARD_SLACK__BOT_TOKEN": "xoxb-1", "SWITCHBOARD_SLACK__SIGNING_SECRET": "s"}), "slack"
    )
    socket = _block(
        load_settings({"SWITCHBOARD_SLACK__BOT_TOKEN": "xoxb-1", "SWITCHBOARD_SLACK__APP_TOKEN": "xapp-1"}), "slack"
    )
    assert http.enabled and socket.enabled
    assert socket.app_token is not None and "xapp-1" not in repr(socket)
    assert not _block(load_settings({"SWITCHBOARD_SLACK__APP_TOKEN": "xapp-1"}), "slack").enabled
    assert _block(load_settings({"SWITCHBOARD_DISCORD__BOT_TOKEN": "t"}), "discord").enabled


def test_require_mention_in_yaml_for_a_channel_and_an_account(tmp_path: Path) -> None:
    from switchboard.channels import registry

    cfg = tmp_path / "sb.yaml"
    cfg.write_text(
        "channels:\n  telegram:\n    require_mention: false\n    accounts:\n"
        "      strict:\n        require_mention: true\n        secrets_from_env: {bot_token: STRICT_TOKEN}\n"
        "      loose:\n        secrets_from_env: {bot_token: LOOSE_TOKEN}\n"
    )
    env = {
        "SWITCHBOARD_CONFIG": str(cfg),
        "SWITCHBOARD_TELEGRAM__BOT_TOKEN": "1:a",
        "STRICT_TOKEN": "2:b",
        "LOOSE_TOKEN": "3:c",
    }
    s = load_settings(env)
    telegram = registry.factory("telegram")
    assert telegram is not None
    found = {c.account: c.require_mention for c in registry.account_configs(s, telegram, s.environ)}
    assert found == {"default": False, "strict": True, "loose": False}
    cfg.write_text("channels:\n  telegram:\n    require_mention: sometimes\n")
    with pytest.raises(ConfigError, match=r"channels\.telegram\.require_mention"):
        load_settings(env)
