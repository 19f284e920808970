"""A stranger guessing the operator's password from many addresses, names spelled many ways, all at once.

Real HTTP into the real console app, on the suite's Redis; the client address comes from ``X-Forwarded-For``
behind a trusted proxy (loopback), as it does behind a reverse proxy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tests.console.conftest import Console, console_env, make_console

__all__ = ["console_env", "make_console"]

MakeConsole = Callable[[dict[str, str]], Awaitable[Console]]


async def _guesses(console: Console, addresses: list[str], name: str = "alice") -> list[int]:
    tries = [
        console.client.post(
            "/console/login", json={"name": name, "password": f"guess {i}"}, headers={"X-Forwarded-For": address}
        )
        for i, address in enumerate(addresses)
    ]
    return [resp.status for resp in await asyncio.gather(*tries)]


async def test_rotating_addresses_of_one_ipv6_network_counts_as_one_address(
    console_env: dict[str, str], make_console: MakeConsole
) -> None:
    console = await make_console(
        {
            **console_env,
            "SWITCHBOARD_TRUSTED_PROXIES": "127.0.0.1",
            "SWITCHBOARD_CONSOLE__LOGIN_FAILURES_PER_ADDRESS": "2",
            "SWITCHBOARD_CONSOLE__LOGIN_FAILURES_PER_NAME": "50",
        }
    )
    # one home connection hands out a /64: every guess from a fresh address of it
    statuses = await _guesses(console, [f"2001:db8:1:2:{i:x}::{i + 1:x}" for i in range(8)])
    assert sorted(statuses) == [401] * 2 + [429] * 6, statuses
    assert (await console.login(headers={"X-Forwarded-For": "2001:db8:9::1"})).status == 200  # not locked out


async def test_spellings_of_a_v4_address_are_one_address(
    console_env: dict[str, str], make_console: MakeConsole
) -> None:
    console = await make_console(
        {
            **console_env,
            "SWITCHBOARD_TRUSTED_PROXIES": "127.0.0.1",
            "SWITCHBOARD_CONSOLE__LOGIN_FAILURES_PER_ADDRESS": "2",
            "SWITCHBOARD_CONSOLE__LOGIN_FAILURES_PER_NAME": "50",
        }
    )
    spellings = ["203.0.113.7", "::ffff:203.0.113.7", "[::ffff:cb00:7107]:443", "203.0.113.7:9", " 203.0.113.7"]
    statuses = await _guesses(console, spellings)
    assert sorted(statuses) == [401] * 2 + [429] * 3, statuses


async def test_case_and_unicode_variants_of_the_name_sign_nobody_in(
    console_env: dict[str, str], make_console: MakeConsole
) -> None:
    console = await make_console({**console_env, "SWITCHBOARD_TRUSTED_PROXIES": "127.0.0.1"})
    for variant in ("ALICE", "\u0430lice", "ａｌｉｃｅ"):
        resp = await console.login(variant, headers={"X-Forwarded-For": "198.51.100.9"})
        assert resp.status in (401, 429), (variant, resp.status)
    assert (await console.login(headers={"X-Forwarded-For": "198.51.100.10"})).status == 200
