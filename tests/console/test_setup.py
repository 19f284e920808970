"""Setting the console up: the hash-password command, the YAML block, and what `switchboard check` says."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from argon2 import PasswordHasher

from switchboard.cli.checks import check_command
from switchboard.cli.main import main
from switchboard.errors import ConfigError
from switchboard.settings import load_settings
from tests.console.conftest import HASH


def test_hash_password_reads_stdin_and_prints_a_verifiable_argon2_hash(base_env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "switchboard", "console", "hash-password"],
        input="s3cret pass\n",
        capture_output=True,
        text=True,
        env=base_env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    hashed = done.stdout.strip()
    assert hashed.startswith("$argon2id$")
    assert PasswordHasher().verify(hashed, "s3cret pass")
    assert "s3cret" not in done.stderr


def test_hash_password_takes_no_password_argument_and_refuses_an_empty_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["console", "hash-password", "on-the-command-line"])
    assert exited.value.code == 2
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    assert main(["console", "hash-password"]) == 1
    assert "empty" in capsys.readouterr().err


def test_a_password_hash_that_is_not_argon2_is_a_config_error(base_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("console:\n  operators:\n    - {name: alice, password_hash: plaintext, tenants: [default]}\n")
    with pytest.raises(ConfigError, match=r"console\.operators\.0\.password_hash.*hash-password"):
        load_settings({**base_env, "SWITCHBOARD_CONFIG": str(config)})
    config.write_text("console:\n  operators:\n    - {name: alice, tenants: []}\n")
    with pytest.raises(ConfigError, match=r"console\.operators\.0\.tenants"):
        load_settings({**base_env, "SWITCHBOARD_CONFIG": str(config)})


def test_an_operators_role_is_operator_by_default_and_checked(base_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "roles.yaml"
    config.write_text(
        "console:\n  operators:\n    - {name: alice, tenants: [default]}\n"
        "    - {name: carol, tenants: [default], role: viewer}\n"
    )
    operators = load_settings({**base_env, "SWITCHBOARD_CONFIG": str(config)}).file.console.operators
    assert [(o.role, o.reads_messages) for o in operators] == [("operator", True), ("viewer", False)]
    config.write_text("console:\n  operators:\n    - {name: alice, tenants: [default], role: admin}\n")
    with pytest.raises(ConfigError, match=r"console\.operators\.0\.role"):
        load_settings({**base_env, "SWITCHBOARD_CONFIG": str(config)})


def test_check_reports_the_console(
    base_env: dict[str, str], console_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    check_command(load_settings(base_env), base_env)
    assert "console:     no operator; add one under console.operators" in capsys.readouterr().out
    env = {**console_env, "SWITCHBOARD_CONSOLE__AUTH_HEADER": "X-Forwarded-User"}
    check_command(load_settings(env), env)
    out = capsys.readouterr().out
    assert "console:     3 operator(s) at /console; proxy header X-Forwarded-User (ignored: no trusted proxies)" in out
    assert HASH not in out
