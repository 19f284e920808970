"""Console sign-in against the real app and Redis: no anonymous access, passwords, throttling, CSRF, the proxy."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis.asyncio as aioredis

from switchboard.web.console.auth import COOKIE
from tests.console.conftest import OPERATORS_CONFIG, PASSWORD, Console

MakeConsole = Callable[[dict[str, str]], Awaitable[Console]]


async def test_anonymous_api_is_401_and_the_page_redirects_to_sign_in(console: Console) -> None:
    resp = await console.client.get("/console/api/me")
    assert resp.status == 401
    assert (await resp.json())["error"]["code"] == "unauthorized"
    page = await console.client.get("/console", allow_redirects=False)
    assert page.status == 302 and page.headers["Location"] == "/console/login"
    login = await console.client.get("/console/login")
    assert login.status == 200
    assert "script-src 'self'" in login.headers["Content-Security-Policy"]
    assert 'data-testid="login-password"' in await login.text()


async def test_a_forged_cookie_is_anonymous(console: Console) -> None:
    console.client.session.cookie_jar.update_cookies({COOKIE: "not-a-sign-in"})
    resp = await console.client.get("/console/api/me")
    assert resp.status == 401


async def test_sign_in_sets_a_strict_http_only_cookie_and_sign_out_ends_it(console: Console) -> None:
    resp = await console.login()
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["operator"] == "alice" and body["tenants"] == ["default"] and len(body["csrf"]) > 20
    cookie = resp.cookies[COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/console"
    assert not cookie["secure"]  # plain HTTP here; ``auto`` marks it Secure over HTTPS
    me = await console.client.get("/console/api/me")
    assert me.status == 200 and (await me.json())["operator"] == "alice"
    page = await console.client.get("/console")
    assert page.status == 200 and 'data-testid="tab-approvals"' in await page.text()
    out = await console.write("logout", {})
    assert out.status == 200
    assert (await console.client.get("/console/api/me")).status == 401


async def test_the_cookie_is_secure_when_configured(console_env: dict[str, str], make_console: MakeConsole) -> None:
    console = await make_console({**console_env, "SWITCHBOARD_CONSOLE__COOKIE_SECURE": "always"})
    resp = await console.login()
    assert resp.cookies[COOKIE]["secure"]


async def test_a_wrong_password_or_unknown_name_is_401_and_signs_nobody_in(
    console: Console, async_redis: aioredis.Redis
) -> None:
    for name, password in (("alice", "wrong"), ("mallory", PASSWORD), ("proxied", PASSWORD)):
        resp = await console.login(name, password)
        assert resp.status == 401, (name, await resp.text())
        assert (await resp.json())["error"]["code"] == "bad_credentials"
        assert COOKIE not in resp.cookies
    assert await async_redis.keys("sb:console:login:*") == []
    assert (await console.client.get("/console/api/me")).status == 401


async def test_malformed_sign_ins_are_refused_clearly(console: Console) -> None:
    client = console.client
    form = await client.post("/console/login", data={"name": "alice", "password": PASSWORD})
    assert form.status == 415  # a cross-site HTML form cannot post JSON
    for body in ([1], {"name": "alice"}, {"name": 1, "password": PASSWORD}):
        resp = await client.post("/console/login", json=body)
        assert resp.status == 400, body
    big = await client.post("/console/login", json={"name": "alice", "password": "x" * 5000})
    assert big.status == 413


def _from(address: str) -> dict[str, dict[str, str]]:
    """Headers of a sign-in from ``address`` (the app believes the test client's proxy header)."""
    return {"headers": {"X-Forwarded-For": address}}


async def test_wrong_passwords_from_one_address_never_lock_the_operator_out_elsewhere(
    console_env: dict[str, str], make_console: MakeConsole
) -> None:
    console = await make_console({**console_env, "SWITCHBOARD_TRUSTED_PROXIES": "127.0.0.1"})
    limit = console.settings.console.login_failures_per_name
    statuses = [(await console.login("alice", "wrong", **_from("203.0.113.7"))).status for _ in range(limit + 5)]
    assert statuses == [401] * limit + [429] * 5, statuses  # the stranger's address waits
    resp = await console.login("alice", PASSWORD, **_from("203.0.113.7"))
    assert resp.status == 429 and int(resp.headers["Retry-After"]) > 0
    assert (await console.login("alice", PASSWORD, **_from("198.51.100.2"))).status == 200  # before: 429 for 15 min
    assert (await console.login("bob", PASSWORD, **_from("203.0.113.7"))).status == 200  # another name from there


async def test_an_address_guessing_one_name_waits_longer_after_each_failure_in_every_process(
    console_env: dict[str, str], make_console: MakeConsole
) -> None:
    env = {
        **console_env,
        "SWITCHBOARD_TRUSTED_PROXIES": "127.0.0.1",
        "SWITCHBOARD_CONSOLE__LOGIN_FAILURES_PER_NAME": "2",
        "SWITCHBOARD_CONSOLE__LOGIN_DELAY_S": "1",
    }
    console, other = await make_console(env), await make_console(env)  # two gateways on one Redis
    attacker = _from("203.0.113.7")
    assert [(await console.login("alice", "wrong", **attacker)).status for _ in range(2)] == [401, 401]
    waits = []
    for _ in range(2):
        refused = await other.login("alice", "wrong", **attacker)  # the wait holds in the other process too
        assert refused.status == 429, refused.status
        waits.append(int(refused.headers["Retry-After"]))
        await asyncio.sleep(waits[-1] + 0.05)
        assert (await console.login("alice", "wrong", **attacker)).status == 401  # one more guess, then a longer wait
    assert waits == [1, 2], waits
    assert (await console.login("alice", PASSWORD, **_from("198.51.100.2"))).status == 200


async def test_sign_ins_are_throttled_per_address(console_env: dict[str, str], make_console: MakeConsole) -> None:
    console = await make_console({**console_env, "SWITCHBOARD_CONSOLE__LOGIN_FAILURES_PER_ADDRESS": "3"})
    for name in ("n1", "n2", "n3"):
        assert (await console.login(name, "wrong")).status == 401
    assert (await console.login("alice", PASSWORD)).status == 429


async def test_a_write_without_the_csrf_token_is_403(console: Console) -> None:
    assert (await console.login()).status == 200
    resp = await console.write("logout", {}, csrf=False)
    assert resp.status == 403 and (await resp.json())["error"]["code"] == "csrf"
    wrong = await console.client.post("/console/api/logout", headers={"X-CSRF-Token": "x" * 43})
    assert wrong.status == 403
    assert (await console.client.get("/console/api/me")).status == 200  # still signed in: nothing happened


async def test_without_operators_the_console_says_how_to_add_one(
    console: Console, base_env: dict[str, str], make_console: MakeConsole
) -> None:
    bare = await make_console(base_env)
    for path in ("/console", "/console/login"):
        page = await bare.client.get(path)
        assert page.status == 200
        text = await page.text()
        assert "switchboard console hash-password" in text and "console:" in text
    api = await bare.client.get("/console/api/me")
    assert api.status == 403 and (await api.json())["error"]["code"] == "no_operator"
    assert (await bare.login()).status == 403


async def test_the_proxy_header_is_believed_only_from_trusted_proxies(
    console_env: dict[str, str], make_console: MakeConsole
) -> None:
    env = {**console_env, "SWITCHBOARD_CONSOLE__AUTH_HEADER": "X-Forwarded-User"}
    untrusted = await make_console({**env, "SWITCHBOARD_TRUSTED_PROXIES": "10.0.0.0/8"})
    resp = await untrusted.client.get("/console/api/me", headers={"X-Forwarded-User": "alice"})
    assert resp.status == 401
    trusted = await make_console({**env, "SWITCHBOARD_TRUSTED_PROXIES": "127.0.0.1"})
    resp = await trusted.client.get("/console/api/me", headers={"X-Forwarded-User": "proxied"})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["operator"] == "proxied" and body["via"] == "proxy"
    assert resp.cookies[COOKIE]["httponly"]
    # writes still need the CSRF token of that sign-in
    denied = await trusted.client.post("/console/api/logout", headers={"X-Forwarded-User": "proxied"})
    assert denied.status == 403
    unknown = await trusted.client.get("/console/api/me", headers={"X-Forwarded-User": "mallory"})
    assert unknown.status == 401
    # without the header the proxy's sign-in (its cookie is still sent) does not stand on its own
    assert any(cookie.key == COOKIE for cookie in trusted.client.session.cookie_jar)
    assert (await trusted.client.get("/console/api/me")).status == 401


async def test_an_operator_removed_from_the_file_is_signed_out(
    console: Console, console_env: dict[str, str], make_console: MakeConsole, tmp_path: Path
) -> None:
    resp = await console.login("alice")
    assert resp.status == 200
    cookie = resp.cookies[COOKIE].value
    config = tmp_path / "without-alice.yaml"
    config.write_text(OPERATORS_CONFIG.replace("- name: alice", "- name: carol"))
    restarted = await make_console({**console_env, "SWITCHBOARD_CONFIG": str(config)})  # the same Redis
    restarted.client.session.cookie_jar.update_cookies({COOKIE: cookie})
    assert (await restarted.client.get("/console/api/me")).status == 401
    assert (await console.client.get("/console/api/me")).status == 200  # the first app still has alice


async def test_the_console_with_a_trailing_slash_redirects(console: Console) -> None:
    resp = await console.client.get("/console/", allow_redirects=False)
    assert resp.status == 301 and resp.headers["Location"] == "/console"
