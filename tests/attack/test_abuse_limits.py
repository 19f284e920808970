"""Abuse limits that could be bypassed, now guarded.

Behind a trusted proxy, each client's address comes from ``X-Forwarded-For``. Sessions per address are counted per
IPv6 /64 (one host often holds a whole /64); open streams per address were counted per exact address, so a client
rotating through its own /64 — which every IPv6 host can — opened as many streams as it had sessions. Both now count
the same bucket (``queue.limits.address_bucket``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient

from switchboard.settings import load_settings
from switchboard.web.app import create_app

MakeClient = Callable[[web.Application], Awaitable[TestClient[Any, Any]]]


@contextlib.asynccontextmanager
async def _streams(client: TestClient[Any, Any], opens: list[tuple[str, str]]) -> AsyncIterator[list[int]]:
    """Open one stream per ``(token, forwarded address)`` and hold them open; their statuses."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        responses = []
        for token, address in opens:  # one after the other: each holds its slot before the next asks
            resp = await http.get(
                client.make_url("/api/chat/stream"),
                headers={"Authorization": f"Bearer {token}", "X-Forwarded-For": address},
            )
            if resp.status == 200:
                assert (await resp.content.readline()).startswith(b"retry:")
            responses.append(resp)
        try:
            yield [r.status for r in responses]
        finally:
            for resp in responses:
                resp.close()


async def _three_sessions(
    base_env: dict[str, str], aiohttp_client: MakeClient
) -> tuple[TestClient[Any, Any], list[str]]:
    env = base_env | {
        "SWITCHBOARD_TRUSTED_PROXIES": "127.0.0.1",
        "SWITCHBOARD_LIMITS__STREAMS_PER_ADDRESS": "2",
        "SWITCHBOARD_LIMITS__SESSIONS_PER_ADDRESS_PER_HOUR": "0",
    }
    client = await aiohttp_client(create_app(load_settings(env)))
    tokens = []
    for _ in range(3):
        resp = await client.post("/api/chat/sessions")
        tokens.append((await resp.json())["token"])
    return client, tokens


async def test_the_stream_cap_per_address_holds_across_one_ipv6_64(
    base_env: dict[str, str], aiohttp_client: MakeClient
) -> None:
    client, tokens = await _three_sessions(base_env, aiohttp_client)
    opens = [(token, f"2001:db8:1:2::{i + 1}") for i, token in enumerate(tokens)]  # one /64, three addresses
    async with asyncio.timeout(20):  # a guard, not a timing assertion
        async with _streams(client, opens) as statuses:
            assert statuses == [200, 200, 429]  # before: [200, 200, 200]


async def test_streams_from_different_ipv6_64s_are_counted_apart(
    base_env: dict[str, str], aiohttp_client: MakeClient
) -> None:
    client, tokens = await _three_sessions(base_env, aiohttp_client)
    opens = [(token, f"2001:db8:1:{i + 1}::1") for i, token in enumerate(tokens)]  # three /64s
    async with asyncio.timeout(20):  # a guard, not a timing assertion
        async with _streams(client, opens) as statuses:
            assert statuses == [200, 200, 200]
