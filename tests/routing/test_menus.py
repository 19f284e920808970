"""Native command menus: Telegram ``setMyCommands`` per role against the fake Bot API, Slack's manifest, and the one
table they come from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from switchboard.channels.telegram.fake.platform import FakeTelegram
from switchboard.cli.main import main
from switchboard.core.commands import BUILTIN_COMMANDS, CommandRule, menu, role_menus
from switchboard.settings import FileConfig
from tests.channels.test_telegram_cli import env, fake  # noqa: F401  (fixtures)

CONFIG = """
default_agent: assistant
agents:
  assistant: {profile: {name: Assistant}, instructions: Help.}
channels:
  telegram:
    access: {roles: {"telegram:42": admin, "telegram:43": admin, "telegram:4*": admin, "telegram:66": guest}}
commands:
  billing: {roles: [admin], description: Talk to billing}
  status: {roles: [admin]}
"""


def scope(kind: str, chat_id: str | None = None) -> str:
    found = {"type": kind, **({"chat_id": chat_id} if chat_id else {}), "language_code": ""}
    return json.dumps(found, sort_keys=True)


def names(commands: list[dict[str, str]]) -> list[str]:
    return [c["command"] for c in commands]


def test_set_commands_gives_each_role_its_menu(
    env: dict[str, str],  # noqa: F811
    fake: FakeTelegram,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "menus.yaml"
    path.write_text(CONFIG)
    monkeypatch.setenv("SWITCHBOARD_CONFIG", str(path))
    assert main(["telegram", "set-commands"]) == 0
    menus = fake.state.commands
    # a user's: no /status (admins only here), no /model, no /billing, no /link (identity is off)
    assert names(menus[scope("default")]) == ["new", "reset", "stop", "usage", "whoami", "help"]
    admin = ["new", "reset", "stop", "status", "usage", "model", "whoami", "help", "billing"]
    assert names(menus[scope("chat", "42")]) == admin and names(menus[scope("chat", "43")]) == admin
    assert names(menus[scope("chat", "66")]) == ["new", "reset", "stop", "whoami", "help"]  # a guest's
    assert len(menus) == 4  # the glob telegram:4* names no chat
    assert all(1 <= len(c["description"]) <= 256 for m in menus.values() for c in m)
    out = capsys.readouterr().out
    assert "Telegram menu for every chat (user)" in out and "private chats of 42, 43 (admin)" in out


def test_the_fake_refuses_a_menu_telegram_would_refuse(
    env: dict[str, str],  # noqa: F811
    fake: FakeTelegram,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "menus.yaml"
    path.write_text(CONFIG.replace("description: Talk to billing", f"description: {'x' * 300}"))
    monkeypatch.setenv("SWITCHBOARD_CONFIG", str(path))
    assert main(["telegram", "set-commands"]) != 0  # the admins' menu holds a description over 256 characters


def test_the_slack_manifest_lists_every_built_in_command() -> None:
    manifest = yaml.safe_load((Path(__file__).resolve().parents[2] / "config" / "slack-app-manifest.yaml").read_text())
    listed = {c["command"][1:] for c in manifest["features"]["slash_commands"]}
    # /link is listed where identity linking is on; /voice where voice notes exist (Slack has none)
    assert set(BUILTIN_COMMANDS) - {"link", "voice"} <= listed


@pytest.mark.parametrize(
    ("config", "role", "expected"),
    [
        ({}, "guest", ["new", "reset", "stop", "status", "whoami", "help", "voice"]),
        ({}, "admin", ["new", "reset", "stop", "status", "usage", "model", "whoami", "help", "link", "voice"]),
        ({"model": CommandRule(roles=["admin", "user"])}, "user", ["model"]),
        ({"help": CommandRule(roles=[])}, "admin", ["!help"]),  # nobody: left out of every menu
        ({"report": CommandRule(description="Report a problem")}, "guest", ["report"]),
        ({"secret": CommandRule(roles=["admin"])}, "admin", ["!secret"]),  # no description: not listed
    ],
)
def test_menu_lists_what_a_role_may_use(config: dict[str, CommandRule], role: str, expected: list[str]) -> None:
    listed = [name for name, _ in menu(config, role)]  # type: ignore[arg-type]
    if all(not e.startswith("!") for e in expected) and len(expected) > 1:
        assert listed == expected
    for item in expected:
        assert (item[1:] not in listed) if item.startswith("!") else (item in listed)


def test_role_menus_skip_globs_and_senders_of_the_default_role() -> None:
    roles = [("telegram:1", "user"), ("telegram:2", "admin"), ("slack:U1", "admin"), ("telegram:*", "guest")]
    menus = role_menus({}, "telegram", "user", roles)  # type: ignore[arg-type]
    assert [(m.role, m.senders) for m in menus] == [("user", ()), ("admin", ("2",))]


@pytest.mark.parametrize(
    ("voice", "self_link", "hidden"),
    [("off", False, {"link", "voice"}), ("always", False, {"link"}), ("off", True, {"voice"}), ("always", True, set())],
)
def test_menus_leave_out_what_nothing_here_serves(voice: str, self_link: bool, hidden: set[str]) -> None:
    config = FileConfig.model_validate(
        {
            "agents": {
                "assistant": {
                    "name": "assistant",
                    "profile": {"name": "A"},
                    "instructions": "Hi.",
                    "voice": {"mode": voice},
                }
            },
            "identity": {"self_link": self_link},
        }
    )
    assert config.hidden_commands() == hidden
