"""The console's review API under hostile requests: a clear 4xx, never a 500, never a partial write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from switchboard.queue.keys import GlobalKeys
from tests.console.conftest import Console, MakeConsole, make_console
from tests.console.test_review import _sampled, _samples, review_env

__all__ = ["make_console", "review_env"]

KEYS = GlobalKeys()


@pytest.fixture
async def console(review_env: dict[str, str], make_console: MakeConsole) -> Console:
    return await make_console(review_env)


async def _post(console: Console, body: bytes) -> int:
    resp = await console.client.post(
        "/console/api/review/verdict",
        data=body,
        headers={"X-CSRF-Token": console.csrf, "Content-Type": "application/json"},
    )
    return resp.status


async def test_hostile_verdict_bodies_are_refused_and_write_nothing(
    console: Console, async_redis: aioredis.Redis, tmp_path: Path
) -> None:
    session = await _sampled(async_redis, tmp_path)
    assert (await console.login("alice")).status == 200
    run = (await _samples(console))["samples"][0]["run_id"]
    good: dict[str, Any] = {"session": session, "run": run, "verdict": "fail"}
    raw_cases = [
        (b"{not json", 400),
        (b"[1, 2]", 400),
        (b"[" * 4000 + b"]" * 4000, 400),
        (b"\xff\xfe", 400),
        (b"x" * 9000, 413),
    ]
    for body, status in raw_cases:
        assert await _post(console, body) == status, body[:20]
    json_cases: list[tuple[dict[str, Any], int]] = [
        ({**good, "note": 7}, 400),
        ({**good, "note": "a\ud800b"}, 400),
        ({**good, "note": None}, 400),
        ({**good, "run": ["x"]}, 400),
        ({**good, "verdict": "PASS"}, 400),
        ({**good, "session": "not a session key"}, 404),
        ({**good, "session": "../../etc/passwd"}, 404),
        ({**good, "session": "other/assistant/telegram/default/c1"}, 403),
        ({**good, "session": session + "x" * 3000}, 404),
        ({**good, "run": "r" * 3000}, 404),
    ]
    for body, status in json_cases:
        resp = await console.write("review/verdict", body)
        assert resp.status == status, (body, await resp.text())
    assert await async_redis.hlen(KEYS.review_verdicts("default")) == 0


@pytest.mark.parametrize(
    "query",
    [
        "session=",
        "session=nonsense",
        "session=..%2F..%2Fx",
        "session=other%2Fassistant%2Ftelegram%2Fdefault%2Fc1",
        "session=default%2Fassistant%2Ftelegram%2Fdefault%2Fnope",
        "session=%00",
        "session=" + "a" * 10000,
    ],
)
async def test_hostile_transcript_and_case_queries_are_4xx(console: Console, query: str) -> None:
    assert (await console.login("alice")).status == 200
    for path in ("transcript", "case"):
        resp = await console.client.get(f"/console/api/review/{path}?{query}&run=run-x")
        assert 400 <= resp.status < 500, (path, query, resp.status, await resp.text())
