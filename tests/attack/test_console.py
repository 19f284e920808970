"""A hostile user of the network against the operator console: real HTTP into the real app, on the suite's Redis.

Each defect found has its test here (it failed on the console as first built): a lone surrogate in a password was a
500; concurrent wrong passwords all got checked past the per-name limit; a flood of sign-ins held every thread of
the event loop's default executor, so the gateway stopped serving files; two proxy headers signed in whoever the
client named first. The rest pin what held up under attack (odd paths and methods, CORS, session fixation).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from yarl import URL

from switchboard.web.console.auth import COOKIE
from tests.console.conftest import Console, console, console_env, make_console

__all__ = ["console", "console_env", "make_console"]

MakeConsole = Callable[[dict[str, str]], Awaitable[Console]]
JSON = {"Content-Type": "application/json"}


async def test_a_password_or_name_that_is_not_unicode_text_is_400_not_500(
    console: Console, async_redis: aioredis.Redis
) -> None:
    for body in (b'{"name": "alice", "password": "\\ud800"}', b'{"name": "al\\udfffice", "password": "x"}'):
        resp = await console.client.post("/console/login", data=body, headers=JSON)
        assert resp.status == 400, (body, resp.status, await resp.text())
        assert (await resp.json())["error"]["code"] == "malformed_body"
        assert COOKIE not in resp.cookies
    assert await async_redis.keys("sb:console:login:*") == []
    assert (await console.login()).status == 200  # nothing was counted against alice


async def test_concurrent_wrong_passwords_cannot_outrun_the_per_name_limit(
    console_env: dict[str, str], make_console: MakeConsole
) -> None:
    console = await make_console({**console_env, "SWITCHBOARD_TRUSTED_PROXIES": "127.0.0.1"})
    limit = console.settings.console.login_failures_per_name
    attacker = {"X-Forwarded-For": "203.0.113.7"}
    tries = [
        console.client.post("/console/login", json={"name": "alice", "password": f"guess {i}"}, headers=attacker)
        for i in range(limit + 7)
    ]
    answers = await asyncio.gather(*tries)
    statuses = sorted(resp.status for resp in answers)
    assert statuses.count(401) == limit, statuses  # only `limit` passwords were ever checked
    assert statuses.count(429) == 7, statuses
    assert all(int(resp.headers["Retry-After"]) > 0 for resp in answers if resp.status == 429)
    assert (await console.login(headers={"X-Forwarded-For": "198.51.100.2"})).status == 200  # alice is not locked out


async def test_a_sign_in_that_succeeds_is_not_counted_and_no_counter_lives_forever(
    console: Console, async_redis: aioredis.Redis
) -> None:
    for _ in range(console.settings.console.login_failures_per_name + 2):
        assert (await console.login()).status == 200
    assert (await console.login("alice", "wrong")).status == 401
    keys = [*await async_redis.keys("sb:console:failures:*"), *await async_redis.keys("sb:{console:*}:failures")]
    assert keys
    for key in keys:
        assert 0 < await async_redis.ttl(key) <= console.settings.console.login_window_s


async def test_a_flood_of_sign_ins_does_not_stall_the_gateways_file_serving(
    console_env: dict[str, str], make_console: MakeConsole
) -> None:
    console = await make_console({**console_env, "SWITCHBOARD_CONSOLE__LOGIN_FAILURES_PER_ADDRESS": "1000"})
    default_workers = min(32, (os.cpu_count() or 1) + 4)  # asyncio's default executor
    flood = 2 * default_workers + 8
    finished: list[int] = []
    first = asyncio.Event()

    async def sign_in(i: int) -> None:
        resp = await console.client.post("/console/login", json={"name": f"mallory{i}", "password": "guess"})
        finished.append(resp.status)
        first.set()

    tasks = [asyncio.create_task(sign_in(i)) for i in range(flood)]
    await first.wait()  # the flood is in: every check is queued by now
    page = await console.client.get("/console/static/console.js")  # served through the default executor
    pending = flood - len(finished)
    await asyncio.gather(*tasks)
    assert page.status == 200
    assert set(finished) == {401}
    assert pending >= flood // 2, f"the file waited for {flood - pending} of {flood} password checks"


async def test_two_proxy_headers_sign_nobody_in(console_env: dict[str, str], make_console: MakeConsole) -> None:
    env = {
        **console_env,
        "SWITCHBOARD_CONSOLE__AUTH_HEADER": "X-Forwarded-User",
        "SWITCHBOARD_TRUSTED_PROXIES": "127.0.0.1",
    }
    console = await make_console(env)
    for names in (("alice", "proxied"), ("proxied", "proxied"), ("mallory", "proxied")):
        headers = [("X-Forwarded-User", name) for name in names]
        resp = await console.client.get("/console/api/me", headers=headers)
        assert resp.status == 401, (names, await resp.text())
        assert COOKIE not in resp.cookies
    resp = await console.client.get("/console/api/me", headers={"X-Forwarded-User": "proxied"})
    assert resp.status == 200 and (await resp.json())["operator"] == "proxied"


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "OPTIONS", "PUT", "DELETE", "PATCH", "PROPFIND"])
async def test_no_odd_path_or_method_reaches_anything_anonymously(console: Console, method: str) -> None:
    paths = (
        "/console", "//console", "/CONSOLE", "/Console/api/me", "/console/api/me/", "/console//api/me",
        "/console/api/./me", "/console/static/../api/me", "/console/%2e%2e/console/api/me", "/console/api/%6de",
        "/console/api/sessions", "/console/api/timeline?session=default/a/b/c/d", "/console/api/approvals/decide",
        "/console/api/logout", "/console/static/%2e%2e%2fauth.py", "/console/static/..%5cauth.py",
    )  # fmt: skip
    client = console.client
    for path in paths:
        url = URL(f"http://{client.host}:{client.port}{path}", encoded=True)
        resp = await client.session.request(method, url, allow_redirects=False)
        body = await resp.read()
        assert resp.status in {302, 401, 404, 405}, (method, path, resp.status, body[:200])
        if resp.status == 302:
            assert resp.headers["Location"] == "/console/login"
        assert "Access-Control-Allow-Origin" not in resp.headers
        assert b"csrf" not in body


async def test_a_cookie_planted_before_sign_in_is_not_kept_after(console: Console) -> None:
    planted = await console.login("bob")  # the attacker's own valid sign-in, planted in alice's browser
    bob_token = planted.cookies[COOKIE].value
    resp = await console.login("alice")
    assert resp.status == 200
    assert resp.cookies[COOKIE].value != bob_token
    console.client.session.cookie_jar.clear()
    console.client.session.cookie_jar.update_cookies({COOKIE: bob_token})
    assert (await console.client.get("/console/api/me")).status == 401  # the planted sign-in ended at sign-in


async def test_hostile_write_bodies_are_4xx_and_json(console: Console) -> None:
    assert (await console.login()).status == 200
    key = "default/assistant/webchat/main/c1"
    bodies: list[tuple[str, Any]] = [
        ("sessions/say", b'{"session": "' + key.encode() + b'", "text": "\\ud800"}'),
        ("sessions/say", b'{"session": "default/assistant/webchat/main/\\udc00", "text": "hi"}'),
        ("approvals/decide", b'{"session": "' + key.encode() + b'", "id": "../../x", "verdict": "approve"}'),
        ("effects/resolve", b'{"session": "' + key.encode() + b'", "key": "\\ud800", "outcome": "done"}'),
        ("dead-letters/requeue", b'{"session": "../../../x", "id": "1"}'),
        ("sessions/take-over", b"\xff\xfe\x00"),
        ("sessions/take-over", b"[" * 100_000),
        ("sessions/take-over", b'{"session": "' + b"a/" * 5000 + b'"}'),
    ]
    for path, body in bodies:
        resp = await console.client.post(
            f"/console/api/{path}", data=body, headers={**JSON, "X-CSRF-Token": console.csrf}
        )
        assert 400 <= resp.status < 500, (path, body[:80], resp.status)
        assert resp.content_type == "application/json" and resp.headers["X-Content-Type-Options"] == "nosniff"


async def test_tries_past_the_address_limit_leave_no_key_behind(
    console_env: dict[str, str], make_console: MakeConsole, async_redis: aioredis.Redis
) -> None:
    console = await make_console({**console_env, "SWITCHBOARD_CONSOLE__LOGIN_FAILURES_PER_ADDRESS": "3"})
    statuses = [(await console.login(f"mallory{i}", "guess")).status for i in range(10)]
    assert statuses == [401] * 3 + [429] * 7
    assert len(await async_redis.keys("sb:{console:*}:failures")) == 3  # a name key per checked try only
    assert await async_redis.get(next(iter(await async_redis.keys("sb:console:failures:address:*")))) == b"3"


async def test_a_spoofed_forwarded_for_from_an_untrusted_peer_does_not_reset_the_address_count(
    console_env: dict[str, str], make_console: MakeConsole
) -> None:
    console = await make_console({**console_env, "SWITCHBOARD_CONSOLE__LOGIN_FAILURES_PER_ADDRESS": "3"})
    statuses = [
        (await console.login(f"m{i}", "guess", headers={"X-Forwarded-For": f"203.0.113.{i}"})).status for i in range(5)
    ]
    assert statuses == [401, 401, 401, 429, 429]


async def _raw(console: Console, request: bytes) -> bytes:
    """Send ``request`` as raw bytes (headers no client library would send) and return the status line."""
    reader, writer = await asyncio.open_connection(console.client.host, console.client.port)
    writer.write(request)
    await writer.drain()
    status = await reader.readline()
    writer.close()
    return status.rstrip(b"\r\n")


async def test_a_csrf_header_that_is_not_utf8_is_403_not_500(console: Console) -> None:
    token = (await console.login()).cookies[COOKIE].value.encode()
    for value in (b"\xff\xfe", b"caf\xc3\xa9", console.csrf.encode()[:-1] + b"\xff"):
        status = await _raw(
            console,
            b"POST /console/api/logout HTTP/1.1\r\nHost: console\r\nCookie: " + COOKIE.encode() + b"=" + token
            + b"\r\nX-CSRF-Token: " + value + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )  # fmt: skip
        assert status == b"HTTP/1.1 403 Forbidden", (value, status)
    assert (await console.client.get("/console/api/me")).status == 200  # still signed in: nothing was done


async def test_a_proxy_header_that_is_not_utf8_signs_nobody_in(
    console_env: dict[str, str], make_console: MakeConsole
) -> None:
    env = {
        **console_env,
        "SWITCHBOARD_CONSOLE__AUTH_HEADER": "X-Forwarded-User",
        "SWITCHBOARD_TRUSTED_PROXIES": "127.0.0.1",
    }
    console = await make_console(env)
    for value in (b"prox\xffied", b"proxied\xc3", b"", b" ", b"proxied:alice"):
        status = await _raw(
            console,
            b"GET /console/api/me HTTP/1.1\r\nHost: console\r\nX-Forwarded-User: " + value
            + b"\r\nConnection: close\r\n\r\n",
        )  # fmt: skip
        assert status == b"HTTP/1.1 401 Unauthorized", (value, status)


async def test_an_oversized_body_is_413_before_it_is_sent(console: Console) -> None:
    token = (await console.login()).cookies[COOKIE].value.encode()
    huge = b"Content-Type: application/json\r\nContent-Length: 1000000000\r\nConnection: close\r\n\r\n{"
    login = b"POST /console/login HTTP/1.1\r\nHost: console\r\n" + huge
    write = (
        b"POST /console/api/sessions/say HTTP/1.1\r\nHost: console\r\nCookie: " + COOKIE.encode() + b"=" + token
        + b"\r\nX-CSRF-Token: " + console.csrf.encode() + b"\r\n" + huge
    )  # fmt: skip
    anonymous = b"POST /console/api/sessions/say HTTP/1.1\r\nHost: console\r\n" + huge
    for request, expected in ((login, b"413"), (write, b"413"), (anonymous, b"401")):
        status = await asyncio.wait_for(_raw(console, request), timeout=30)  # never waits for the gigabyte
        assert status.split(b" ")[1] == expected, (request[:40], status)
