"""Live updates over server-sent events (``GET /console/api/stream``), with the real app, aiohttp client and Redis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import ClientResponse

from switchboard.web.console import stream as console_stream
from tests.console.conftest import Console
from tests.console.conversation import QUESTION, conversation_ref, drain, user_says

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def fast_ticks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ticks and heartbeats a test can wait for."""
    monkeypatch.setattr(console_stream, "TICK_S", 0.1)
    monkeypatch.setattr(console_stream, "HEARTBEAT_S", 0.5)


async def _next(resp: ClientResponse, wanted: str, timeout: float = 10.0) -> Any:
    """The data of the stream's next ``wanted`` event (comments and other events skipped); ``None`` at its end."""

    async def read() -> Any:
        event = ""
        while True:
            raw = await resp.content.readline()
            if not raw:
                return None
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: ") and event == wanted:
                return json.loads(line[len("data: ") :])
            elif line == f": {wanted}":
                return True

    return await asyncio.wait_for(read(), timeout)


async def _until(resp: ClientResponse, wanted: str, check: Callable[[Any], bool]) -> Any:
    """The first ``wanted`` event whose data passes ``check`` (the stream pushes each change on the way)."""
    while True:
        data = await _next(resp, wanted)
        assert data is not None, f"the stream ended before a matching {wanted} event"
        if check(data):
            return data


async def test_the_stream_pushes_sessions_and_the_open_transcript_when_they_change(
    console: Console, async_redis: aioredis.Redis, tmp_path: Path
) -> None:
    session = await user_says(async_redis, conversation_ref(), QUESTION, "evt-1")
    assert (await console.login("alice")).status == 200
    resp = await console.client.get("/console/api/stream", params={"session": session})
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    first = await _next(resp, "sessions")
    assert [(s["key"], s["state"]) for s in first] == [(session, "queued")]
    transcript = await _next(resp, "transcript")
    waiting = [(line["kind"], line["action"], line["text"]) for line in transcript["transcript"]]
    assert waiting == [("user", "queued", QUESTION)]  # not answered yet: read from the inbox
    # the worker answers: the list and the transcript are pushed, no page asked for them
    await drain(async_redis, session, tmp_path / "ws")
    await _until(resp, "sessions", lambda found: [(s["key"], s["state"]) for s in found] == [(session, "done")])
    kinds = ["user", "tool_call", "agent"]
    transcript = await _until(resp, "transcript", lambda t: [line["kind"] for line in t["transcript"]] == kinds)
    assert transcript["transcript"][0]["text"] == QUESTION
    # nothing changes: a heartbeat keeps the connection open
    assert await _next(resp, "heartbeat") is True
    # another tenant's session arriving is not this operator's business
    await user_says(async_redis, conversation_ref(tenant="other"), "hi", "evt-2")
    await asyncio.sleep(0.5)
    mine = await user_says(async_redis, conversation_ref(conversation="c2"), "hello", "evt-3")
    pushed = await _next(resp, "sessions")  # the first change pushed is the new session of its tenant
    assert sorted(s["key"] for s in pushed) == sorted([session, mine])
    resp.close()


async def test_signing_out_ends_the_stream(console: Console) -> None:
    assert (await console.login("alice")).status == 200
    resp = await console.client.get("/console/api/stream")
    assert await _next(resp, "sessions") == []
    assert (await console.write("logout", {})).status == 200
    assert await _next(resp, "signed_out") == {"reason": "the sign-in ended"}
    assert await _next(resp, "sessions") is None  # and the server closed it


async def test_streams_are_scoped_bounded_and_refuse_bad_filters(console: Console, async_redis: aioredis.Redis) -> None:
    theirs = await user_says(async_redis, conversation_ref(tenant="other"), "hi", "evt-1")
    assert (await console.client.get("/console/api/stream")).status == 401
    assert (await console.login("alice")).status == 200
    assert (await console.client.get("/console/api/stream", params={"session": theirs})).status == 403
    assert (await console.client.get("/console/api/stream", params={"state": "idle"})).status == 400
    opened = []
    for _ in range(console_stream.MAX_STREAMS_PER_OPERATOR):
        resp = await console.client.get("/console/api/stream")
        assert resp.status == 200
        assert await _next(resp, "sessions") == []
        opened.append(resp)
    refused = await console.client.get("/console/api/stream")
    assert refused.status == 429
    opened.pop().close()
    for _ in range(50):  # the server notices the closed connection at its next write
        again = await console.client.get("/console/api/stream")
        if again.status == 200:
            break
        await asyncio.sleep(0.2)
    assert again.status == 200
    for resp in [*opened, again]:
        resp.close()
