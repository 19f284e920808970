"""Declared REST tools under attack: a model's arguments may not change where a call goes or what it carries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.tools.rest.declaration import RestToolSpec
from switchboard.core.tools.rest.tool import build_rest_tool
from switchboard.egress.transport import EgressTransport
from tests.rest.conftest import RestWorld


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
