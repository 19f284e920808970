"""A fake shop REST API over real HTTPS, and the egress world a declared tool reaches it through.

The API listens on 127.0.0.2 (made reachable with ``SWITCHBOARD_EGRESS__INTERNAL_NETWORKS``) under a certificate of a
test CA that egress is told to trust; only the test resolver knows ``api.shop.test``.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.egress.ca import DeploymentCA
from switchboard.egress.forward import Forwarder
from switchboard.egress.policy import EgressPolicy
from switchboard.egress.transport import EgressTransport, register_rest_tools
from switchboard.settings import Settings, load_settings
from switchboard.types import SessionKey
from tests.egress.conftest import PUBLIC, ListSink, MapResolver, _serve

SHOP_TOKEN = "shop-REAL-token-5f1e2d3c4b5a"

YAML = """
default_agent: shop
rest_tools:
  - name: search_orders
    description: Find a customer's orders, optionally by status.
    method: GET
    url: https://api.shop.test:{port}/v1/customers/{{customer_id}}/orders
    parameters:
      type: object
      required: [customer_id]
      additionalProperties: false
      properties:
        customer_id: {{type: string, pattern: "^C[0-9]{{6}}$"}}
        status: {{type: string, enum: [open, shipped, refunded]}}
        note: {{type: string, maxLength: 20}}
    headers: {{Authorization: "Bearer {{{{secret:SHOP_TOKEN}}}}"}}
    result: {{pointer: /orders, fields: {{id: /id, status: /status, total: /total/amount}}}}
agents:
  shop:
    profile: {{name: Shop, description: test}}
    instructions: test
    tools: [search_orders]
    egress:
      allow: [api.shop.test]
      secrets:
        SHOP_TOKEN: {{env: SHOP_TOKEN_ENV, domains: [api.shop.test]}}
    rest_tools:
      - name: draft_refund
        description: Draft a refund of one order (a person approves it).
        method: POST
        url: https://api.shop.test:{port}/v1/orders/{{order_id}}/refunds
        parameters:
          type: object
          required: [order_id, amount]
          properties:
            order_id: {{type: string, pattern: "^O[0-9]+$"}}
            amount: {{type: number, exclusiveMinimum: 0, maximum: 500}}
            reason: {{type: string, minLength: 3, maxLength: 200}}
        headers: {{Authorization: "Bearer {{{{secret:SHOP_TOKEN}}}}"}}
        result: {{pointer: /refund}}
      - name: flaky_stock
        description: Stock level (a flaky endpoint).
        method: GET
        url: https://api.shop.test:{port}/v1/flaky
        parameters: {{type: object, properties: {{q: {{type: string}}}}}}
      - name: flaky_note
        description: Leave a note (a flaky endpoint).
        method: POST
        url: https://api.shop.test:{port}/v1/flaky
        parameters: {{type: object, properties: {{text: {{type: string}}}}}}
        risk: low
        reversible: true
      - name: echo_auth
        description: What the API saw (an API that echoes credentials).
        method: GET
        url: https://api.shop.test:{port}/v1/echo-auth
        headers: {{Authorization: "Bearer {{{{secret:SHOP_TOKEN}}}}"}}
      - name: elsewhere
        description: A host outside the allowlist.
        method: GET
        url: https://evil.test:{port}/steal
  other:
    profile: {{name: Other, description: test}}
    instructions: test
"""


@dataclass
class ShopApi:
    """The fake API: orders, refunds, a flaky endpoint; it records every request."""

    hits: list[dict[str, Any]] = field(default_factory=list)
    flaky_failures: int = 0

    def app(self) -> web.Application:
        async def record(request: web.Request) -> None:
            self.hits.append(
                {
                    "method": request.method,
                    "path": request.path_qs,
                    "headers": request.headers.copy(),
                    "body": await request.read(),
                }
            )

        def authorised(request: web.Request) -> bool:
            return request.headers.get("Authorization") == f"Bearer {SHOP_TOKEN}"

        async def orders(request: web.Request) -> web.Response:
            await record(request)
            if not authorised(request):
                return web.json_response({"error": "unauthorised"}, status=401)
            rows = [
                {"id": "O1", "status": "open", "total": {"amount": 12.5, "currency": "EUR"}, "internal": "x"},
                {"id": "O2", "status": "shipped", "total": {"amount": 40, "currency": "EUR"}, "internal": "y"},
            ]
            wanted = request.query.get("status")
            found = [row for row in rows if wanted is None or row["status"] == wanted]
            return web.json_response({"customer": request.match_info["cid"], "orders": found})

        async def refunds(request: web.Request) -> web.Response:
            await record(request)
            if not authorised(request):
                return web.json_response({"error": "unauthorised"}, status=401)
            body = await request.json()
            return web.json_response(
                {
                    "refund": {
                        "id": "R1",
                        "order": request.match_info["oid"],
                        "amount": body["amount"],
                        "state": "draft",
                    }
                },
                status=201,
            )

        async def flaky(request: web.Request) -> web.Response:
            await record(request)
            if self.flaky_failures > 0:
                self.flaky_failures -= 1
                return web.json_response({"error": "busy"}, status=503)
            return web.json_response({"stock": 7})

        async def echo_auth(request: web.Request) -> web.Response:
            await record(request)
            return web.json_response({"seen": request.headers.get("Authorization", "")})

        app = web.Application()
        app.router.add_get("/v1/customers/{cid}/orders", orders)
        app.router.add_post("/v1/orders/{oid}/refunds", refunds)
        app.router.add_route("*", "/v1/flaky", flaky)
        app.router.add_get("/v1/echo-auth", echo_auth)
        return app


@dataclass
class RestWorld:
    settings: Settings
    api: ShopApi
    sink: ListSink
    forwarder: Forwarder
    registry: ToolRegistry
    gateway: ToolGateway
    workspace: Path

    def ctx(self, agent: str = "shop", **kw: Any) -> ToolContext:
        values: dict[str, Any] = {
            "session_key": SessionKey(f"default/{agent}/web/main/conv-1"),
            "tenant": "default",
            "run_id": "run-1",
            "actor": "web:u1",
            "workspace": self.workspace,
            "idempotency_key": "",
            "agent": agent,
        }
        values.update(kw)
        return ToolContext(**values)


def shop_settings(tmp_path: Path, port: int, ca: DeploymentCA | None = None, yaml: str = YAML) -> Settings:
    config = tmp_path / "switchboard.yaml"
    config.write_text(yaml.format(port=port))
    env = {
        "SWITCHBOARD_CONFIG": str(config),
        "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
        "SWITCHBOARD_EGRESS__PORTS": f"443,{port}",
        "SWITCHBOARD_EGRESS__INTERNAL_NETWORKS": f"{PUBLIC}/32",
        "SHOP_TOKEN_ENV": SHOP_TOKEN,
    }
    if ca is not None:
        env["SWITCHBOARD_EGRESS__UPSTREAM_CA_FILE"] = str(ca.cert_path)
    return load_settings(env)


@contextlib.asynccontextmanager
async def serve_shop(tmp_path: Path) -> AsyncIterator[tuple[ShopApi, int, DeploymentCA]]:
    """The fake shop API over HTTPS on 127.0.0.2, its port, and the CA that signed its certificate."""
    ca = DeploymentCA.load_or_create(tmp_path / "upstream-ca")
    cert, key = ca.issue("api.shop.test")
    (tmp_path / "shop.pem").write_bytes(cert + key)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "shop.pem")
    api = ShopApi()
    runner, port = await _serve(api.app(), PUBLIC, 0, tls)
    try:
        yield api, port, ca
    finally:
        await runner.cleanup()


@pytest.fixture
async def shop_api(tmp_path: Path) -> AsyncIterator[tuple[ShopApi, int, DeploymentCA]]:
    async with serve_shop(tmp_path) as served:
        yield served


@pytest.fixture
async def rest_world(
    tmp_path: Path, shop_api: tuple[ShopApi, int, DeploymentCA]
) -> AsyncIterator[Callable[..., RestWorld]]:
    api, port, ca = shop_api
    forwarders: list[Forwarder] = []

    def build(**gateway_kw: Any) -> RestWorld:
        settings = shop_settings(tmp_path, port, ca)
        sink = ListSink()
        resolver = MapResolver({"api.shop.test": [[PUBLIC]], "evil.test": [[PUBLIC]]})
        forwarder = Forwarder(EgressPolicy.from_settings(settings), settings.egress, sink, resolver=resolver)
        forwarders.append(forwarder)
        registry = ToolRegistry()
        register_rest_tools(registry, settings, EgressTransport(forwarder))
        gateway_kw.setdefault("backoff_base_s", 0.0)
        gateway = ToolGateway(registry, workspace_root=tmp_path / "ws-root", **gateway_kw)
        return RestWorld(settings, api, sink, forwarder, registry, gateway, tmp_path / "ws-root" / "ws")

    yield build
    for forwarder in forwarders:
        await forwarder.close()
