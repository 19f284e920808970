"""An operator having a bad day: a Redis URL with a password, a Redis that is not up yet.

``switchboard check`` output is what operators paste into issues and chats, and ``run``'s banner is on screen:
neither may show the Redis password. A worker (or ``run``) started before its Redis must say so in one line and
exit, not print a traceback and (under ``run``) keep a half-started gateway up with no worker.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from switchboard.channels.registry import check_env_blocks
from switchboard.cli.checks import redacted_url
from switchboard.errors import ConfigError
from switchboard.settings import load_settings

PASSWORD = "hunter2-CANARY-pw"


def sb(*args: str, env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _with_user(url: str) -> str:
    """``url`` logging in as an ACL user ``op`` whose password is :data:`PASSWORD` (created on the test server)."""
    client = redis.Redis.from_url(url)
    try:
        client.acl_setuser(
            "op", enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"], channels=["*"], commands=["+@all"]
        )
    finally:
        client.close()
    if url.startswith("unix://"):
        return f"{url}&username=op&password={PASSWORD}"
    parts = urlsplit(url)
    return parts._replace(netloc=f"op:{PASSWORD}@{parts.netloc}").geturl()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://op:s3cret@db.internal:6379/0", "redis://op:***@db.internal:6379/0"),
        ("rediss://:s3cret@db.internal/1", "rediss://:***@db.internal/1"),
        ("unix:///run/redis.sock?db=0&password=s3cret", "unix:///run/redis.sock?db=0&password=***"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_a_redis_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert redacted_url(url) == shown


def test_check_never_prints_the_redis_password(base_env: dict[str, str]) -> None:
    env = base_env | {"SWITCHBOARD_REDIS_URL": _with_user(base_env["SWITCHBOARD_REDIS_URL"])}
    result = sb("check", env=env)
    assert "reachable (appendonly=yes)" in result.stdout, result.stdout + result.stderr  # it did log in
    assert PASSWORD not in result.stdout + result.stderr


@pytest.mark.parametrize("command", [["check"], ["sessions", "list"]])
def test_an_unreachable_redis_is_reported_without_its_password(base_env: dict[str, str], command: list[str]) -> None:
    port = _closed_port()
    result = sb(*command, env=base_env | {"SWITCHBOARD_REDIS_URL": f"redis://op:{PASSWORD}@127.0.0.1:{port}/0"})
    assert result.returncode == 1
    assert f"127.0.0.1:{port}" in result.stdout + result.stderr  # still says which server
    assert PASSWORD not in result.stdout + result.stderr


@pytest.mark.parametrize("command", ["worker", "run"])
def test_a_process_started_before_its_redis_says_so_in_one_line_and_exits(
    base_env: dict[str, str], command: str
) -> None:
    port = _closed_port()
    env = base_env | {"SWITCHBOARD_REDIS_URL": f"redis://op:{PASSWORD}@127.0.0.1:{port}/0", "SWITCHBOARD_PORT": "0"}
    result = sb(command, env=env)  # before: `run` kept its web tier up with no worker, until this timed out
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"switchboard: cannot reach Redis at redis://op:***@127.0.0.1:{port}/0" in result.stderr
    assert PASSWORD not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("SWITCHBOARD_LIMITS", "x", "SWITCHBOARD_LIMITS"),
        ("SWITCHBOARD_TELEGRAM", "[1", "SWITCHBOARD_TELEGRAM"),
        ("SWITCHBOARD_CONFIG", "<directory>", "is not a file"),
        ("SWITCHBOARD_CONFIG", "<not utf-8>", "is not a readable UTF-8 file"),
    ],
)
def test_a_mangled_setting_is_a_config_error_not_a_traceback(
    base_env: dict[str, str], tmp_path: Path, variable: str, value: str, named: str
) -> None:
    if value == "<directory>":
        value = str(tmp_path)
    elif value == "<not utf-8>":
        (tmp_path / "latin1.yaml").write_bytes(b"agents: {caf\xe9: {}}\n")
        value = str(tmp_path / "latin1.yaml")
    with pytest.raises(ConfigError, match=named):  # before: SettingsError, IsADirectoryError, UnicodeDecodeError
        check_env_blocks(load_settings(base_env | {variable: value}))  # as every command starts
