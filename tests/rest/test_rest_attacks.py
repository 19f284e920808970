"""Declared REST tools under attack: a model's arguments may not change where a call goes or what it carries."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.tools.rest.declaration import RestToolSpec
from switchboard.core.tools.rest.tool import build_rest_tool
from switchboard.egress.ca import DeploymentCA
from switchboard.egress.forward import Forwarder
from switchboard.egress.policy import EgressPolicy
from switchboard.egress.transport import EgressTransport, register_rest_tools
from switchboard.types import SessionKey
from tests.egress.conftest import PUBLIC, ListSink, MapResolver, _serve
from tests.rest.conftest import SHOP_TOKEN, RestWorld, shop_settings


def loose_tool(world: RestWorld, **change: Any) -> ToolGateway:
    """A gateway with one read whose path argument has no pattern (what a hand-written declaration often has)."""
    port = world.settings.file.rest_tools[0].url.split(":")[2].split("/")[0]
    spec = RestToolSpec.model_validate(
        {
            "name": "customer_orders",
            "description": "A customer's orders.",
            "method": "GET",
            "url": f"https://api.shop.test:{port}/v1/customers/{{cid}}/orders",
            "parameters": {
                "type": "object",
                "required": ["cid"],
                "properties": {"cid": {"type": "string"}, "status": {"type": "string"}},
            },
            **change,
        }
    )
    registry = ToolRegistry()
    registry.register(build_rest_tool(spec, EgressTransport(world.forwarder)))
    return ToolGateway(registry, workspace_root=world.workspace.parent, backoff_base_s=0.0)


@pytest.mark.parametrize("cid", ["..", ".", ""])
async def test_a_path_argument_cannot_climb_out_of_its_segment(rest_world: Callable[..., RestWorld], cid: str) -> None:
    world = rest_world()
    out = await loose_tool(world).call("customer_orders", {"cid": cid}, world.ctx())
    assert (out.ok, out.error_class) == (False, "validation"), out
    assert "cid" in (out.error or "")
    assert world.sink.events == [] and world.api.hits == []


async def test_a_path_argument_with_dots_inside_stays_one_segment(rest_world: Callable[..., RestWorld]) -> None:
    world = rest_world()
    out = await loose_tool(world).call("customer_orders", {"cid": "a..b"}, world.ctx())
    (event,) = world.sink.events
    assert event.path == "/v1/customers/a..b/orders"
    assert out.error_class != "validation"


async def test_an_argument_the_schema_does_not_declare_is_refused_and_never_sent(
    rest_world: Callable[..., RestWorld],
) -> None:
    world = rest_world()
    out = await loose_tool(world).call("customer_orders", {"cid": "C1", "all_tenants": "true"}, world.ctx())
    assert (out.ok, out.error_class) == (False, "validation"), out
    assert "all_tenants" in (out.error or "")
    assert world.sink.events == []


async def test_a_schema_that_opts_in_to_more_arguments_passes_them_on(rest_world: Callable[..., RestWorld]) -> None:
    world = rest_world()
    opened = {"type": "object", "required": ["cid"], "properties": {"cid": {"type": "string"}}}
    gateway = loose_tool(world, parameters={**opened, "additionalProperties": {"type": "string"}})
    await gateway.call("customer_orders", {"cid": "C1", "page": "2"}, world.ctx())
    (event,) = world.sink.events
    assert event.path == "/v1/customers/C1/orders"
    assert event.decision == "allowed"


ITEMS_YAML = """
default_agent: shop
agents:
  shop:
    profile: {{name: Shop, description: test}}
    instructions: test
    egress: {{allow: [api.shop.test]}}
    rest_tools:
      - name: all_items
        description: Every item.
        method: GET
        url: https://api.shop.test:{port}/v1/items
        parameters: {{type: object, properties: {{n: {{type: integer}}}}}}
        result: {{max_items: 5}}
"""


@pytest.fixture
async def items_world(tmp_path: Path) -> AsyncIterator[tuple[ToolGateway, ListSink]]:
    """An API whose ``/v1/items?n=N`` answers N empty objects: a few bytes each, a Python dict each once parsed."""

    async def items(request: web.Request) -> web.Response:
        return web.Response(body=b"[" + b",".join([b"{}"] * int(request.query["n"])) + b"]")

    ca = DeploymentCA.load_or_create(tmp_path / "upstream-ca")
    cert, key = ca.issue("api.shop.test")
    (tmp_path / "items.pem").write_bytes(cert + key)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "items.pem")
    app = web.Application()
    app.router.add_get("/v1/items", items)
    runner, port = await _serve(app, PUBLIC, 0, tls)
    settings = shop_settings(tmp_path, port, ca, yaml=ITEMS_YAML)
    sink = ListSink()
    resolver = MapResolver({"api.shop.test": [[PUBLIC]]})
    forwarder = Forwarder(EgressPolicy.from_settings(settings), settings.egress, sink, resolver=resolver)
    registry = ToolRegistry()
    register_rest_tools(registry, settings, EgressTransport(forwarder))
    try:
        yield ToolGateway(registry, workspace_root=tmp_path / "ws-root", backoff_base_s=0.0), sink
    finally:
        await forwarder.close()
        await runner.cleanup()


def shop_ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(
        session_key=SessionKey("default/shop/web/main/conv-1"),
        tenant="default",
        run_id="run-1",
        actor="web:u1",
        workspace=tmp_path / "ws-root" / "ws",
        idempotency_key="",
        agent="shop",
    )


async def test_an_answer_too_large_for_a_tool_result_is_refused_before_it_is_parsed(
    items_world: tuple[ToolGateway, ListSink], tmp_path: Path
) -> None:
    gateway, sink = items_world
    small = await gateway.call("all_items", {"n": 10}, shop_ctx(tmp_path))
    assert small.ok and small.value == {"items": [{}] * 5, "more": 5}
    huge = await gateway.call("all_items", {"n": 5 * 2**20}, shop_ctx(tmp_path))  # 15 MiB: 5 million dicts
    assert (huge.ok, huge.error_class) == (False, "permanent"), huge
    assert "too large" in (huge.error or "")
    assert [event.decision for event in sink.events] == [
        "allowed",
        "allowed",
    ]  # egress let it through: its cap is 50 MiB


@pytest.mark.parametrize(
    "placeholder", ["{{secret:SHOP_TOKEN}}", "{{ SECRET:shop_token }}", "%7B%7Bsecret:SHOP_TOKEN%7D%7D"]
)
async def test_a_placeholder_in_a_path_or_body_argument_is_never_filled_in(
    rest_world: Callable[..., RestWorld], placeholder: str
) -> None:
    world = rest_world()
    in_path = await loose_tool(world).call("customer_orders", {"cid": placeholder}, world.ctx())
    in_body = await world.gateway.call("flaky_note", {"text": placeholder}, world.ctx())
    for out in (in_path, in_body):
        assert SHOP_TOKEN not in out.model_dump_json()
    assert all(SHOP_TOKEN.encode() not in hit["body"] and SHOP_TOKEN not in hit["path"] for hit in world.api.hits)
    assert all(event.secrets == () for event in world.sink.events)
