"""``switchboard mcp tools|accept`` against a real stdio server, and a worker's runtime offering what was accepted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from switchboard.cli.worker import build_runtime
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.mcp.client import McpClients
from switchboard.settings import load_settings
from tests.mcp.test_client import SERVER
from tests.sandbox.conftest import sandbox_of

CONFIG = f"""
default_agent: assistant
mcp_servers:
  calc:
    transport: stdio
    command: [{json.dumps(sys.executable)}, {json.dumps(str(SERVER))}, stdio, "0", STATE]
    reads: [add, lookup]
agents:
  assistant:
    profile: {{name: Assistant}}
    instructions: You are a test assistant.
    tools: [current_time]
    mcp: [{{server: calc, tools: [add]}}]
"""


def environment(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "switchboard.yaml"
    config.write_text(CONFIG.replace("STATE", json.dumps(str(tmp_path / "state"))))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "OPENAI_", "ANTHROPIC_"))}
    return env | {"SWITCHBOARD_DATA_DIR": str(tmp_path / "data"), "SWITCHBOARD_CONFIG": str(config)}


def sb(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard", *args], env=env, capture_output=True, text=True, timeout=60
    )


def statuses(output: str) -> dict[str, str]:
    rows = output.split("TOOL", 1)[1].splitlines()[1:]
    return {row.split()[0]: row.split()[1] for row in rows if row and not row.startswith(" ")}


def test_tools_are_listed_accepted_one_by_one_and_a_change_is_shown(tmp_path: Path) -> None:
    env = environment(tmp_path)
    listed = sb("mcp", "tools", "calc", env=env)
    assert listed.returncode == 0, listed.stderr
    assert set(statuses(listed.stdout).values()) == {"new"}
    assert {"add", "delete_everything", "lookup"} <= set(statuses(listed.stdout))
    assert "description (the server's text, untrusted): 'Looks up a word. IMPORTANT" in listed.stdout

    accepted = sb("mcp", "accept", "calc", "add", env=env)
    assert accepted.returncode == 0 and "accepted 1 tool(s) of calc: add" in accepted.stdout
    assert statuses(sb("mcp", "tools", "calc", env=env).stdout)["add"] == "accepted"

    (tmp_path / "state").write_text("changed")
    assert statuses(sb("mcp", "tools", "calc", env=env).stdout)["add"] == "changed"
    unknown = sb("mcp", "accept", "calc", "nope", env=env)
    assert unknown.returncode == 1 and "announces no tool 'nope'" in unknown.stderr
    missing = sb("mcp", "tools", "other", env=env)
    assert missing.returncode == 2 and "no MCP server 'other'" in missing.stderr


def test_an_agent_naming_an_unknown_server_is_a_configuration_error(tmp_path: Path) -> None:
    env = environment(tmp_path)
    config = Path(env["SWITCHBOARD_CONFIG"])
    config.write_text(config.read_text().replace("mcp: [{server: calc", "mcp: [{server: nope"))
    checked = sb("check", env=env)
    assert checked.returncode != 0
    assert (
        "agents.assistant.mcp[0] names the MCP server 'nope', which is not defined" in checked.stdout + checked.stderr
    )


async def test_a_worker_runtime_offers_the_accepted_tools_its_agent_allows(tmp_path: Path) -> None:
    env = environment(tmp_path)
    assert sb("mcp", "accept", "calc", env=env).returncode == 0
    settings = load_settings({k: env[k] for k in ("SWITCHBOARD_DATA_DIR", "SWITCHBOARD_CONFIG")})
    clients = McpClients(settings.file.mcp_servers)
    try:
        runtime = build_runtime(settings, ModelFactory(ProviderConfig()), mcp=clients)
        offered = [t.name for t in runtime.registry.for_agent(settings.file.agents["assistant"])]
        assert offered == ["current_time", "calc__add"]
        assert {"calc__lookup", "calc__delete_everything"} <= set(runtime.registry.names())
    finally:
        await clients.aclose()
        await runtime.gateway.store.aclose()


def sandboxed(tmp_path: Path, kind: str) -> dict[str, str]:
    env = environment(tmp_path)
    config = Path(env["SWITCHBOARD_CONFIG"])
    config.write_text(config.read_text().replace("    transport: stdio\n", "    transport: stdio\n    sandbox: true\n"))
    return env | {"SWITCHBOARD_SANDBOX__KIND": kind}


def test_a_sandboxed_server_is_refused_by_the_cli_and_flagged_by_check_where_there_is_no_sandbox(
    tmp_path: Path,
) -> None:
    env = sandboxed(tmp_path, "off")
    listed = sb("mcp", "tools", "calc", env=env)
    assert listed.returncode == 1 and "TOOL" not in listed.stdout
    assert "runs only in a sandbox (sandbox: true) and this host cannot run it" in listed.stderr
    assert "never started unsandboxed" in listed.stderr
    assert not (tmp_path / "data" / "mcp" / "pins.json").exists()
    checked = sb("check", env=env)
    assert "MCP server calc has sandbox: true but this host has no sandbox" in checked.stdout + checked.stderr


def test_a_sandboxed_server_is_listed_and_accepted_from_inside_the_sandbox(tmp_path: Path) -> None:
    sandbox_of("bwrap")  # skips, naming why, where bubblewrap does not run
    env = sandboxed(tmp_path, "bwrap")
    listed = sb("mcp", "tools", "calc", env=env)
    assert listed.returncode == 0, listed.stderr
    assert '"sandbox": true' in listed.stdout and statuses(listed.stdout)["add"] == "new"
    assert sb("mcp", "accept", "calc", env=env).returncode == 0
    pins = json.loads((tmp_path / "data" / "mcp" / "pins.json").read_text())
    assert '"sandbox": true' in pins["calc"]["identity"]
