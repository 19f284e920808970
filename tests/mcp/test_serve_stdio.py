"""``switchboard mcp serve --client NAME`` over stdio (a real subprocess and the SDK's client), the CLI that makes its
clients, and the drafts' lifecycle: proposed, listed, accepted into ``agents.d``, then served to its tenant only.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import CallToolResult

from switchboard.cli.main import main
from switchboard.settings import load_settings
from tests.chaos.harness import ROOT, WorkerPool
from tests.mcp.serving import INTRUDER, clients, pools, serve_env, text_of, workers

pytestmark = [pytest.mark.timeout(180)]
_fixtures = (clients, pools, serve_env)


@contextlib.asynccontextmanager
async def stdio_session(env: dict[str, str], client: str, token: str, errlog: Path) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "switchboard", "mcp", "serve", "--client", client],
        env=env | {"SWITCHBOARD_MCP_SERVE__TOKEN": token},
        cwd=ROOT,
    )
    with errlog.open("a") as log:
        async with (
            stdio_client(params, errlog=log) as streams,
            ClientSession(*streams[:2], read_timeout_seconds=60) as s,
        ):
            await s.initialize()
            yield s


async def run_cli(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], argv: list[str]) -> int:
    """The ``switchboard`` command in this process (off the loop: it runs its own)."""
    for name, value in env.items():
        if name.startswith("SWITCHBOARD_"):
            monkeypatch.setenv(name, value)
    return await asyncio.to_thread(main, argv)


async def test_stdio_serves_a_client_made_by_the_cli_and_a_draft_only_once_accepted(
    serve_env: dict[str, str],
    clients: None,
    pools: Callable[[dict[str, str], int], WorkerPool],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    assert await run_cli(monkeypatch, serve_env, ["mcp", "clients", "add", "ide", "--tenant", "default"]) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("sb_")
    assert await run_cli(monkeypatch, serve_env, ["mcp", "clients", "add", "ide", "--tenant", "default"]) == 2  # taken
    errlog = tmp_path / "serve.err"
    pool = await workers(pools, serve_env)
    async with stdio_session(serve_env, "ide", token, errlog) as session:
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert listed == {"ask_assistant", "ask_helper", "propose_agent"}
        answer = await session.call_tool("ask_assistant", {"message": "hello over stdio"})
        assert isinstance(answer, CallToolResult) and not answer.is_error, (answer, errlog.read_text())
        assert 'You said: "hello over stdio"' in text_of(answer)
        proposed = await session.call_tool("propose_agent", {"name": "scout", "instructions": "You scout for deals."})
        assert isinstance(proposed, CallToolResult) and not proposed.is_error, proposed
    await pool.close()

    capsys.readouterr()
    assert await run_cli(monkeypatch, serve_env, ["agents", "drafts", "--tenant", "other"]) == 0
    assert "scout" not in capsys.readouterr().out  # another tenant's owner never sees it
    assert await run_cli(monkeypatch, serve_env, ["agents", "drafts"]) == 0
    assert "scout" in capsys.readouterr().out
    assert await run_cli(monkeypatch, serve_env, ["agents", "accept", "scout", "--tenant", "other"]) == 1
    assert await run_cli(monkeypatch, serve_env, ["agents", "accept", "scout"]) == 0
    written = Path(serve_env["SWITCHBOARD_CONFIG"]).parent / "agents.d" / "default" / "scout.yaml"
    assert written.is_file()
    assert await run_cli(monkeypatch, serve_env, ["agents", "accept", "scout"]) == 1  # no draft left
    config = load_settings(serve_env).file
    assert config.agents["scout"].status == "ready" and config.agent_tenant("scout") == "default"

    await workers(pools, serve_env)  # workers read agents when they start
    async with stdio_session(serve_env, "ide", token, errlog) as session:
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert "ask_scout" in listed
        answer = await session.call_tool("ask_scout", {"message": "any deals?"})
        assert isinstance(answer, CallToolResult) and not answer.is_error, (answer, errlog.read_text())
        assert 'You said: "any deals?"' in text_of(answer)
    async with stdio_session(serve_env, "intruder", INTRUDER, errlog) as session:
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert listed == {"ask_rival", "propose_agent"}


async def test_stdio_refuses_a_wrong_token(serve_env: dict[str, str], clients: None, tmp_path: Path) -> None:
    errlog = tmp_path / "serve.err"
    with pytest.raises(Exception):  # noqa: B017 - the SDK reports the closed pipe its own way
        async with stdio_session(serve_env, "desk", "sb_wrong", errlog):
            pass
    assert "the token is not MCP client 'desk'" in errlog.read_text()
