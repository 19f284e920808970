"""The command line as an operator uses it: real subprocesses, real Redis."""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from switchboard.cli import main as cli
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


@pytest.mark.parametrize("command", ["web", "worker"])
def test_web_and_worker_started_before_their_redis_say_so_in_one_line(base_env: dict[str, str], command: str) -> None:
    result = sb(command, env=base_env | {"SWITCHBOARD_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in result.stderr and "Traceback" not in result.stderr


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


# ---- start-up refusals: a port in use, what `check` refuses, likely typos (issue #6.15, #7.8)


def _busy_port() -> socket.socket:
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


@pytest.mark.parametrize("command", ["web", "run"])
def test_a_port_in_use_is_one_line_naming_the_setting(base_env: dict[str, str], command: str) -> None:
    with _busy_port() as holder:
        port = holder.getsockname()[1]
        env = base_env | {"SWITCHBOARD_PORT": str(port), "SWITCHBOARD_TELEGRAM_BOT_TOKEN": "1:x"}
        result = sb(command, env=env, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"switchboard: port {port} on 127.0.0.1 is already in use: set SWITCHBOARD_PORT" in result.stderr
    assert "Traceback" not in result.stderr and "Unclosed" not in result.stderr, result.stderr
    # the likely typo is reported at start-up, with the name that was meant
    assert "SWITCHBOARD_TELEGRAM_BOT_TOKEN is not a known setting; did you mean SWITCHBOARD_TELEGRAM__BOT_TOKEN?" in (
        result.stderr
    )


@pytest.mark.parametrize("command", ["run", "web", "worker"])
def test_start_up_refuses_an_unknown_model_provider(base_env: dict[str, str], command: str) -> None:
    result = sb(command, env=base_env | {"SWITCHBOARD_MODEL": "mistral:large"})
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"`switchboard {command}` refuses to start" in result.stderr
    assert "unknown model provider 'mistral'" in result.stderr and "Traceback" not in result.stderr
    checked = sb("check", env=base_env | {"SWITCHBOARD_MODEL": "mistral:large"})
    assert checked.returncode == 1 and "unknown model provider 'mistral'" in checked.stdout


def test_a_draft_agent_is_refused_by_check_and_at_start_up(base_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "draft.yaml"
    config.write_text("default_agent: helper\nagents:\n  helper:\n    tools: [current_time]\n")
    env = base_env | {"SWITCHBOARD_CONFIG": str(config)}
    checked = sb("check", env=env)
    assert checked.returncode == 1
    assert "helper       draft" in checked.stdout and "agent 'helper' has no profile" in checked.stdout
    started = sb("run", env=env)
    assert started.returncode == 2 and "agent 'helper' has no instructions" in started.stderr
    assert sb("agents", "validate", env=env).returncode == 1


def test_check_warns_about_unknown_variables_with_the_likely_name(base_env: dict[str, str]) -> None:
    env = base_env | {"SWITCHBOARD_LIMTS__INBOX_DEPTH": "5", "SWITCHBOARD_QUEUE__LEASE_MS": "3000"}
    result = sb("check", env=env)
    assert result.returncode == 0, result.stdout
    assert "SWITCHBOARD_LIMTS__INBOX_DEPTH is not a known setting; did you mean SWITCHBOARD_LIMITS__INBOX_DEPTH?" in (
        result.stdout
    )
    assert "SWITCHBOARD_QUEUE__LEASE_MS" not in result.stdout  # a real setting is not reported


# ---- sessions next to `switchboard run` (issue #6.16)


def test_sessions_without_a_key_or_with_an_unknown_one(base_env: dict[str, str]) -> None:
    for action in ("stop", "show"):
        result = sb("sessions", action, env=base_env)
        assert result.returncode == 2 and "usage: switchboard sessions" in result.stderr
        assert f"`sessions {action}` needs a session KEY" in result.stderr and "Traceback" not in result.stderr
    unknown = sb("sessions", "stop", "default/assistant/web/default/nope", env=base_env)
    assert unknown.returncode == 1
    assert "no such session: default/assistant/web/default/nope" in unknown.stderr
    assert "stop sent" not in unknown.stdout


def test_sessions_without_a_url_or_a_running_gateway_says_so(base_env: dict[str, str]) -> None:
    env = {k: v for k, v in base_env.items() if k != "SWITCHBOARD_REDIS_URL"}
    result = sb("sessions", "list", env=env)
    assert result.returncode == 2
    assert "SWITCHBOARD_REDIS_URL is not set and no `switchboard run`" in result.stderr
    assert "Traceback" not in result.stderr


def test_sessions_find_the_embedded_server_of_a_running_gateway(base_env: dict[str, str], tmp_path: Path) -> None:
    env = {k: v for k, v in base_env.items() if k != "SWITCHBOARD_REDIS_URL"}
    data = Path(env["SWITCHBOARD_DATA_DIR"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env |= {"SWITCHBOARD_PORT": str(port), "PYTHONUNBUFFERED": "1"}
    log = (tmp_path / "run.log").open("w+")
    gateway = subprocess.Popen([sys.executable, "-m", "switchboard", "run"], env=env, stdout=log, stderr=log)
    try:
        for _ in range(600):  # a bound against hanging, not a timing assertion
            if gateway.poll() is not None or "Press Ctrl-C" in (tmp_path / "run.log").read_text():
                break
            time.sleep(0.05)
        assert gateway.poll() is None, (tmp_path / "run.log").read_text()
        assert (data / "redis.url").read_text().startswith("unix://")
        listed = sb("sessions", "list", env=env)
        assert listed.returncode == 0 and "no sessions yet" in listed.stdout, listed.stderr
    finally:
        gateway.send_signal(signal.SIGINT)
        gateway.wait(30)
        log.close()
    assert not (data / "redis.url").exists()


# ---- help (issue #6.17)


def test_every_command_and_option_says_what_it_does() -> None:
    parser = cli._parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    # the process roles and tools; channels may add their own (`switchboard telegram`, `switchboard discord`)
    assert {"run", "web", "worker", "check", "simulate", "sessions", "agents"} <= set(commands.choices)
    helps = {choice.dest: choice.help for choice in commands._choices_actions}
    for name, command in commands.choices.items():
        assert helps.get(name), f"{name} has no summary in `switchboard --help`"
        assert command.description and len(command.description) > 60, f"{name} --help has no description"
        for action in command._actions:
            assert action.help and action.help != argparse.SUPPRESS, f"{name}: {action.dest} has no help"
        assert "SWITCHBOARD_" in command.format_help()


def test_bare_switchboard_prints_its_help_and_version_prints_the_version(base_env: dict[str, str]) -> None:
    from switchboard import __version__

    bare = sb(env=base_env)
    assert bare.returncode == 0, bare.stderr
    assert "usage: switchboard" in bare.stdout and "run" in bare.stdout and "simulate" in bare.stdout
    version = sb("--version", env=base_env)
    assert version.returncode == 0 and version.stdout.strip() == f"switchboard {__version__}"


def test_the_banner_prints_commands_that_work_from_a_new_shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from switchboard.cli.processes import invocation

    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "switchboard"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # a new shell: the virtual environment is not activated
    assert invocation(".venv/bin/switchboard", cwd=tmp_path) == ".venv/bin/switchboard"
    assert invocation(str(script), cwd=tmp_path / ".venv") == "bin/switchboard"
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")  # activated, or installed on PATH
    assert invocation(str(script), cwd=tmp_path) == "switchboard"
    assert invocation("/somewhere/switchboard/__main__.py", cwd=tmp_path) == f"{sys.executable} -m switchboard"


def test_check_names_the_embedded_server_a_running_run_serves(base_env: dict[str, str], tmp_path: Path) -> None:
    env = {k: v for k, v in base_env.items() if k != "SWITCHBOARD_REDIS_URL"} | {"SWITCHBOARD_DATA_DIR": str(tmp_path)}
    alone = sb("check", env=env)
    assert "redis:       not set" in alone.stdout, alone.stdout
    (tmp_path / "redis.url").write_text(base_env["SWITCHBOARD_REDIS_URL"])  # what `switchboard run` leaves there
    serving = sb("check", env=env)
    assert "redis:       embedded, served by the `switchboard run` of this data directory" in serving.stdout
    assert "reachable (appendonly=" in serving.stdout and "not set" not in serving.stdout


def test_skills_list_has_a_header(base_env: dict[str, str], tmp_path: Path) -> None:
    result = sb("skills", "list", env=base_env | {"SWITCHBOARD_DATA_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].split() == ["NAME", "VERSION", "SOURCE", "SHA256", "ORIGIN"]
