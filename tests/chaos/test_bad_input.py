"""Invariant 8 through the real web tier: bad input gets a clear 4xx and changes nothing in Redis."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from switchboard.channels.telegram.fake.platform import SECRET_HEADER, FakeTelegram, make_update, sign_update

from .harness import SECRET, Gateway, chaos_env, chat_of

pytestmark = [pytest.mark.chaos]

LIMIT = 1024 * 1024
"""``SWITCHBOARD_QUEUE__MAX_BODY_BYTES`` default: 1 MiB."""


async def _snapshot(redis: aioredis.Redis) -> dict[bytes, bytes | None]:
    """Every key with its serialized value (``DUMP``): any write at all shows up as a difference."""
    return {key: await redis.dump(key) async for key in redis.scan_iter(count=1000)}


async def _chunks(data: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def test_bad_requests_are_refused_with_a_clear_status_and_write_nothing(
    base_env: dict[str, str],
    async_redis: aioredis.Redis,
    fake: FakeTelegram,
    gateways: Callable[[dict[str, str]], Gateway],
) -> None:
    gateway = gateways(chaos_env(base_env, fake.base_url))
    await gateway.start()
    assert (await gateway.send(0, 0)).status == 200  # some state to leave untouched
    before = await _snapshot(async_redis)
    valid, headers = sign_update(make_update("hello", chat_id=chat_of(1), update_id=77), SECRET)
    no_secret = {"Content-Type": "application/json"}
    wrong = headers | {SECRET_HEADER: SECRET + "x"}
    oversized = b"{" + b" " * LIMIT + b"}"  # also bad JSON, and sent without a secret: only the size may decide
    cases: list[tuple[str, bytes | AsyncIterator[bytes], dict[str, str], int]] = [
        ("oversized, Content-Length", oversized, no_secret, 413),
        ("oversized, chunked", _chunks(oversized), no_secret, 413),
        ("oversized, valid and signed", valid + b" " * LIMIT, headers, 413),
        ("malformed JSON", b'{"update_id": 1, "message": ', headers, 400),
        ("JSON but not an object", b"[1, 2, 3]", headers, 400),
        ("not a Telegram Update", json.dumps({"update_id": "x", "message": 5}).encode(), headers, 400),
        ("nesting 100,000 deep", b"[" * 100_000 + b"]" * 100_000, headers, 400),
        ("invalid UTF-8", b'{"update_id": 1, "message": {"text": "\xff\xfe"}}', headers, 400),
        ("missing secret", valid, no_secret, 401),
        ("wrong secret", valid, wrong, 403),
        ("malformed JSON and wrong secret", b"{", wrong, 403),
    ]
    results: list[tuple[str, int, int, str]] = []
    for label, body, sent_headers, expected in cases:
        async with gateway.client.post(f"{gateway.url}/webhooks/telegram", data=body, headers=sent_headers) as reply:
            text = await reply.text()
            results.append((label, expected, reply.status, text[:160]))
    print("\n[invariant 8] " + "\n".join(f"{label}: {status}" for label, _e, status, _t in results))
    assert all(status == expected for _l, expected, status, _t in results), results
    for label, _expected, _status, text in results:
        error = json.loads(text)["error"]
        assert error["code"] and error["message"], (label, text)
    assert await _snapshot(async_redis) == before
    assert (await gateway.send(0, 1)).status == 200  # and the gateway still accepts good input afterwards
