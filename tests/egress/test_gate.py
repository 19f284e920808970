"""The worker's side of egress: when the proxy starts, where it listens, what ``switchboard check`` says."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.cli.worker import run_worker
from switchboard.core.events import EgressRequested, EventAdapter
from switchboard.egress.events import RedisEgressSink
from switchboard.egress.gate import MAX_SOCKET_PATH, start_sandbox_egress
from switchboard.errors import ConfigError
from switchboard.queue.keys import SessionKeys
from switchboard.sandbox.runner import Sandbox
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from tests.sandbox.conftest import sandbox_of

SESSION = "default/assistant/web/main/conv-1"


async def _status_line(socket_path: Path) -> bytes:
    """A request without a grant, sent to the proxy's unix socket as a sandbox's bridge would."""
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    writer.write(b"GET http://api.example.test/ HTTP/1.1\r\nHost: api.example.test\r\n\r\n")
    await writer.drain()
    line = await reader.readline()
    writer.close()
    await writer.wait_closed()
    return line


async def test_the_sink_writes_a_fact_of_the_event_union(async_redis: aioredis.Redis) -> None:
    fact = EgressRequested(
        agent="assistant",
        session=SESSION,
        method="GET",
        scheme="https",
        host="api.example.test",
        port=443,
        path="/v1",
        status=403,
        decision="refused",
        reason="domain_not_allowed",
    )
    await RedisEgressSink(async_redis).record(fact)
    entries: Any = await async_redis.xrange(SessionKeys(SessionKey(SESSION)).events)
    [(_, fields)] = entries
    assert fields[b"kind"] == b"egress_request"
    assert EventAdapter.validate_json(fields[b"data"]) == fact


async def test_without_an_allowlist_nothing_starts(base_env: dict[str, str], async_redis: aioredis.Redis) -> None:
    settings = load_settings(base_env)
    assert await start_sandbox_egress(settings, async_redis, Sandbox("bwrap")) is None
    allowed = load_settings(base_env | {"SWITCHBOARD_EGRESS__ALLOW": "api.example.test"})
    assert await start_sandbox_egress(allowed, async_redis, None) is None  # no sandbox: no shell tool at all
    assert not (settings.data_path / "egress").exists()  # no CA, no socket


async def test_a_sandbox_that_cannot_reach_the_proxy_gets_the_reason_and_no_proxy(
    base_env: dict[str, str], async_redis: aioredis.Redis
) -> None:
    settings = load_settings(base_env | {"SWITCHBOARD_EGRESS__ALLOW": "api.example.test"})
    gate = await start_sandbox_egress(settings, async_redis, Sandbox("landlock"))
    assert gate is not None and gate.proxy is None
    async with gate.access("assistant", SESSION) as access:
        assert access == (
            "none: a landlock+seccomp sandbox shares the host's network stack and cannot reach the egress proxy"
        )
    assert not (settings.data_path / "egress").exists()


async def test_a_socket_path_too_long_is_refused_with_its_setting(
    base_env: dict[str, str], async_redis: aioredis.Redis, tmp_path: Path
) -> None:
    long = tmp_path / ("x" * (MAX_SOCKET_PATH - len(str(tmp_path)))) / "egress.sock"
    settings = load_settings(
        base_env | {"SWITCHBOARD_EGRESS__ALLOW": "api.example.test", "SWITCHBOARD_SANDBOX__PROXY_SOCKET": str(long)}
    )
    with pytest.raises(ConfigError, match="SWITCHBOARD_SANDBOX__PROXY_SOCKET"):
        await start_sandbox_egress(settings, async_redis, Sandbox("bwrap"))


async def test_the_worker_runs_its_own_proxy_and_closes_it(base_env: dict[str, str]) -> None:
    sandbox_of("bwrap")  # the worker's own detection must find bubblewrap too
    settings = load_settings(base_env | {"SWITCHBOARD_EGRESS__ALLOW": "api.example.test"})
    socket_path = settings.data_path / "egress" / f"worker-{os.getpid()}.sock"
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(settings, stop))
    try:
        deadline = time.monotonic() + 60
        while not socket_path.exists() and time.monotonic() < deadline and not worker.done():
            await asyncio.sleep(0.05)
        assert socket_path.exists(), worker
        assert (await _status_line(socket_path)).startswith(b"HTTP/1.1 407 ")  # the policy answers: no grant
        assert (settings.data_path / "egress" / "ca" / "ca-cert.pem").is_file()
    finally:
        stop.set()
        await asyncio.wait_for(worker, 60)
    assert not socket_path.exists()


def _check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard", "check"], env=env, capture_output=True, text=True, timeout=120
    )


def test_check_shows_the_proxy_and_each_agents_hosts(base_env: dict[str, str]) -> None:
    sandbox_of("bwrap")
    result = _check(base_env | {"SWITCHBOARD_EGRESS__ALLOW": "api.example.test,*.example.org"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "egress:      proxy per worker on " in result.stdout and "worker-<pid>.sock" in result.stdout
    assert "assistant: api.example.test, *.example.org; secrets: none" in result.stdout


def test_check_says_commands_have_no_network_without_an_allowlist(base_env: dict[str, str]) -> None:
    result = _check(base_env)
    assert "egress:      none — no agent has an egress allowlist: shell commands have no network" in result.stdout


def test_check_warns_when_the_sandbox_cannot_reach_the_proxy(base_env: dict[str, str]) -> None:
    sandbox_of("landlock")
    result = _check(
        base_env | {"SWITCHBOARD_EGRESS__ALLOW": "api.example.test", "SWITCHBOARD_SANDBOX__KIND": "landlock"}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "egress:      none — a landlock+seccomp sandbox cannot reach the egress proxy" in result.stdout
    assert "  - egress: a landlock+seccomp sandbox cannot reach the egress proxy" in result.stdout  # a warning


def test_check_refuses_a_socket_path_too_long(base_env: dict[str, str], tmp_path: Path) -> None:
    sandbox_of("bwrap")
    long = tmp_path / ("x" * MAX_SOCKET_PATH) / "egress.sock"
    result = _check(
        base_env | {"SWITCHBOARD_EGRESS__ALLOW": "api.example.test", "SWITCHBOARD_SANDBOX__PROXY_SOCKET": str(long)}
    )
    assert result.returncode == 1
    assert f"the egress proxy's socket path {long} is longer than {MAX_SOCKET_PATH} bytes" in result.stdout


def test_importing_the_worker_loads_no_egress_code() -> None:
    """Start-up stays light: the proxy, h11 and the certificate code load only when the worker starts a proxy."""
    loaded = "sorted(m for m in sys.modules if m.startswith(('switchboard.egress', 'h11')))"
    probe = f"import sys, switchboard.cli.worker; print({loaded})"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout == "[]\n"
