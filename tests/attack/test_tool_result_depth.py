"""A result nested deeper than the gateway can record (a hostile API's ``[[[[…]]]]``) is an outcome, not a crash."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.tools.effects import TurnEffects
from switchboard.core.tools.gateway import ToolGateway
from switchboard.types import SessionKey


class NoArguments(BaseModel):
    pass


def gateway_with(body: str, effect: Literal["read", "write"], tmp_path: Path) -> ToolGateway:
    """One tool that returns ``body`` parsed, as a REST tool returns an API's JSON answer."""

    async def fetch(_args: NoArguments, _ctx: ToolContext) -> Any:
        return json.loads(body)

    tool = Tool(name="fetch", description="d", input=NoArguments, fn=fetch, output_trust="data", side_effect=effect)
    return ToolGateway(ToolRegistry([tool]), workspace_root=tmp_path / "ws-root")


def context(tmp_path: Path, effects: TurnEffects) -> ToolContext:
    return ToolContext(
        session_key=SessionKey("default/a/web/main/conv-1"),
        tenant="default",
        run_id="run-1",
        actor="web:u1",
        workspace=tmp_path / "ws-root" / "ws",
        idempotency_key="",
        agent="a",
        effects=effects,
    )


@pytest.mark.parametrize("effect", ["read", "write"])
async def test_a_result_nested_hundreds_deep_comes_back_as_an_outcome(
    tmp_path: Path, effect: Literal["read", "write"]
) -> None:
    effects = TurnEffects()
    gateway = gateway_with("[" * 300 + "]" * 300, effect, tmp_path)
    out = await gateway.call("fetch", {}, context(tmp_path, effects))
    assert out.ok  # it ran (a write happened): its result is what cannot be passed on
    assert "nests more than" in json.dumps(out.value)
    json.loads(out.for_model())
    if effect == "write":
        (record,) = effects.records.values()
        assert record.status == "done"


async def test_a_result_of_ordinary_depth_is_passed_on_as_it_is(tmp_path: Path) -> None:
    body = json.dumps({"a": [[{"b": [1, 2]}]] * 3})
    out = await gateway_with(body, "read", tmp_path).call("fetch", {}, context(tmp_path, TurnEffects()))
    assert out.value == json.loads(body)
