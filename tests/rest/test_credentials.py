"""Short-lived credentials: egress obtains OAuth2 tokens itself (RFC 6749 §4.4, RFC 8693) and injects them.

A local OAuth2 token server (form-encoded POST, Basic or body client authentication, JSON answers) and an API that
checks the bearer token, both over real HTTPS on 127.0.0.2 under a test CA; declared REST tools reach the API
through the egress forwarder, which fetches tokens through its own guarded client.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from switchboard.cli.agents import agents_command
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.tools.rest.declaration import RestToolSpec
from switchboard.egress.ca import DeploymentCA
from switchboard.egress.client import EgressClient
from switchboard.egress.events import RedisEgressSink
from switchboard.egress.forward import Forwarder
from switchboard.egress.policy import EgressPolicy
from switchboard.egress.proxy import build_proxy
from switchboard.egress.transport import EgressTransport, register_rest_tools, rest_problems
from switchboard.errors import ConfigError
from switchboard.queue.keys import SessionKeys
from switchboard.settings import Settings, load_settings
from switchboard.types import SessionKey
from tests.egress.conftest import PUBLIC, ListSink, MapResolver, _serve

CLIENT_SECRET = "client-REAL-secret-7c6b5a4d3e"
ACME_SECRET = "acme-REAL-secret-1a2b3c4d5e"
SUBJECT_TOKEN = "subject-REAL-token-9f8e7d6c"

YAML = """
default_agent: shop
agents:
  shop:
    profile: {{name: Shop, description: test}}
    instructions: test
    egress:
      allow: [api.shop.test]
    rest_tools:
      - name: list_orders
        description: List orders.
        method: GET
        url: https://api.shop.test:{api}/v1/orders
        headers: {{Authorization: "Bearer {{{{credential:SHOP}}}}"}}
      - name: list_orders_narrow
        description: List orders with a narrower token.
        method: GET
        url: https://api.shop.test:{api}/v1/orders
        headers: {{Authorization: "Bearer {{{{credential:SHOP:orders.read}}}}"}}
      - name: list_orders_wide
        description: Ask for more than the credential allows.
        method: GET
        url: https://api.shop.test:{api}/v1/orders
        headers: {{Authorization: "Bearer {{{{credential:SHOP:admin}}}}"}}
      - name: echo_auth
        description: What the API saw (an API that echoes credentials).
        method: GET
        url: https://api.shop.test:{api}/v1/echo
        headers: {{Authorization: "Bearer {{{{credential:SHOP}}}}"}}
      - name: exchanged_orders
        description: List orders with an exchanged token.
        method: GET
        url: https://api.shop.test:{api}/v1/orders
        headers: {{Authorization: "Bearer {{{{credential:EXCHANGED}}}}"}}
"""


@dataclass
class AuthServer:
    """An RFC 6749 token endpoint: client credentials and token exchange; it remembers every token it issued."""

    clients: dict[str, str] = field(default_factory=lambda: {"shop-client": CLIENT_SECRET, "acme-client": ACME_SECRET})
    granted: str = "orders.read orders.write"
    expires_in: int | str = 3600
    delay_s: float = 0.0
    requests: list[dict[str, str]] = field(default_factory=list)
    issued: dict[str, dict[str, str]] = field(default_factory=dict)
    revoked: set[str] = field(default_factory=set)
    counter: itertools.count[int] = field(default_factory=itertools.count)

    def app(self) -> web.Application:
        async def token(request: web.Request) -> web.Response:
            form = dict(await request.post())
            self.requests.append({k: str(v) for k, v in form.items()})
            await asyncio.sleep(self.delay_s)
            if request.content_type != "application/x-www-form-urlencoded":
                return web.json_response({"error": "invalid_request"}, status=400)
            auth = request.headers.get("Authorization", "")
            if auth.startswith("Basic "):
                user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
                client_id, secret = unquote(user), unquote(password)
            else:
                client_id, secret = str(form.get("client_id", "")), str(form.get("client_secret", ""))
            if self.clients.get(client_id) != secret:
                return web.json_response(
                    {"error": "invalid_client", "error_description": "Client authentication failed"},
                    status=401,
                    headers={"WWW-Authenticate": "Basic"},
                )
            scope = str(form.get("scope", self.granted))
            if not set(scope.split()) <= set(self.granted.split()):
                return web.json_response({"error": "invalid_scope"}, status=400)
            grant = form.get("grant_type")
            if grant == "urn:ietf:params:oauth:grant-type:token-exchange":
                if form.get("subject_token") != SUBJECT_TOKEN:
                    return web.json_response({"error": "invalid_grant"}, status=400)
            elif grant != "client_credentials":
                return web.json_response({"error": "unsupported_grant_type"}, status=400)
            value = f"at-{next(self.counter)}-{client_id}-Zq81xv"
            self.issued[value] = {"client": client_id, "scope": scope, "grant": str(grant)}
            return web.json_response(
                {"access_token": value, "token_type": "Bearer", "expires_in": self.expires_in, "scope": scope},
                headers={"Cache-Control": "no-store"},
            )

        app = web.Application()
        app.router.add_post("/oauth/token", token)
        return app


@dataclass
class OrdersApi:
    """An API that accepts only tokens the auth server issued and has not revoked."""

    auth: AuthServer
    seen: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        def bearer(request: web.Request) -> dict[str, str] | None:
            value = request.headers.get("Authorization", "").removeprefix("Bearer ")
            self.seen.append(value)
            if value in self.auth.revoked:
                return None
            return self.auth.issued.get(value)

        async def orders(request: web.Request) -> web.Response:
            who = bearer(request)
            if who is None:
                return web.json_response({"error": "invalid_token"}, status=401)
            return web.json_response({"orders": [{"id": "O1"}], "client": who["client"], "scope": who["scope"]})

        async def echo(request: web.Request) -> web.Response:
            bearer(request)
            return web.json_response({"seen": request.headers.get("Authorization", "")})

        app = web.Application()
        app.router.add_get("/v1/orders", orders)
        app.router.add_get("/v1/echo", echo)
        return app


@dataclass
class World:
    settings: Settings
    auth: AuthServer
    api: OrdersApi
    forwarder: Forwarder
    gateway: ToolGateway
    now: list[float]
    """The credential broker's clock (seconds)."""
    workspace: Path
    api_url: str

    def ctx(self, tenant: str = "default") -> ToolContext:
        return ToolContext(
            session_key=SessionKey(f"{tenant}/shop/web/main/conv-1"),
            tenant=tenant,
            run_id="run-1",
            actor="web:u1",
            workspace=self.workspace,
            idempotency_key="",
            agent="shop",
        )


def _tls(ca: DeploymentCA, host: str, where: Path) -> ssl.SSLContext:
    cert, key = ca.issue(host)
    where.write_bytes(cert + key)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(where)
    return tls


def _env(tmp_path: Path, ports: tuple[int, int], ca: DeploymentCA, *, yaml: str = YAML, **extra: str) -> dict[str, str]:
    api, auth = ports
    config = tmp_path / "switchboard.yaml"
    config.write_text(yaml.format(api=api))
    token_url = f"https://auth.shop.test:{auth}/oauth/token"
    env = {
        "SWITCHBOARD_CONFIG": str(config),
        "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
        "SWITCHBOARD_EGRESS__PORTS": f"443,{api},{auth}",
        "SWITCHBOARD_EGRESS__INTERNAL_NETWORKS": f"{PUBLIC}/32",
        "SWITCHBOARD_EGRESS__UPSTREAM_CA_FILE": str(ca.cert_path),
        "SWITCHBOARD_EGRESS__SECRETS__SHOP_CLIENT__VALUE": CLIENT_SECRET,
        "SWITCHBOARD_EGRESS__SECRETS__SHOP_CLIENT__DOMAINS": "auth.shop.test",
        "SWITCHBOARD_EGRESS__SECRETS__ACME_CLIENT__VALUE": ACME_SECRET,
        "SWITCHBOARD_EGRESS__SECRETS__ACME_CLIENT__DOMAINS": "auth.shop.test",
        "SWITCHBOARD_EGRESS__SECRETS__SUBJECT__VALUE": SUBJECT_TOKEN,
        "SWITCHBOARD_EGRESS__SECRETS__SUBJECT__DOMAINS": "auth.shop.test",
        "SWITCHBOARD_EGRESS__CREDENTIALS__SHOP__TOKEN_URL": token_url,
        "SWITCHBOARD_EGRESS__CREDENTIALS__SHOP__CLIENT_ID": "shop-client",
        "SWITCHBOARD_EGRESS__CREDENTIALS__SHOP__CLIENT_SECRET_SECRET": "SHOP_CLIENT",
        "SWITCHBOARD_EGRESS__CREDENTIALS__SHOP__SCOPE": "orders.read orders.write",
        "SWITCHBOARD_EGRESS__CREDENTIALS__SHOP__HOSTS": "api.shop.test",
        "SWITCHBOARD_EGRESS__CREDENTIALS__SHOP__TENANTS__ACME__CLIENT_ID": "acme-client",
        "SWITCHBOARD_EGRESS__CREDENTIALS__SHOP__TENANTS__ACME__CLIENT_SECRET_SECRET": "ACME_CLIENT",
        "SWITCHBOARD_EGRESS__CREDENTIALS__EXCHANGED__TYPE": "oauth2_token_exchange",
        "SWITCHBOARD_EGRESS__CREDENTIALS__EXCHANGED__TOKEN_URL": token_url,
        "SWITCHBOARD_EGRESS__CREDENTIALS__EXCHANGED__CLIENT_ID": "shop-client",
        "SWITCHBOARD_EGRESS__CREDENTIALS__EXCHANGED__CLIENT_SECRET_SECRET": "SHOP_CLIENT",
        "SWITCHBOARD_EGRESS__CREDENTIALS__EXCHANGED__CLIENT_AUTH": "body",
        "SWITCHBOARD_EGRESS__CREDENTIALS__EXCHANGED__SUBJECT_TOKEN_SECRET": "SUBJECT",
        "SWITCHBOARD_EGRESS__CREDENTIALS__EXCHANGED__AUDIENCE": "https://api.shop.test",
        "SWITCHBOARD_EGRESS__CREDENTIALS__EXCHANGED__HOSTS": "api.shop.test",
    }
    env.update(extra)
    return env


@contextlib.asynccontextmanager
async def _servers(tmp_path: Path) -> AsyncIterator[tuple[AuthServer, OrdersApi, tuple[int, int], DeploymentCA]]:
    ca = DeploymentCA.load_or_create(tmp_path / "upstream-ca")
    auth = AuthServer()
    api = OrdersApi(auth)
    api_runner, api_port = await _serve(api.app(), PUBLIC, 0, _tls(ca, "api.shop.test", tmp_path / "api.pem"))
    auth_runner, auth_port = await _serve(auth.app(), PUBLIC, 0, _tls(ca, "auth.shop.test", tmp_path / "auth.pem"))
    try:
        yield auth, api, (api_port, auth_port), ca
    finally:
        await api_runner.cleanup()
        await auth_runner.cleanup()


@pytest.fixture
async def world(tmp_path: Path, async_redis: aioredis.Redis) -> AsyncIterator[Callable[..., World]]:
    forwarders: list[Forwarder] = []
    async with _servers(tmp_path) as (auth, api, ports, ca):

        def build(auth_address: str = PUBLIC, **extra: str) -> World:
            settings = load_settings(_env(tmp_path, ports, ca, **extra))
            resolver = MapResolver({"api.shop.test": [[PUBLIC]], "auth.shop.test": [[auth_address]]})
            sink = RedisEgressSink(async_redis)
            forwarder = Forwarder(EgressPolicy.from_settings(settings), settings.egress, sink, resolver=resolver)
            now = [1000.0]
            forwarder.credentials.clock = lambda: now[0]
            forwarders.append(forwarder)
            registry = ToolRegistry()
            register_rest_tools(registry, settings, EgressTransport(forwarder))
            gateway = ToolGateway(registry, workspace_root=tmp_path / "ws-root", backoff_base_s=0.0)
            workspace = tmp_path / "ws-root" / "ws"
            return World(settings, auth, api, forwarder, gateway, now, workspace, f"https://api.shop.test:{ports[0]}")

        yield build
        for forwarder in forwarders:
            await forwarder.close()


async def _event_log(redis: aioredis.Redis, tenant: str = "default") -> str:
    entries = await redis.xrange(SessionKeys(SessionKey(f"{tenant}/shop/web/main/conv-1")).events)
    return repr(entries)


async def test_one_token_serves_concurrent_calls_and_never_shows(
    world: Callable[..., World], async_redis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    w = world()
    w.auth.delay_s = 0.2  # every call arrives while the first fetch is still under way
    outs = await asyncio.gather(*(w.gateway.call("list_orders", {}, w.ctx()) for _ in range(8)))
    assert all(out.ok for out in outs), [out.error for out in outs]
    assert len(w.auth.requests) == 1
    (token,) = w.auth.issued
    assert w.api.seen == [token] * 8
    assert outs[0].value == {"orders": [{"id": "O1"}], "client": "shop-client", "scope": "orders.read orders.write"}
    assert w.auth.requests[0] == {"grant_type": "client_credentials", "scope": "orders.read orders.write"}
    log = await _event_log(async_redis)
    assert "credential:SHOP" in log and "auth.shop.test" in log  # the token request is a recorded fact too
    for where in ([out.model_dump_json() for out in outs], log, caplog.text):
        assert token not in str(where)
        assert CLIENT_SECRET not in str(where)


@pytest.mark.parametrize("expires_in", [100, "100"])  # some servers send a string
async def test_a_token_is_replaced_shortly_before_it_expires(
    world: Callable[..., World], expires_in: int | str
) -> None:
    w = world()
    w.auth.expires_in = expires_in  # refresh margin 30 s: used for 70 s
    assert (await w.gateway.call("list_orders", {}, w.ctx())).ok
    w.now[0] += 69
    assert (await w.gateway.call("list_orders", {}, w.ctx())).ok
    assert len(w.auth.requests) == 1
    w.now[0] += 2
    assert (await w.gateway.call("list_orders", {}, w.ctx())).ok
    assert len(w.auth.requests) == 2
    first, second = w.auth.issued
    assert w.api.seen == [first, first, second]


async def test_a_401_from_the_api_replaces_the_token_once(world: Callable[..., World]) -> None:
    w = world()
    assert (await w.gateway.call("list_orders", {}, w.ctx())).ok
    (first,) = w.auth.issued
    w.auth.revoked.add(first)  # revoked before it expired
    out = await w.gateway.call("list_orders", {}, w.ctx())
    assert out.ok, out.error
    second = list(w.auth.issued)[1]
    assert w.api.seen == [first, first, second]
    w.auth.revoked.add(second)
    w.auth.clients["shop-client"] = "rotated"  # and no new token can be had: one refresh, then the error
    out = await w.gateway.call("list_orders", {}, w.ctx())
    assert (out.ok, out.error_class) == (False, "auth")
    assert "invalid_client" in (out.error or "")
    assert w.api.seen == [first, first, second, second]


async def test_each_tenant_gets_its_own_token_and_client(world: Callable[..., World]) -> None:
    w = world()
    default = await w.gateway.call("list_orders", {}, w.ctx("default"))
    acme = await w.gateway.call("list_orders", {}, w.ctx("acme"))
    other = await w.gateway.call("list_orders", {}, w.ctx("globex"))
    assert (default.value["client"], acme.value["client"], other.value["client"]) == (
        "shop-client",
        "acme-client",
        "shop-client",
    )
    assert len(set(w.api.seen)) == 3 and len(w.auth.requests) == 3
    assert (await w.gateway.call("list_orders", {}, w.ctx("acme"))).ok
    assert len(w.auth.requests) == 3 and w.api.seen[-1] == w.api.seen[1]


async def test_a_declaration_narrows_the_scope_and_may_not_widen_it(world: Callable[..., World]) -> None:
    w = world()
    narrow = await w.gateway.call("list_orders_narrow", {}, w.ctx())
    assert narrow.ok and narrow.value["scope"] == "orders.read"
    wide = await w.gateway.call("list_orders_wide", {}, w.ctx())
    assert (wide.ok, wide.error_class) == (False, "permanent")
    assert "credential_scope" in (wide.error or "")
    assert [r["scope"] for r in w.auth.requests] == ["orders.read"]


async def test_a_bad_client_secret_is_a_clear_tool_error(
    world: Callable[..., World], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    w = world(SWITCHBOARD_EGRESS__SECRETS__SHOP_CLIENT__VALUE="wrong-secret-value")
    out = await w.gateway.call("list_orders", {}, w.ctx())
    assert (out.ok, out.error_class) == (False, "auth")
    assert out.error is not None
    assert "answered HTTP 401 invalid_client: Client authentication failed" in out.error
    assert "check client_id and the client secret" in out.error
    assert out.error.startswith(
        "list_orders failed: could not authenticate to api.shop.test: credential SHOP: the token endpoint https://"
    )
    assert "Traceback" not in out.error and "wrong-secret-value" not in out.error + caplog.text
    assert "egress: no token for tenant default: credential SHOP: the token endpoint" in caplog.text
    assert w.api.seen == []


async def test_the_token_exchange_sends_the_subject_token_and_body_client_auth(world: Callable[..., World]) -> None:
    w = world()
    out = await w.gateway.call("exchanged_orders", {}, w.ctx())
    assert out.ok, out.error
    (sent,) = w.auth.requests
    assert sent == {
        "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
        "subject_token": SUBJECT_TOKEN,
        "subject_token_type": "urn:ietf:params:oauth:token-type:access_token",
        "requested_token_type": "urn:ietf:params:oauth:token-type:access_token",
        "audience": "https://api.shop.test",
        "client_id": "shop-client",
        "client_secret": CLIENT_SECRET,
    }
    assert next(iter(w.auth.issued.values()))["grant"].endswith("token-exchange")


async def test_an_echoed_token_comes_back_as_its_placeholder(world: Callable[..., World]) -> None:
    w = world()
    out = await w.gateway.call("echo_auth", {}, w.ctx())
    assert out.value == {"seen": "Bearer {{credential:SHOP}}"}
    assert w.api.seen[0] in w.auth.issued


async def test_a_credential_goes_only_to_its_hosts_only_in_headers(world: Callable[..., World]) -> None:
    w = world()
    api = w.api_url
    grant = w.forwarder.policy.grant("shop", "default/shop/web/main/conv-1")
    client = EgressClient(w.forwarder, grant)
    cases = [
        ("/v1/orders", {"Authorization": "Bearer {{credential:NOPE}}"}, "unknown_credential"),
        ("/v1/orders?t={{credential:SHOP}}", {}, "placeholder_outside_headers"),
        ("/v1/orders", {"Authorization": "Bearer {{credential:SHOP"}, "unknown_credential"),
    ]
    for path, headers, reason in cases:
        reply = await client.request("GET", api + path, headers=headers)
        assert reply.refused == reason, path
    plain = await client.request(
        "GET", api.replace("https", "http") + "/v1/orders", headers={"Authorization": "Bearer {{credential:SHOP}}"}
    )
    assert plain.refused == "placeholder_insecure"
    assert w.auth.requests == [] and w.api.seen == []


def test_settings_say_what_to_fix(tmp_path: Path) -> None:
    ca = DeploymentCA.load_or_create(tmp_path / "ca")
    base = _env(tmp_path, (1, 2), ca)
    cases = [
        ({"SWITCHBOARD_EGRESS__CREDENTIALS__SHOP__TOKEN_URL": "http://auth.shop.test/token"}, "must be an https URL"),
        ({"SWITCHBOARD_EGRESS__CREDENTIALS__SHOP__CLIENT_SECRET_SECRET": "MISSING"}, "SECRETS__MISSING__VALUE"),
        ({"SWITCHBOARD_EGRESS__SECRETS__SHOP_CLIENT__DOMAINS": "api.shop.test"}, "not bound to the token endpoint"),
        ({"SWITCHBOARD_EGRESS__CREDENTIALS__EXCHANGED__SUBJECT_TOKEN_SECRET": ""}, "needs subject_token_secret"),
    ]
    for change, expected in cases:
        env = {**base, **change}
        if change.get("SWITCHBOARD_EGRESS__CREDENTIALS__EXCHANGED__SUBJECT_TOKEN_SECRET") == "":
            del env["SWITCHBOARD_EGRESS__CREDENTIALS__EXCHANGED__SUBJECT_TOKEN_SECRET"]
        with pytest.raises(ConfigError, match=expected):
            load_settings(env)


async def test_a_sandbox_request_through_the_proxy_gets_the_token_and_never_sees_it(
    world: Callable[..., World], tmp_path: Path
) -> None:
    w = world()
    sink = ListSink()
    resolver = MapResolver({"api.shop.test": [[PUBLIC]], "auth.shop.test": [[PUBLIC]]})
    proxy = build_proxy(w.settings, sink, resolver=resolver, socket_path=tmp_path / "p.sock")
    await proxy.start()
    try:
        grant = proxy.forwarder.policy.grant("shop", "acme/shop/web/main/conv-2")
        via = f"http://{grant.token}:@{proxy.host}:{proxy.port}"
        trust = ssl.create_default_context(cafile=str(proxy.ca.cert_path))  # what a sandbox trusts
        async with aiohttp.ClientSession() as http:
            for path in ("/v1/orders", "/v1/echo"):
                async with http.get(
                    w.api_url + path, proxy=via, ssl=trust, headers={"Authorization": "Bearer {{credential:SHOP}}"}
                ) as resp:
                    assert resp.status == 200
                    body = await resp.json()
                    if path == "/v1/orders":
                        assert body["client"] == "acme-client"
                    else:
                        assert body == {"seen": "Bearer {{credential:SHOP}}"}
    finally:
        await proxy.close()
    (token,) = w.auth.issued
    assert w.api.seen == [token, token]
    assert [e.secrets for e in sink.events] == [("ACME_CLIENT",), ("credential:SHOP",), ("credential:SHOP",)]
    assert token not in repr(sink.events)


def test_a_declaration_takes_credential_placeholders_and_nothing_else() -> None:
    base = {"name": "t", "description": "d", "method": "GET", "url": "https://api.shop.test/v1"}
    ok = RestToolSpec.model_validate({**base, "headers": {"Authorization": "Bearer {{credential:SHOP:a.read b}}"}})
    assert ok.headers["Authorization"].endswith("{{credential:SHOP:a.read b}}")
    for bad in ("{{credential:}}", "{{credential:SHOP:{x}}}", "{{credential:SHOP}"):
        with pytest.raises(ValueError, match="placeholders only"):
            RestToolSpec.model_validate({**base, "headers": {"Authorization": bad}})


def test_agents_validate_names_what_egress_would_refuse(tmp_path: Path) -> None:
    ca = DeploymentCA.load_or_create(tmp_path / "ca")
    assert rest_problems(load_settings(_env(tmp_path, (1, 2), ca))) == [
        "agent 'shop': REST tool list_orders_wide uses the credential SHOP with scope admin, more than its "
        "'orders.read orders.write'",
    ]
    elsewhere = load_settings(_env(tmp_path, (1, 2), ca, SWITCHBOARD_EGRESS__CREDENTIALS__SHOP__HOSTS="x.shop.test"))
    problems = rest_problems(elsewhere)
    assert len(problems) == 4
    assert problems[0] == (
        "agent 'shop': REST tool list_orders uses the credential SHOP on api.shop.test, which is not among its "
        "hosts: add it to SWITCHBOARD_EGRESS__CREDENTIALS__SHOP__HOSTS"
    )
    gone = load_settings(_env(tmp_path, (1, 2), ca, yaml=YAML.replace("credential:EXCHANGED", "credential:GONE")))
    assert rest_problems(gone)[-1] == (
        "agent 'shop': REST tool exchanged_orders uses the credential GONE, which is not configured: set "
        "SWITCHBOARD_EGRESS__CREDENTIALS__GONE__*"
    )


async def test_a_client_secret_is_egress_own_and_no_request_may_carry_it(world: Callable[..., World]) -> None:
    w = world(SWITCHBOARD_EGRESS__ALLOW="auth.shop.test")  # even with the token endpoint allowlisted
    token_url = w.settings.egress.credentials["shop"].token_url
    client = EgressClient(w.forwarder, w.forwarder.policy.grant("shop", "default/shop/web/main/conv-1"))
    for secret in ("SHOP_CLIENT", "SUBJECT"):
        reply = await client.request(
            "POST",
            token_url,
            headers={"Authorization": f"Basic {{{{secret:{secret}}}}}"},
            body=b"grant_type=client_credentials",
        )
        assert reply.refused == "unknown_secret"
    assert w.auth.requests == []
    assert (await w.gateway.call("list_orders", {}, w.ctx())).ok  # while egress itself still uses it


@pytest.mark.parametrize(("address", "reason"), [("127.0.0.1", "loopback"), ("169.254.169.254", "metadata")])
async def test_the_token_endpoint_is_reached_only_through_the_address_checks(
    world: Callable[..., World], async_redis: aioredis.Redis, address: str, reason: str
) -> None:
    w = world(auth_address=address)  # a token_url whose name resolves somewhere egress never goes
    out = await w.gateway.call("list_orders", {}, w.ctx())
    assert (out.ok, out.error_class) == (False, "transient")
    assert f"could not be reached ({reason})" in (out.error or "")
    assert w.auth.requests == [] and w.api.seen == []
    assert f'"reason":"{reason}"' in await _event_log(async_redis)


def test_agents_show_lists_the_credentials_an_agent_uses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = load_settings(_env(tmp_path, (1, 2), DeploymentCA.load_or_create(tmp_path / "ca")))
    assert agents_command(settings, "show", "shop") == 0
    shown = capsys.readouterr().out
    assert (
        "  credential EXCHANGED (oauth2_token_exchange, tokens from auth.shop.test, scope '') → api.shop.test\n"
        "  credential SHOP (oauth2_client_credentials, tokens from auth.shop.test, scope 'orders.read orders.write') "
        "→ api.shop.test\n"
    ) in shown
    assert CLIENT_SECRET not in shown and SUBJECT_TOKEN not in shown
