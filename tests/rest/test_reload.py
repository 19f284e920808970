"""Declared REST tools reload in a running worker: an edited declaration is used at the next turn, a broken edit
keeps the last good one; ``switchboard tools check`` refuses the broken file before it is saved."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web

from switchboard.core.messages import ConversationRef, InboundMessage, Sender
from switchboard.queue.eventlog import read_events
from switchboard.queue.ingest import Ingestor
from switchboard.settings import QueueSettings
from tests.waiting import wait_until

CONFIG = """
default_agent: assistant
agents:
  assistant:
    profile: {{name: Stock}}
    instructions: test
    tools: [current_time]
    egress:
      allow: [localhost]
    rest_tools:
      - name: stock_level
        description: The stock level of one item.
        method: {method}
        url: http://localhost:{port}/{version}/stock/{{item}}
        parameters:
          type: object
          required: [item]
          properties:
            item: {{type: string, pattern: "^[a-z]+$"}}
"""


@pytest.fixture
async def stock_api() -> AsyncIterator[tuple[list[str], int]]:
    hits: list[str] = []

    async def stock(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.json_response({"item": request.match_info["item"], "level": 7})

    app = web.Application()
    app.router.add_get("/{version}/stock/{item}", stock)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield hits, port
    await runner.cleanup()


@pytest.fixture
def worker_env(base_env: dict[str, str], stock_api: tuple[list[str], int]) -> dict[str, str]:
    _, port = stock_api
    Path(base_env["SWITCHBOARD_CONFIG"]).write_text(CONFIG.format(method="GET", port=port, version="v1"))
    return base_env | {
        "SWITCHBOARD_MODEL": "offline",
        "SWITCHBOARD_EGRESS__PORTS": str(port),
        "SWITCHBOARD_EGRESS__INTERNAL_NETWORKS": "127.0.0.0/8,::1/128",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }


@pytest.fixture
def worker(worker_env: dict[str, str], tmp_path: Path) -> Iterator[Path]:
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "switchboard", "worker"], env=worker_env, stderr=out, stdout=out)
    yield log
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _edit(path: Path, text: str) -> None:
    """Write ``text`` with a modification time that surely differs (coarse file system clocks)."""
    before = path.stat().st_mtime_ns
    path.write_text(text)
    os.utime(path, ns=(before + 2_000_000_000, before + 2_000_000_000))


async def _turn(client: aioredis.Redis, n: int) -> list[dict[str, Any]]:
    """Send ``/tool stock_level`` and wait for the turn's tool call; every tool call of the session so far."""
    message = InboundMessage(
        dedup_key=f"reload-{n}",
        conversation=ConversationRef(agent="assistant", channel="web", conversation="reload"),
        sender=Sender(id="u1", name="User"),
        text='/tool stock_level {"item": "bolts"}',
    )
    await Ingestor(client, QueueSettings()).ingest(message)

    async def called() -> list[dict[str, Any]]:
        events = await read_events(client, message.session_key)
        return [e for e in events if e["kind"] == "tool_called"]

    await wait_until(lambda: _count(called, n), f"turn {n}'s tool call", timeout=60)
    return await called()


async def _count(called: Any, n: int) -> bool:
    return len(await called()) >= n


async def test_an_edited_declaration_is_used_at_the_next_turn_and_a_broken_edit_keeps_the_last_good_one(
    worker: Path,
    worker_env: dict[str, str],
    stock_api: tuple[list[str], int],
    async_redis: aioredis.Redis,
) -> None:
    hits, port = stock_api
    config = Path(worker_env["SWITCHBOARD_CONFIG"])

    calls = await _turn(async_redis, 1)
    assert calls[-1]["ok"] is True and hits == ["/v1/stock/bolts"]

    _edit(config, CONFIG.format(method="GET", port=port, version="v2"))
    calls = await _turn(async_redis, 2)
    assert calls[-1]["ok"] is True and hits == ["/v1/stock/bolts", "/v2/stock/bolts"], "the edit took effect"

    broken = CONFIG.format(method="FETCH", port=port, version="v3")
    candidate = config.with_name("candidate.yaml")
    candidate.write_text(broken)
    checked = subprocess.run(
        [sys.executable, "-m", "switchboard", "tools", "check", str(candidate)],
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode != 0 and "agents.assistant.rest_tools.0.method" in checked.stderr

    _edit(config, broken)
    calls = await _turn(async_redis, 3)
    assert calls[-1]["ok"] is True and hits[-1] == "/v2/stock/bolts", "the last good declaration stayed"
    await wait_until(
        lambda: "agents.assistant.rest_tools.0.method" in worker.read_text(),
        lambda: worker.read_text()[-2000:],
        timeout=10,
    )
    assert "keep their last good declarations" in worker.read_text()


def test_tools_check_accepts_a_valid_file_and_lists_what_each_agent_gets(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    checked = subprocess.run(
        [sys.executable, "-m", "switchboard", "tools", "check", worker_env["SWITCHBOARD_CONFIG"]],
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
    assert "assistant: stock_level" in checked.stdout and "the file is valid" in checked.stdout
