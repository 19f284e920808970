"""The channel table: a channel registered with one line is configured, served, checked and simulated.

``tests/channels/echo/`` is a text-only channel written the way a new one is (a folder: its settings block, adapter,
``FACTORY``, fake exporting ``SIMULATION`` and sample payloads); these tests add its one line to the table, under its
own name ``echo``, and use nothing else of it.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis
from aiohttp.test_utils import TestServer

from switchboard.channels import registry
from switchboard.cli.checks import check_command, config_problems, known_variables
from switchboard.cli.simulate import SIMULATE_FILE, simulate
from switchboard.core.actions import SendText
from switchboard.core.messages import InboundMessage
from switchboard.errors import ConfigError
from switchboard.outbound.outbox import Ephemeral
from switchboard.queue.keys import SessionKeys
from switchboard.settings import Settings, load_settings
from switchboard.types import SessionKey
from switchboard.web.app import create_app
from switchboard.web.appkeys import CHANNELS

from .echo.adapter import ANSWER, EchoChannel
from .echo.fake import SIMULATION, sign
from .echo.settings import EchoSettings

YAML = """
default_agent: assistant
agents:
  assistant: {profile: {name: A}, instructions: Be brief.}
  helper: {profile: {name: H}, instructions: Help.}
channels:
  echo:
    agent: helper
    tenant: echo-co
    accounts:
      second:
        secrets_from_env: {secret: ECHO_SECOND_SECRET}
        options: {app_id: "2", api_base_url: "http://127.0.0.1:9"}
"""


@pytest.fixture
def echo_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one line a new channel adds to the table."""
    monkeypatch.setitem(registry.CHANNEL_MODULES, "echo", "tests.channels.echo.factory")


@pytest.fixture
async def echo(echo_line: None, base_env: dict[str, str], tmp_path: Path) -> AsyncIterator[tuple[Settings, Any]]:
    """Settings with the echo channel's env block pointing at a running fake, and the fake."""
    block, fake = await SIMULATION.start(EchoSettings())
    details = SIMULATION.details(block)
    config = tmp_path / "echo.yaml"
    config.write_text(YAML)
    env = base_env | {
        "SWITCHBOARD_CONFIG": str(config),
        "SWITCHBOARD_ECHO__APP_ID": "1",
        "SWITCHBOARD_ECHO__SECRET": details["secret"],
        "SWITCHBOARD_ECHO__API_BASE_URL": details["fake_url"],
        "ECHO_SECOND_SECRET": "second-secret",
    }
    yield load_settings(env), fake
    await fake.stop()


async def test_the_env_block_and_the_yaml_accounts_become_adapters(echo: tuple[Settings, Any]) -> None:
    settings, _ = echo
    channels = registry.build_channels(settings, publish=None)
    assert {key for key in channels if key[0] == "echo"} == {("echo", "default"), ("echo", "second")}
    assert isinstance(channels[("echo", "second")], EchoChannel)
    assert channels[("echo", "second")].account == "second"


async def test_an_account_whose_secret_is_not_in_the_environment_is_a_config_error(
    echo: tuple[Settings, Any],
) -> None:
    settings, _ = echo
    settings._environ = {k: v for k, v in settings.environ.items() if k != "ECHO_SECOND_SECRET"}
    with pytest.raises(ConfigError, match="ECHO_SECOND_SECRET"):
        registry.build_channels(settings, publish=None)
    assert any("ECHO_SECOND_SECRET" in problem for problem in config_problems(settings))


async def test_the_webhook_route_serves_the_new_channel_through_the_router(
    echo: tuple[Settings, Any], aiohttp_client: Any, sync_redis: redis.Redis
) -> None:
    settings, _ = echo
    client = await aiohttp_client(create_app(settings))
    body = json.dumps({"id": "m1", "chat": "c1", "text": "hello"}).encode()
    accepted = await client.post(
        "/webhooks/echo", data=body, headers=sign(body, settings.environ["SWITCHBOARD_ECHO__SECRET"])
    )
    assert accepted.status == 200 and await accepted.read() == ANSWER.body
    # routed by the YAML options
    assert sync_redis.llen(SessionKeys(SessionKey("echo-co/helper/echo/default/c1")).inbox) == 1
    second = await client.post("/webhooks/echo/second", data=body, headers=sign(body, "second-secret"))
    assert second.status == 200
    assert sync_redis.llen(SessionKeys(SessionKey("echo-co/helper/echo/second/c1")).inbox) == 1
    before = sorted(sync_redis.keys("*"))
    forged = await client.post("/webhooks/echo/second", data=body, headers=sign(body, "wrong"))
    assert forged.status == 401
    assert (await client.get("/webhooks/echo")).status == 405  # the factory declares POST only
    assert (await client.post("/webhooks/echo/third", data=body)).status == 404
    keys_down = await client.post("/webhooks/echo", data=body, headers={"X-Echo-Trouble": "keys-unreachable"})
    assert keys_down.status == 503  # the platform retries once the keys can be fetched again
    bug = await client.post("/webhooks/echo", data=body, headers={"X-Echo-Trouble": "bug"})
    assert bug.status == 401  # what cannot be verified is not accepted; never a 500
    odd = json.dumps({"id": "m2", "chat": "c1", "text": "hi"}).encode()
    bug = sign(odd, "second-secret") | {"X-Echo-Trouble": "parse-bug"}  # trips a bug in the adapter's parsing
    refused = await client.post("/webhooks/echo/second", data=odd, headers=bug)
    assert refused.status == 400 and (await refused.json())["error"]["code"] == "malformed_body"
    assert sorted(sync_redis.keys("*")) == before


async def test_check_lists_the_accounts_and_the_channels_own_problems(echo: tuple[Settings, Any]) -> None:
    settings, _ = echo
    settings.redis_url = None  # no ping: this test is about the channel lines
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert check_command(settings, {}) == 0
    assert "echo       enabled, account default at POST /webhooks/echo" in out.getvalue()
    assert "echo       enabled, account second at POST /webhooks/echo/second" in out.getvalue()
    settings._environ = {k: v for k, v in settings.environ.items() if k != "SWITCHBOARD_ECHO__APP_ID"}
    assert config_problems(settings) == ["echo: SWITCHBOARD_ECHO__APP_ID is not set; set it to the echo app's id"]


def test_the_variables_of_a_tabled_channel_come_from_its_own_settings(echo_line: None) -> None:
    exact, _ = known_variables()
    assert {"SWITCHBOARD_ECHO__APP_ID", "SWITCHBOARD_ECHO__SECRET", "SWITCHBOARD_ECHO__API_BASE_URL"} <= exact


async def test_simulate_posts_a_signed_request_and_prints_the_reply_the_fake_captured(
    echo: tuple[Settings, Any], sync_redis: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    settings, _ = echo
    app = create_app(settings)
    async with TestServer(app) as server:
        channels = registry.ChannelSet(app[CHANNELS])
        details = SIMULATION.details(registry.env_block(settings, registry.factory("echo")))  # type: ignore[arg-type]
        (settings.data_path / SIMULATE_FILE).parent.mkdir(parents=True, exist_ok=True)
        (settings.data_path / SIMULATE_FILE).write_text(
            json.dumps({"gateway_url": str(server.make_url("/")), "echo": details})
        )

        async def worker() -> None:  # stands in for the worker: answers the first message it finds
            while not (keys := sync_redis.keys("sb:*echo*:messages")):
                await asyncio.sleep(0.05)
            raw = next(iter(sync_redis.hgetall(keys[0]).values()))
            message = InboundMessage.model_validate_json(raw)
            await channels.perform(SendText(text=f"echo: {message.text}"), message.conversation, Ephemeral("k"))

        answering = asyncio.create_task(worker())
        code = await simulate(settings, "echo", "ping", wait_s=20)
        await answering
    assert code == 0
    assert "← reply: echo: ping" in capsys.readouterr().out


async def test_run_starts_the_fake_of_a_channel_without_credentials(echo_line: None, base_env: dict[str, str]) -> None:
    from switchboard.cli.processes import simulated_channels

    settings = load_settings(base_env)
    fakes = await simulated_channels(settings)
    try:
        assert "echo" in fakes
        block = registry.env_block(settings, registry.factory("echo"))  # type: ignore[arg-type]
        assert block.enabled and block.api_base_url.startswith("http://127.0.0.1:")
        async with aiohttp.ClientSession() as http:
            assert await SIMULATION.replies(http, SIMULATION.details(block), "nobody") == []
    finally:
        for fake in fakes.values():
            await fake.stop()


def test_check_says_what_a_partly_configured_channel_is_missing(
    echo_line: None, base_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    settings = load_settings(base_env | {"SWITCHBOARD_ECHO__API_BASE_URL": "http://127.0.0.1:9"})
    settings.redis_url = None
    assert check_command(settings, {}) == 0  # not enabled: nothing is refused
    out = capsys.readouterr().out
    assert "echo       disabled (incomplete: echo: SWITCHBOARD_ECHO__APP_ID is not set" in out
    settings = load_settings(base_env)
    settings.redis_url = None
    check_command(settings, {})
    assert "echo       disabled (no credentials)" in capsys.readouterr().out


async def test_yaml_send_rates_replace_the_platform_s_and_zero_means_not_paced(
    echo_line: None, base_env: dict[str, str], tmp_path: Path
) -> None:
    config = tmp_path / "rates.yaml"
    config.write_text(
        YAML.replace(
            "    tenant: echo-co\n", "    tenant: echo-co\n    send_rate: 0\n    chat_send_rate: 2.5\n"
        ).replace("        secrets_from_env:", "        send_rate: 100\n        secrets_from_env:")
    )
    env = base_env | {
        "SWITCHBOARD_CONFIG": str(config),
        "SWITCHBOARD_ECHO__APP_ID": "1",
        "SWITCHBOARD_ECHO__SECRET": "x",
        "ECHO_SECOND_SECRET": "second-secret",
    }
    settings = load_settings(env)
    channels = registry.build_channels(settings, publish=None)
    plain = registry.ChannelSet(channels)
    rated = registry.ChannelSet(channels, registry.send_rates(settings))
    default = InboundMessage.model_validate(
        {
            "dedup_key": "1",
            "conversation": {"channel": "echo", "conversation": "c"},
            "sender": {"id": "u"},
            "text": "x",
        }
    ).conversation
    second = default.model_copy(update={"account": "second"})
    platform = plain.capabilities(default)
    assert platform.bot_rate.per_s > 0  # the adapter's own limits apply without the YAML
    assert rated.capabilities(default).bot_rate.per_s == 0  # 0: the gateway does not pace this account
    assert rated.capabilities(default).chat_rate.per_s == 2.5
    assert rated.capabilities(second).bot_rate.per_s == 100  # the account's own wins over the channel's
    assert rated.capabilities(second).chat_rate.per_s == 2.5  # inherited from the channel
    with pytest.raises(ConfigError):
        config.write_text(YAML.replace("    tenant: echo-co\n", "    tenant: echo-co\n    send_rate: -1\n"))
        load_settings(env)


# ---- only configured channels are loaded (a worker starts without importing the others)

_IMPORTS = """
import sys
from switchboard.cli.checks import config_problems, unknown_variables
from switchboard.channels.registry import build_channels
from switchboard.settings import load_settings
import os
settings = load_settings()
problems = config_problems(settings)
channels = sorted(name for name, _account in build_channels(settings, publish=None))
warnings = unknown_variables(os.environ, settings)
folders = [m.split(".")[2:4] for m in sys.modules if m.startswith("switchboard.channels.")]
loaded = sorted({parts[1] if parts[0] == "meta" and len(parts) > 1 else parts[0] for parts in folders})
print(repr((problems, channels, warnings, loaded)))
"""


def _loaded(env: dict[str, str]) -> tuple[list[str], list[str], list[str], list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", _IMPORTS], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    found: tuple[list[str], list[str], list[str], list[str]] = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    return found


def test_only_the_modules_of_configured_channels_are_imported(base_env: dict[str, str]) -> None:
    env = base_env | {"SWITCHBOARD_TELEGRAM__BOT_TOKEN": "1:x", "SWITCHBOARD_TELEGRAM__SECRET_TOKEN": "s" * 32}
    problems, channels, warnings, loaded = _loaded(env)
    assert channels == ["telegram", "web"] and not warnings, (problems, warnings)
    assert "slack" not in loaded and "whatsapp" not in loaded and "echo" not in loaded, loaded
    assert {"registry", "telegram", "web"} <= set(loaded)


def test_a_channel_given_any_variable_is_loaded_and_checked(base_env: dict[str, str]) -> None:
    env = base_env | {"SWITCHBOARD_SLACK__BOT_TOKEN": "not-a-bot-token", "SWITCHBOARD_SLACK__SIGNING_SECRET": "s" * 32}
    problems, _channels, _warnings, loaded = _loaded(env)
    assert "slack" in loaded and "discord" not in loaded
    assert "SWITCHBOARD_SLACK__BOT_TOKEN is not a bot token (it starts with xoxb-)" in problems, problems


def test_a_misspelt_channel_variable_still_gets_the_intended_name(base_env: dict[str, str]) -> None:
    _problems, _channels, warnings, _loaded_modules = _loaded(base_env | {"SWITCHBOARD_SLAK__BOT_TOKEN": "xoxb-1"})
    meant = "did you mean SWITCHBOARD_SLACK__BOT_TOKEN?"
    assert warnings == [f"SWITCHBOARD_SLAK__BOT_TOKEN is not a known setting; {meant}"]


# ---- nothing outside the echo folder and its one line names it


def _string_constants(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant) and n.value}


def test_the_echo_channel_is_its_folder_and_one_line_and_the_package_never_names_it(
    base_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    package = Path(registry.__file__).resolve().parents[1]
    assert not any(
        {"echo", "SWITCHBOARD_ECHO__SECRET", "tests.channels.echo.factory"} & _string_constants(path)
        for path in package.rglob("*.py")
    )
    env = base_env | {"SWITCHBOARD_ECHO__SECRET": "s", "SWITCHBOARD_ECHO__APP_ID": "1"}
    assert registry.factory("echo") is None  # without its line the gateway knows no echo channel
    assert ("echo", "default") not in registry.build_channels(load_settings(env), publish=None)
    monkeypatch.setitem(registry.CHANNEL_MODULES, "echo", "tests.channels.echo.factory")  # the one line
    found = registry.factory("echo")
    assert found is not None and found.settings is EchoSettings and found.name == "echo"
    channels = registry.build_channels(load_settings(env), publish=None)
    assert isinstance(channels[("echo", "default")], EchoChannel) and channels[("echo", "default")].name == "echo"


def test_an_invalid_channel_variable_is_refused_naming_it(echo_line: None, base_env: dict[str, str]) -> None:
    settings = load_settings(base_env | {"SWITCHBOARD_ECHO__SECRET": "s", "SWITCHBOARD_ECHO__COLOUR": "blue"})
    with pytest.raises(ConfigError, match=r"SWITCHBOARD_ECHO__COLOUR: Extra inputs are not permitted"):
        registry.check_env_blocks(settings)
    with pytest.raises(ConfigError, match=r"SWITCHBOARD_ECHO__COLOUR"):
        registry.build_channels(settings, publish=None)


def test_a_yaml_block_for_a_channel_nobody_registered_is_a_problem(
    echo_line: None, base_env: dict[str, str], tmp_path: Path
) -> None:
    config = tmp_path / "typo.yaml"
    config.write_text(YAML.replace("  echo:\n", "  ecoh:\n"))
    settings = load_settings(base_env | {"SWITCHBOARD_CONFIG": str(config)})
    problems = config_problems(settings)
    assert [p for p in problems if "ecoh" in p] == [
        "channels.ecoh: no such channel (channels: web, telegram, slack, discord, teams, whatsapp, messenger, "
        "instagram, echo)"
    ]
