"""The demo `make run` serves: the shipped config/switchboard.yaml's web agent, driven by its own starter messages.

A real ``switchboard run`` (web tier, worker, offline model) on the suite's Redis; the web chat's HTTP API opens a
session, sends the five starters the session offers, and reads the stream: a file sent, a shell run, a CodeAct
program, SQL rows, an approval asked.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from switchboard.cli.sandbox import startup_choice
from switchboard.settings import load_settings
from tests.webchat.conftest import read_sse

SHIPPED = Path(__file__).resolve().parents[1] / "config" / "switchboard.yaml"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def demo_env(base_env: dict[str, str]) -> dict[str, str]:
    """The shipped configuration, as `make run` reads it, on the suite's Redis and a free port."""
    return base_env | {
        "SWITCHBOARD_CONFIG": str(SHIPPED),
        "SWITCHBOARD_PORT": str(_free_port()),
        "PYTHONUNBUFFERED": "1",
    }


@contextlib.contextmanager
def running(env: dict[str, str], log_path: Path) -> Iterator[str]:
    """A running ``switchboard run`` whose banner goes to ``log_path``; yields its base URL."""
    log = log_path.open("w+")
    process = subprocess.Popen([sys.executable, "-m", "switchboard", "run"], env=env, stdout=log, stderr=log)
    try:
        for _ in range(1200):  # a bound against hanging, not a timing assertion
            if process.poll() is not None or "Press Ctrl-C" in log_path.read_text():
                break
            time.sleep(0.05)
        assert process.poll() is None and "Press Ctrl-C" in log_path.read_text(), log_path.read_text()
        yield f"http://127.0.0.1:{env['SWITCHBOARD_PORT']}"
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)
        log.close()


@pytest.fixture
def gateway(demo_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """A running ``switchboard run`` of the shipped configuration; yields its base URL."""
    with running(demo_env, tmp_path / "run.log") as url:
        yield url


def _replies(events: list[Any], message_id: str) -> list[dict[str, Any]]:
    return [e.data for e in events if e.event == "message" and e.data and e.data.get("reply_to") == message_id]


async def _until_answered(http: aiohttp.ClientSession, url: str, token: str, ids: list[str]) -> list[Any]:
    """Every stream event once each of ``ids`` got a reply (the last one: its approval question)."""
    events: list[Any] = []
    async with asyncio.timeout(120):  # a bound against hanging, not a timing assertion
        while not all(_replies(events, message_id) for message_id in ids):
            async with http.get(f"{url}/api/chat/stream?token={token}") as resp:
                events = await _drain(resp)
            await asyncio.sleep(0.2)
    return events


async def _drain(resp: aiohttp.ClientResponse) -> list[Any]:
    """What the stream replays now (it stays open: read until it is quiet for a moment)."""
    found: list[Any] = []
    while True:
        try:
            found.extend(await read_sse(resp, 1, limit_s=1.0))
        except TimeoutError:
            return found


async def test_the_starters_show_a_file_a_shell_run_a_program_sql_and_an_approval(
    gateway: str, demo_env: dict[str, str]
) -> None:
    settings = load_settings(demo_env)
    agent = settings.file.agent(settings.file.channels["web"].agent)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gateway}/api/chat/sessions") as resp:
            assert resp.status == 201, await resp.text()
            opened = await resp.json()
        token, starters = opened["token"], opened["agent"]["starters"]
        assert opened["agent"]["id"] == "demo" and agent.profile is not None
        assert starters == [starter.model_dump() for starter in agent.profile.starters] and len(starters) == 5
        assert all(starter["label"] != starter["text"] for starter in starters)  # buttons read as words, not code
        ids = []
        for number, text in enumerate(starter["text"] for starter in starters):
            headers = {"Authorization": f"Bearer {token}"}
            async with http.post(
                f"{gateway}/api/chat/messages", json={"text": text, "client_id": f"s{number}"}, headers=headers
            ) as resp:
                assert resp.status == 202, await resp.text()
                ids.append((await resp.json())["message_id"])
        events = await _until_answered(http, gateway, token, ids)

    sent, shell, program, sql, approval = (_replies(events, message_id) for message_id in ids)
    [file] = [e.data["file"] for e in events if e.event == "message" and e.data and e.data.get("file")]
    assert file["name"] == "hello.md" and file["mime_type"] == "text/markdown"
    assert base64.b64decode(file["data"]).startswith(b"# Hello")
    assert any("The program printed: sent hello.md" in m["text"] for m in sent), sent
    assert any("The program printed: squares: [1, 4, 9, 16, 25, 36, 49] sum: 140" in m["text"] for m in program)
    assert any("| east | 109.5 |" in m["text"] for m in sql), sql
    [asked] = [m for m in approval if m.get("choices")]
    assert "outbox/announcement.md" in asked["approval"]["title"] and len(asked["choices"]) >= 2
    shown = "\n".join(m["text"] for m in shell)
    here = startup_choice(settings)
    if here.sandbox is None:
        pytest.skip(f"this host cannot sandbox shell commands: {'; '.join(here.reasons)}")
    assert "hello from the sandbox" in shown and "42" in shown and "<data" not in shown, shown
    assert "exit 2" in next(line for line in shown.splitlines() if "no-such-file" in line)


def _check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard", "check"], env=env, capture_output=True, text=True, timeout=60
    )


def test_check_names_whether_the_shell_is_on_and_why_not(demo_env: dict[str, str]) -> None:
    here = startup_choice(load_settings(demo_env))
    checked = _check(demo_env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    [line] = [line for line in checked.stdout.splitlines() if line.startswith("shell:")]
    if here.sandbox is not None:
        assert line == f"shell:       on — commands run in a {here.sandbox.label} sandbox"
    else:
        assert "off — no sandbox to isolate commands here: " in line and "demo runs without it" in line, line
    off = _check(demo_env | {"SWITCHBOARD_SANDBOX__KIND": "off"})
    assert off.returncode == 0 and "ok: no problems found" in off.stdout, off.stdout  # served without it
    assert (
        "shell:       off — no sandbox to isolate commands here: the sandbox is turned off "
        "(SWITCHBOARD_SANDBOX__KIND=off); demo runs without it\n"
    ) in off.stdout


async def test_without_a_sandbox_run_says_why_in_its_banner_and_serves_the_demo_without_the_shell(
    demo_env: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "run.log"
    with running(demo_env | {"SWITCHBOARD_SANDBOX__KIND": "off"}, log) as url:
        banner = log.read_text()
        assert (
            "  Shell:     off — no sandbox to isolate commands here: the sandbox is turned off "
            "(SWITCHBOARD_SANDBOX__KIND=off); demo runs without it (see `switchboard check`)\n"
        ) in banner, banner
        async with aiohttp.ClientSession() as http, http.post(f"{url}/api/chat/sessions") as resp:
            assert resp.status == 201 and (await resp.json())["agent"]["id"] == "demo"


def test_the_shipped_demo_database_is_the_one_its_script_builds(tmp_path: Path) -> None:
    built = sqlite3.connect(tmp_path / "shop.sqlite")
    built.executescript((SHIPPED.parent / "demo" / "shop.sql").read_text())
    shipped = sqlite3.connect(f"file:{SHIPPED.parent / 'demo' / 'shop.sqlite'}?mode=ro", uri=True)
    try:
        assert list(shipped.iterdump()) == list(built.iterdump())
    finally:
        built.close()
        shipped.close()
