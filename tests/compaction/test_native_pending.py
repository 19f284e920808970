"""Native compaction (the fake Responses API over HTTP) keeps a write in doubt word for word after its opaque item."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict

from switchboard.core.agent.config import Agent, AgentLimits, AgentProfile
from switchboard.core.agent.native import PENDING_SOURCE
from switchboard.core.agent.pending import pending_actions
from switchboard.core.providers.openai import OpenAIModel
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.errors import ToolError
from switchboard.queue.lease import Lease
from switchboard.queue.store import RedisSessionStore
from switchboard.settings import QueueSettings
from tests.core.turns import MemorySink, make_tool, registry_with, request, runtime
from tests.fakes.model_script import Call
from tests.fakes.openai_api import FakeOpenAI

PAGE = "lorem ipsum dolor sit amet " * 70


class _Any(BaseModel):
    model_config = ConfigDict(extra="allow")


async def _fetch(args: _Any, ctx: ToolContext) -> dict[str, Any]:
    return {"text": PAGE}


async def _place(args: _Any, ctx: ToolContext) -> Any:
    raise ToolError("the supplier did not answer in time", error_class="ambiguous_timeout")


REGISTRY = registry_with(
    make_tool("fetch", _fetch, input=_Any),
    Tool(name="place_order", description="Order stock.", input=_Any, fn=_place, side_effect="write",
         retry_on=frozenset()),
)  # fmt: skip


def _texts(body: dict[str, Any]) -> str:
    return "\n".join(str(item.get("content", "")) for item in body.get("input", []) if item.get("type") == "message")


async def test_a_write_in_doubt_survives_native_compaction_word_for_word(
    tmp_path: Path, fake_openai: FakeOpenAI, openai_url: str, async_redis: aioredis.Redis
) -> None:
    fake_openai.reply(calls=[Call("place_order", {"sku": "A-77", "qty": 40}, call_id="call_order")], input_tokens=50)
    for n in range(1, 5):
        fake_openai.reply(calls=[Call("fetch", {"n": n}, call_id=f"call_p{n}")], input_tokens=100)
    fake_openai.reply("Pages read; the order is unconfirmed.")
    ag = Agent(
        name="a",
        profile=AgentProfile(name="a"),
        instructions="Order, then read.",
        tools=["fetch", "place_order"],
        limits=AgentLimits(max_input_tokens=2_000, max_steps=10),
        compaction="native",
    )
    turn = request("Order 40 of A-77, then read pages 1 to 4.", agent_=ag)
    lease = await Lease(async_redis, worker_id="w1", lease_ms=60_000).acquire(turn.session_key)
    assert lease is not None
    store = RedisSessionStore.for_lease(async_redis, lease, QueueSettings(name="sbtest"))
    model = OpenAIModel(api_key="sk-test", base_url=openai_url, wire_api="responses")
    try:
        result = await runtime(tmp_path, model=model, registry=REGISTRY).run_turn(turn, MemorySink(), store)
    finally:
        await model.aclose()

    assert result.stopped_by is None and len(fake_openai.compactions()) >= 1
    (doubt,) = pending_actions(result.history)
    assert doubt.kind == "write_in_doubt" and doubt.call_id == "call_order"
    sent = fake_openai.responses()
    after = [r for r in sent if any(i.get("type") == "compaction" for i in r.body.get("input", []))]
    assert after, "no request went out with the compacted window"
    for request_ in after:
        ids = [item.get("call_id") for item in request_.body["input"]]
        assert "call_order" not in ids  # the call itself is inside the opaque window ...
        assert doubt.line in _texts(request_.body) and PENDING_SOURCE in _texts(request_.body)  # ... kept beside it
