"""A read gated by the policy inside a batch of parallel reads: its siblings run, one person is asked, then it runs.

Through the real drain, runtime, gateway and Redis (:class:`World`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from switchboard.core.agent.replay import ReplayModel
from switchboard.core.approvals.policy import PolicyConfig, Rule
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.definition import Tool, ToolContext
from tests.core.turns import answer_step, calls_step

from .harness import World, where


class QueryInput(BaseModel):
    query: str


@dataclass
class LookingWorld(World):
    """The world with two read tools: ``lookup`` runs freely, ``web_search`` needs a person's approval."""

    def __post_init__(self) -> None:
        self.looked: list[str] = []
        self.policy = PolicyConfig(rules=[Rule(tool="web_search", decide="approve", reason="searches are checked")])

    def registry(self) -> ToolRegistry:
        async def lookup(args: QueryInput, ctx: ToolContext) -> dict[str, Any]:
            self.looked.append(args.query)
            return {"found": args.query}

        registry = super().registry()
        for name in ("lookup", "web_search"):
            registry.register(Tool(name=name, description=name, input=QueryInput, fn=lookup), replace=True)
        return registry

    def agent(self) -> Any:
        agent = super().agent()
        return agent.model_copy(update={"tools": [*agent.tools, "lookup", "web_search"]})


async def test_a_gated_read_in_a_batch_asks_once_and_its_siblings_run(world: World) -> None:
    looking = LookingWorld(world.client, world.settings, world.ingestor, world.tmp_path)
    calls = [("lookup", {"query": "a"}), ("web_search", {"query": "x"}), ("lookup", {"query": "b"}),
             ("web_search", {"query": "y"})]  # fmt: skip
    looking.model = ReplayModel([calls_step(*calls), answer_step("Done.", step=2)], strict=False)
    await looking.send(looking.message("look things up"))
    assert sorted(looking.looked) == ["a", "b"]  # the free reads ran; neither search did
    requested = await looking.events("approval_requested")
    assert [e["tool"] for e in requested] == ["web_search"]  # one question, for the first gated read
    record = await looking.only_approval()
    assert record.request is not None and record.request.arguments == {"query": "x"}
    tools = [e for e in await looking.history() if e.get("role") == "tool"]
    assert [e["meta"]["call_id"] for e in tools] == ["c1_0", "c1_1", "c1_2", "c1_3"]  # in the order asked
    assert tools[2]["text"] == '{"found":"b"}' and '"error_class":"waiting"' in tools[3]["text"]
    await looking.send(looking.click(looking.approve_option()))
    assert sorted(looking.looked) == ["a", "b", "x"]
    assert where(await looking.events("tool_called"), tool="web_search", ok=True)
