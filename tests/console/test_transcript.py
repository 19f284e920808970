"""The session transcript: a real conversation (drained by the real drain) read back line by line, per role.

Operators' actions go through the console's API and are applied by the drain, as in production.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.control import SESSION_STATES
from switchboard.queue.eventlog import read_events
from switchboard.types import SessionKey
from tests.console.conftest import HASH, OPERATORS_CONFIG, Console, MakeConsole
from tests.console.conversation import (
    ARGUMENTS,
    QUESTION,
    conversation_ref,
    drain,
    user_says,
)

VIEWER = f"""
    - name: carol
      password_hash: "{HASH}"
      tenants: [default]
      role: viewer
"""


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return tmp_path / "ws"


@pytest.fixture
async def console(base_env: dict[str, str], tmp_path: Path, make_console: MakeConsole) -> Console:
    """The console of an app with the three operators and carol, a viewer of tenant default."""
    config = tmp_path / "viewer.yaml"
    config.write_text(OPERATORS_CONFIG.rstrip("\n") + VIEWER)
    return await make_console({**base_env, "SWITCHBOARD_CONFIG": str(config)})


async def _conversation(console: Console, redis: aioredis.Redis, workspace: Path) -> SessionKey:
    """A user's question, a tool call and the answer; then alice takes over, writes, and hands back."""
    session = await user_says(redis, conversation_ref(), QUESTION, "evt-q")
    await drain(redis, session, workspace)
    assert (await console.login("alice")).status == 200
    for path, extra in (("take-over", {}), ("say", {"text": "Hello, Alice here."}), ("hand-back", {})):
        resp = await console.write(f"sessions/{path}", {"session": session, **extra})
        assert resp.status == 202, await resp.text()
        await drain(redis, session, workspace)
    return session


async def _transcript(console: Console, session: str) -> dict[str, Any]:
    resp = await console.client.get("/console/api/transcript", params={"session": session})
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def test_the_transcript_shows_the_conversation_in_order(
    console: Console, async_redis: aioredis.Redis, workspace: Path
) -> None:
    session = await _conversation(console, async_redis, workspace)
    body = await _transcript(console, session)
    lines = body["transcript"]
    assert [(line["kind"], line["action"]) for line in lines] == [
        ("user", ""),
        ("tool_call", ""),
        ("agent", ""),
        ("operator", "take_over"),
        ("operator", "say"),
        ("operator", "hand_back"),
    ]
    user, call, agent, _, said, _ = lines
    assert (user["text"], user["actor"]) == (QUESTION, "42")
    assert (call["tool"], call["arguments"], call["ok"]) == ("lookup", ARGUMENTS, True)
    assert '<img src=x onerror=\\"alert(1)\\"> 12:00 in Paris' in call["result"]  # as the model saw it
    assert call["untrusted"] is True  # outside text: the page shows it as data
    assert "lookup returned" in agent["text"]
    assert (said["actor"], said["text"]) == ("console:alice", "Hello, Alice here.")
    # each line opens to its facts, and every fact of the log is in exactly one line
    assert [e["kind"] for e in user["events"]][:2] == ["message_received", "run_queued"]
    assert [e["kind"] for e in call["events"]] == ["tool_called"]
    assert "reply_sent" in [e["kind"] for e in agent["events"]]
    assert "control_changed" in [e["kind"] for e in lines[3]["events"]]
    shown = [e["id"] for line in lines for e in line["events"]]
    assert sorted(shown) == sorted(e["id"] for e in await read_events(async_redis, session, 1000))
    assert body["state"] == "done" and body["redacted"] is False
    # the raw timeline stays where it was
    timeline = await console.client.get("/console/api/timeline", params={"session": session})
    assert timeline.status == 200


async def test_a_viewer_sees_the_shape_but_not_the_words(
    console: Console, async_redis: aioredis.Redis, workspace: Path
) -> None:
    session = await _conversation(console, async_redis, workspace)
    assert (await console.login("carol")).status == 200
    me = await (await console.client.get("/console/api/me")).json()
    assert me["role"] == "viewer"
    body = await _transcript(console, session)
    assert body["redacted"] is True
    lines = body["transcript"]
    assert [line["kind"] for line in lines] == ["user", "tool_call", "agent", "operator", "operator", "operator"]
    raw = str(body)
    for secret in (QUESTION, "onerror", "Hello, Alice here.", "Paris"):
        assert secret not in raw, secret
    assert all(line["redacted"] for line in lines if line["kind"] in {"user", "tool_call", "agent"})
    assert lines[1]["tool"] == "lookup"  # what happened stays visible
    # a viewer cannot act
    resp = await console.write("sessions/take-over", {"session": session})
    assert resp.status == 403 and (await resp.json())["error"]["code"] == "viewer"


async def test_another_tenants_transcript_is_403_and_a_missing_session_400(
    console: Console, async_redis: aioredis.Redis, workspace: Path
) -> None:
    session = await _conversation(console, async_redis, workspace)
    assert (await console.login("bob")).status == 200
    assert (await console.client.get("/console/api/transcript", params={"session": session})).status == 403
    assert (await console.client.get("/console/api/transcript")).status == 400
    unknown = await console.client.get("/console/api/transcript", params={"session": "other/a/web/default/x"})
    assert unknown.status == 404


async def test_sessions_are_filtered_by_channel_agent_tenant_and_state(
    console: Console, async_redis: aioredis.Redis, workspace: Path
) -> None:
    done = await user_says(async_redis, conversation_ref(channel="telegram", conversation="t1"), "hi", "e1")
    await drain(async_redis, done, workspace)
    web = await user_says(async_redis, conversation_ref(channel="web", conversation="w1"), "hi", "e2")
    helper = await user_says(async_redis, conversation_ref(agent="helper", conversation="h1"), "hi", "e3")
    await user_says(async_redis, conversation_ref(tenant="other", conversation="o1"), "hi", "e4")
    assert (await console.login("alice")).status == 200

    async def keys(**query: str) -> list[str]:
        resp = await console.client.get("/console/api/sessions", params=query)
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        assert body["states"] == list(SESSION_STATES)
        return sorted(s["key"] for s in body["sessions"])

    assert await keys() == sorted([done, web, helper])
    assert await keys(channel="web") == [web]
    assert await keys(agent="helper") == [helper]
    assert await keys(tenant="default", channel="telegram") == sorted([done, helper])
    assert await keys(state="done") == [done]
    assert await keys(state="queued") == sorted([web, helper])
    assert await keys(channel="web", state="done") == []
    rows = (await (await console.client.get("/console/api/sessions")).json())["sessions"]
    assert {r["key"]: r["channel"] for r in rows}[web] == "web"
    bad = await console.client.get("/console/api/sessions", params={"state": "idle"})
    assert bad.status == 400 and "done" in (await bad.json())["error"]["message"]
    assert (await console.client.get("/console/api/sessions", params={"tenant": "other"})).status == 403
