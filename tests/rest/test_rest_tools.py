"""Declared REST tools against a fake shop API over real HTTPS: schema, secrets, approvals, retries, egress."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.rest.declaration import RestToolSpec
from switchboard.egress.transport import register_rest_tools, rest_problems
from switchboard.settings import FileConfig
from tests.rest.conftest import SHOP_TOKEN, YAML, RestWorld, shop_settings

SEARCH = {"customer_id": "C123456"}


async def test_a_read_goes_out_through_egress_with_the_secret_filled_in_and_its_result_projected(
    rest_world: Callable[..., RestWorld], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    world = rest_world()
    out = await world.gateway.call("search_orders", {**SEARCH, "status": "open"}, world.ctx())
    assert out.ok, out.error
    assert out.value == [{"id": "O1", "status": "open", "total": 12.5}]
    (hit,) = world.api.hits
    assert hit["path"] == "/v1/customers/C123456/orders?status=open"
    assert hit["headers"]["Authorization"] == f"Bearer {SHOP_TOKEN}"
    assert "Idempotency-Key" not in hit["headers"]  # a read
    (event,) = world.sink.events
    assert (event.decision, event.host, event.secrets) == ("allowed", "api.shop.test", ("SHOP_TOKEN",))
    for where in (out.model_dump_json(), repr(world.sink.events), caplog.text):
        assert SHOP_TOKEN not in where


async def test_the_model_sees_the_declared_schema_and_never_the_headers(rest_world: Callable[..., RestWorld]) -> None:
    world = rest_world()
    spec = world.registry.spec("search_orders")
    assert spec.parameters["properties"]["status"]["enum"] == ["open", "shipped", "refunded"]
    assert "secret" not in json.dumps(spec.model_dump()).lower()
    assert {tool.name: tool.cost for tool in world.registry} == dict.fromkeys(
        ["search_orders", "draft_refund", "flaky_stock", "flaky_note", "echo_auth", "elsewhere"], 1
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"customer_id": "C123456", "status": "lost"}, "status: 'lost' is not one of"),
        ({"customer_id": "X1"}, "customer_id: 'X1' does not match"),
        ({"customer_id": "C123456", "note": "n" * 21}, "note: 'nnnnnnnnnnnnnnnnnnnnn' is too long"),
        ({}, "'customer_id' is a required property"),
        ({"customer_id": 123456}, "customer_id: 123456 is not of type 'string'"),
        ({"customer_id": "C123456", "url": "https://evil.test"}, "Additional properties are not allowed"),
        ({"customer_id": "C123456/../../admin"}, "does not match"),
    ],
)
async def test_bad_arguments_are_a_validation_error_and_nothing_is_sent(
    rest_world: Callable[..., RestWorld], args: dict[str, Any], expected: str
) -> None:
    world = rest_world()
    out = await world.gateway.call("search_orders", args, world.ctx())
    assert (out.ok, out.error_class, out.correctable) == (False, "validation", True)
    assert expected in (out.error or "")
    assert world.api.hits == [] and world.sink.events == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"order_id": "O1", "amount": 0}, "amount: 0 is less than or equal to the minimum of 0"),
        ({"order_id": "O1", "amount": 501}, "amount: 501 is greater than the maximum of 500"),
        ({"order_id": "O1", "amount": 5, "reason": "no"}, "reason: 'no' is too short"),
        ({"order_id": "1", "amount": 5}, "order_id: '1' does not match"),
    ],
)
async def test_a_write_with_bad_arguments_is_refused_before_any_approval(
    rest_world: Callable[..., RestWorld], args: dict[str, Any], expected: str
) -> None:
    world = rest_world()
    out = await world.gateway.call("draft_refund", args, world.ctx())
    assert (out.error_class, out.approval) == ("validation", None)
    assert expected in (out.error or "")
    assert world.api.hits == []


async def test_a_write_needs_approval_by_default_then_goes_out_with_its_idempotency_key(
    rest_world: Callable[..., RestWorld],
) -> None:
    world = rest_world()
    args = {"order_id": "O1", "amount": 12.5, "reason": "damaged"}
    asked = await world.gateway.call("draft_refund", args, world.ctx())
    assert (asked.ok, asked.error_class, asked.policy) == (False, "needs_approval", "approve:default:risky_write")
    assert asked.approval is not None and world.api.hits == []
    assert asked.approval.resources == (
        f"POST {world.settings.file.agents['shop'].rest_tools[0].url.split('{')[0]}O1/refunds",
    )
    done = await world.gateway.call("draft_refund", args, world.ctx(), approved=asked.approval)
    assert done.ok, done.error
    assert done.value == {"id": "R1", "order": "O1", "amount": 12.5, "state": "draft"}
    (hit,) = world.api.hits
    assert (hit["method"], hit["path"]) == ("POST", "/v1/orders/O1/refunds")
    assert json.loads(hit["body"]) == {"amount": 12.5, "reason": "damaged"}
    assert hit["headers"]["Idempotency-Key"] == asked.approval.idempotency_key
    assert hit["headers"]["Content-Type"] == "application/json"


async def test_reads_are_retried_on_5xx_and_writes_are_not(rest_world: Callable[..., RestWorld]) -> None:
    world = rest_world()
    world.api.flaky_failures = 2
    read = await world.gateway.call("flaky_stock", {}, world.ctx())
    assert (read.ok, read.attempts, read.value) == (True, 3, {"stock": 7})
    world.api.hits.clear()
    world.api.flaky_failures = 1
    write = await world.gateway.call("flaky_note", {"text": "hi"}, world.ctx())
    assert (write.ok, write.error_class, write.attempts) == (False, "transient", 1)
    assert "HTTP 503" in (write.error or "")
    assert len(world.api.hits) == 1


async def test_a_host_outside_the_allowlist_is_reported_and_refused_by_egress(
    rest_world: Callable[..., RestWorld],
) -> None:
    world = rest_world()
    (problem,) = rest_problems(world.settings)
    assert "elsewhere calls evil.test, which is not in its egress allowlist" in problem
    out = await world.gateway.call("elsewhere", {}, world.ctx())
    assert (out.ok, out.error_class) == (False, "permanent")
    assert "domain_not_allowed" in (out.error or "")
    assert world.api.hits == []
    assert [(e.decision, e.reason) for e in world.sink.events] == [("refused", "domain_not_allowed")]


async def test_a_secret_the_api_echoes_comes_back_as_its_placeholder(rest_world: Callable[..., RestWorld]) -> None:
    world = rest_world()
    out = await world.gateway.call("echo_auth", {}, world.ctx())
    assert out.value == {"seen": "Bearer {{secret:SHOP_TOKEN}}"}


async def test_an_agents_own_tool_is_refused_to_another_agent(rest_world: Callable[..., RestWorld]) -> None:
    world = rest_world()
    out = await world.gateway.call("echo_auth", {}, world.ctx(agent="other"))
    assert (out.ok, out.error_class) == (False, "auth")
    assert "declared for agent 'shop' only" in (out.error or "")
    assert world.api.hits == []
    names = [tool.name for tool in world.registry.for_agent(world.settings.file.agents["shop"])]
    assert names[0] == "search_orders" and "draft_refund" in names
    assert world.registry.for_agent(world.settings.file.agents["other"]) == []


async def test_an_argument_carrying_a_placeholder_is_refused_by_egress(rest_world: Callable[..., RestWorld]) -> None:
    world = rest_world()
    out = await world.gateway.call("flaky_stock", {"q": "{{secret:SHOP_TOKEN}}"}, world.ctx())
    assert (out.ok, out.error_class) == (False, "permanent")
    assert "placeholder_outside_headers" in (out.error or "")
    assert world.api.hits == []


BASE = {"name": "t", "description": "d", "method": "GET", "url": "https://api.shop.test/v1/x"}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"url": "https://{host}/v1"}, "only path segments may be templated"),
        ({"url": "https://api.shop.test/v1?q={q}"}, "only path segments may be templated"),
        ({"url": "ftp://api.shop.test/x"}, "not an http(s) URL"),
        ({"url": "https://u:p@api.shop.test/x"}, "never in the URL"),
        ({"url": "https://api.shop.test/{id}"}, "{id} is not a property"),
        (
            {"url": "https://api.shop.test/{id}", "parameters": {"type": "object", "properties": {"id": {}}}},
            "path arguments must be required",
        ),
        ({"parameters": {"type": "array"}}, "type: object"),
        ({"parameters": {"type": "object", "properties": {"a": {"type": "nope"}}}}, "not a valid JSON Schema"),
        ({"headers": {"X-Who": "{who}"}}, "placeholders only"),
        ({"headers": {"Host": "x"}}, "may not be a declared header"),
        ({"name": "Bad-Name"}, "String should match pattern"),
        ({"result": {"pointer": "orders"}}, "not a JSON pointer"),
        ({"method": "TRACE"}, "Input should be"),
    ],
)
def test_a_declaration_that_cannot_work_is_refused_when_the_file_loads(change: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValidationError) as caught:
        RestToolSpec.model_validate({**BASE, **change})
    assert expected in str(caught.value)


def test_classes_default_from_the_method() -> None:
    read = RestToolSpec.model_validate(BASE)
    write = RestToolSpec.model_validate({**BASE, "method": "DELETE"})
    assert (read.effect, write.effect) == ("read", "write")


def test_names_are_unique_and_an_agent_may_not_list_another_agents_tool(tmp_path: Path) -> None:
    twice = {"rest_tools": [BASE], "agents": {"a": {"name": "a", "rest_tools": [BASE]}}}
    with pytest.raises(ValidationError, match="also declared in rest_tools"):
        FileConfig.model_validate(twice)
    borrowed = {"agents": {"a": {"name": "a", "rest_tools": [BASE]}, "b": {"name": "b", "tools": ["t"]}}}
    with pytest.raises(ValidationError, match="a REST tool of another agent"):
        FileConfig.model_validate(borrowed)


def test_a_declared_name_may_not_take_a_native_tools(tmp_path: Path) -> None:
    settings = shop_settings(tmp_path, 8443, yaml=YAML.replace("name: flaky_stock", "name: read_file"))
    from switchboard.core.tools.builtin import default_registry

    with pytest.raises(ValueError, match="has the name of a native tool"):
        register_rest_tools(default_registry(sandbox=None), settings, None)
    registry = ToolRegistry()
    register_rest_tools(registry, shop_settings(tmp_path, 8443), None)
    assert "search_orders" in registry
