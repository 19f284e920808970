"""The command line as an operator uses it: real subprocesses, real Redis."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.queue.connection import async_client
from switchboard.queue.ingest import Ingestor
from switchboard.settings import load_settings


def sb(*args: str, env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("command", ["web", "worker"])
def test_web_and_worker_refuse_to_start_without_redis_url(base_env: dict[str, str], command: str) -> None:
    env = {k: v for k, v in base_env.items() if k != "SWITCHBOARD_REDIS_URL"}
    result = sb(command, env=env)
    assert result.returncode == 2
    assert "SWITCHBOARD_REDIS_URL" in result.stderr and "switchboard run" in result.stderr


def test_bad_environment_names_the_variable(base_env: dict[str, str]) -> None:
    result = sb("check", env=base_env | {"SWITCHBOARD_QUEUE__LEASE_MS": "soon"})
    assert result.returncode == 2
    assert "SWITCHBOARD_QUEUE__LEASE_MS" in result.stderr


def test_check_prints_what_is_enabled_and_pings_redis(base_env: dict[str, str]) -> None:
    result = sb("check", env=base_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "reachable (appendonly=yes)" in result.stdout
    assert "telegram   disabled" in result.stdout
    assert "ok: no problems found" in result.stdout


def test_check_reports_misconfiguration(base_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "draft.yaml"
    config.write_text("default_agent: a\nagents:\n  a:\n    tools: [current_time, teleport]\n")
    env = base_env | {"SWITCHBOARD_CONFIG": str(config), "SWITCHBOARD_TELEGRAM__BOT_TOKEN": "1:x"}
    result = sb("check", env=env)
    assert result.returncode == 1
    assert "SWITCHBOARD_TELEGRAM__SECRET_TOKEN is not set" in result.stdout
    assert "has no profile" in result.stdout and "teleport" in result.stdout


def test_check_reports_unreachable_redis(base_env: dict[str, str]) -> None:
    result = sb("check", env=base_env | {"SWITCHBOARD_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert result.returncode == 1
    assert "cannot reach redis://127.0.0.1:1/0" in result.stdout


def test_agents_list_show_validate(base_env: dict[str, str]) -> None:
    root = Path(__file__).resolve().parent.parent
    env = base_env | {"SWITCHBOARD_CONFIG": str(root / "config" / "switchboard.yaml")}
    listed = sb("agents", "list", env=env)
    assert listed.returncode == 0
    assert "assistant" in listed.stdout and "ready" in listed.stdout and "analyst" in listed.stdout
    shown = sb("agents", "show", "analyst", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "codeact:      on" in shown.stdout and "read_document" in shown.stdout and "cost=" in shown.stdout
    assert sb("agents", "validate", env=env).returncode == 0
    missing = sb("agents", "show", "ghost", env=env)
    assert missing.returncode == 2 and "ghost" in missing.stderr


async def test_sessions_list_and_show_after_traffic(base_env: dict[str, str], redis_url: str) -> None:
    empty = sb("sessions", "list", env=base_env)
    assert empty.returncode == 0 and "no sessions yet" in empty.stdout
    unknown = sb("sessions", "show", "default/assistant/web/default/nope", env=base_env)
    assert unknown.returncode == 1

    redis = async_client(redis_url)
    message = InboundMessage(
        dedup_key="evt-1",
        conversation=ConversationRef(agent="assistant", channel="telegram", conversation="555"),
        sender=Sender(id="u1"),
        text="hello",
    )
    await Ingestor(redis, load_settings(base_env).queue).ingest(message)
    await redis.aclose()
    listed = sb("sessions", "list", env=base_env)
    assert listed.returncode == 0 and message.session_key in listed.stdout
    shown = sb("sessions", "show", message.session_key, env=base_env)
    assert shown.returncode == 0, shown.stderr
    assert "message_received" in shown.stdout and "run_queued" in shown.stdout
    nobody = sb("sessions", "stop", message.session_key, env=base_env)
    assert nobody.returncode == 1 and "stop sent to 0 worker(s)" in nobody.stdout
