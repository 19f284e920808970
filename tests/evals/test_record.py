"""``switchboard eval record``: a real conversation (drained by the real drain and runtime) becomes a replay case.

The session is made as in production (ingested, drained by the real drain, the offline model, a tool returning
outside text); the case is recorded by the CLI, loads as a scenario and passes ``switchboard eval run``; edited so the
model decides otherwise, it fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import yaml

from switchboard.cli.evals import eval_command, record_command
from switchboard.control import NotFoundError
from switchboard.control.reading import timeline_of
from switchboard.control.replay import build_case
from switchboard.control.views import TimelineEntry
from switchboard.core.turn import HistoryEntry
from switchboard.evals.scenario import load_scenarios
from switchboard.settings import Settings, load_settings
from switchboard.types import SessionKey
from tests.console.conftest import HASH
from tests.console.conversation import ARGUMENTS, QUESTION, TOOL_OUTPUT, conversation_ref, drain, user_says

CONFIG = f"""
default_agent: assistant
agents:
  assistant:
    profile: {{name: A}}
    instructions: Answer.
    tools: [lookup]
console:
  operators:
    - name: alice
      password_hash: "{HASH}"
      tenants: [default]
    - name: bob
      password_hash: "{HASH}"
      tenants: [other]
    - name: carol
      password_hash: "{HASH}"
      tenants: [default]
      role: viewer
"""
OTHERS_WORDS = "the other tenant's code is 8842"


@pytest.fixture
def env(base_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "record.yaml"
    config.write_text(CONFIG)
    return {**base_env, "SWITCHBOARD_CONFIG": str(config)}


@pytest.fixture
def settings(env: dict[str, str]) -> Settings:
    return load_settings(env)


async def _session(redis: aioredis.Redis, workspace: Path) -> SessionKey:
    """Two turns: a tool call whose result is outside text, then a plain question."""
    session = await user_says(redis, conversation_ref(), QUESTION, "evt-1")
    await drain(redis, session, workspace)
    await user_says(redis, conversation_ref(), "and tomorrow?", "evt-2")
    await drain(redis, session, workspace)
    return session


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    run_env = {**env, "PYTHONPATH": os.getcwd()}
    return subprocess.run(
        [sys.executable, "-m", "switchboard", "eval", *args], env=run_env, capture_output=True, text=True, timeout=120
    )


async def test_a_recorded_session_loads_and_passes_eval_run(
    async_redis: aioredis.Redis, env: dict[str, str], tmp_path: Path
) -> None:
    session = await _session(async_redis, tmp_path / "ws")
    elsewhere = await user_says(async_redis, conversation_ref(tenant="other"), OTHERS_WORDS, "evt-other")
    await drain(async_redis, elsewhere, tmp_path / "ws")
    out = tmp_path / "cases" / "incident.yaml"
    recorded = await asyncio.to_thread(_cli, env, "record", session, "-o", str(out))
    assert recorded.returncode == 0, recorded.stderr
    assert f"wrote {out}" in recorded.stdout
    assert "8842" not in out.read_text()  # nothing of another session, or tenant
    [case] = load_scenarios(out)
    assert case.messages == [QUESTION, "and tomorrow?"]
    assert case.tenant == "default" and case.channel == "telegram" and case.agent.configured == "assistant"
    assert not isinstance(case.model, str)
    assert [[c.tool for c in step.calls] for step in case.model] == [["lookup"], [], []]
    assert case.model[1].answer and "12:00 in Paris" in case.model[1].answer
    [lookup] = case.tools
    assert lookup.name == "lookup" and lookup.untrusted and lookup.side_effect == "read"
    assert [r.result for r in lookup.responses] == [{"page": TOOL_OUTPUT}]
    checks = {i.check: i for i in case.invariants}
    assert checks["tool_used"].model_dump()["arguments"] == ARGUMENTS
    assert {"no_unapproved_write", "no_repeated_write", "budget_respected", "answer_contains"} <= set(checks)
    assert checks["tenant_kept"].model_dump()["others"] == ["other"]  # bob's tenant, never in this session

    ran = await asyncio.to_thread(_cli, env, "run", str(out), "--json", str(tmp_path / "results.json"))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    [result] = json.loads((tmp_path / "results.json").read_text())["results"]
    assert result["score"] == 1.0
    assert [c["tool"] for c in result["trajectory"]["calls"]] == ["lookup"]
    assert "12:00 in Paris" in result["trajectory"]["calls"][0]["result"]  # the recorded response, replayed

    # the same case with the model deciding otherwise (no tool call) is a regression the recorded checks catch
    raw = yaml.safe_load(out.read_text())
    raw["model"] = [{"answer": "I did not look."}, *raw["model"][2:]]
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(raw))
    failed = await asyncio.to_thread(_cli, env, "run", str(edited))
    assert failed.returncode == 1
    assert "tool_used:lookup" in failed.stdout


async def test_record_prints_the_case_without_out(
    async_redis: aioredis.Redis, settings: Settings, tmp_path: Path
) -> None:
    session = await _session(async_redis, tmp_path / "ws")
    printed = StringIO()
    code = await asyncio.to_thread(record_command, settings, session, stdout=printed)
    assert code == 0
    assert yaml.safe_load(printed.getvalue())["messages"] == [QUESTION, "and tomorrow?"]


async def test_record_up_to_one_run(async_redis: aioredis.Redis, settings: Settings, tmp_path: Path) -> None:
    session = await _session(async_redis, tmp_path / "ws")
    received = [e for e in await timeline_of(async_redis, session, 100) if e.kind == "message_received"]
    message_id = received[0].data["message_id"]
    out = tmp_path / "one.yaml"
    assert await asyncio.to_thread(record_command, settings, session, out=out, run_id=f"run-{message_id}") == 0
    [case] = load_scenarios(out)
    assert case.messages == [QUESTION]
    code = await asyncio.to_thread(eval_command, [out], agents=settings.file.agents, out=StringIO())
    assert code == 0


@pytest.mark.parametrize(
    ("target", "operator", "message"),
    [
        ("default/assistant/telegram/default/nobody", None, "no such session"),
        ("not-a-session", None, "not a session key"),
        (None, "bob", "may not act on tenant 'default'"),
        (None, "carol", "may not read messages"),
    ],
    ids=["missing", "malformed", "other-tenant", "viewer"],
)
async def test_record_refuses_and_writes_nothing(
    async_redis: aioredis.Redis,
    settings: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: str | None,
    operator: str | None,
    message: str,
) -> None:
    session = await _session(async_redis, tmp_path / "ws")
    out = tmp_path / "never.yaml"
    code = await asyncio.to_thread(record_command, settings, target or session, out=out, operator=operator)
    assert code == 1
    assert message in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".never.yaml*"))


def test_a_failed_call_and_a_write_are_recorded_as_they_ran() -> None:
    """A failure replays as the tool's error; a write that ran without approval is allowed, once, by name."""
    call = {"id": "c1", "name": "send_invoice", "arguments": {"to": "x"}}
    failed = {"id": "c2", "name": "lookup", "arguments": {}}
    history = [
        HistoryEntry(role="user", text="bill x", message_id="m1"),
        HistoryEntry(role="assistant", text="", meta={"tool_calls": [failed]}),
        HistoryEntry(
            role="tool",
            text=json.dumps({"error": "down", "error_class": "transient", "hint": "..."}),
            meta={"call_id": "c2", "tool": "lookup", "ok": False, "side_effect": "read"},
        ),
        HistoryEntry(role="assistant", text="", meta={"tool_calls": [call]}),
        HistoryEntry(
            role="tool",
            text='{"id": 7}',
            meta={"call_id": "c1", "tool": "send_invoice", "ok": True, "side_effect": "write"},
        ),
        HistoryEntry(role="assistant", text="Sent.", message_id="m1"),
    ]
    events = [
        TimelineEntry(
            id="1-0", at=1.0, kind="message_received", trace_id=None, data={"message_id": "m1", "sender": "42"}
        )
    ]
    case: dict[str, Any] = build_case("acme/billing/web/default/c9", history, events, others=["acme", "globex"])
    tools = {t["name"]: t for t in case["tools"]}
    assert tools["lookup"]["responses"] == [{"error": "down", "error_class": "transient"}]
    assert tools["send_invoice"]["side_effect"] == "write" and tools["send_invoice"]["responses"] == [
        {"result": {"id": 7}}
    ]
    checks = {i["check"]: i for i in case["invariants"]}
    assert checks["no_unapproved_write"]["allowed"] == ["send_invoice"]
    assert checks["tenant_kept"]["others"] == ["globex"]
    assert checks["budget_respected"] == {"check": "budget_respected", "max_steps": 3, "max_tool_calls": 2}


def test_a_run_is_found_by_any_of_its_messages() -> None:
    """A message the agent never answered (held by an operator) goes with the next turn, whose run it does not name."""
    history = [
        HistoryEntry(role="user", text="hello?", message_id="m1"),
        HistoryEntry(role="user", text="anyone?", message_id="m2"),
        HistoryEntry(role="assistant", text="Here.", message_id="m2"),
        HistoryEntry(role="user", text="thanks", message_id="m3"),
        HistoryEntry(role="assistant", text="You are welcome.", message_id="m3"),
    ]
    case = build_case("acme/desk/web/default/c1", history, [], run_id="run-m2")
    assert case["messages"] == ["hello?\nanyone?"] and case["model"] == [{"answer": "Here."}]
    with pytest.raises(NotFoundError, match="no answered run 'run-m9'"):
        build_case("acme/desk/web/default/c1", history, [], run_id="run-m9")
