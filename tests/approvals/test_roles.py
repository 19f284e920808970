"""Roles × tools through the ingest router, the real drain and runtime: a role's refused tools are never offered.

The YAML's ``access.roles`` gives ``telegram:boss`` the ``admin`` role and everyone else the default ``user`` (or
``guest`` where the case says so); the agent's policy limits ``refund`` to admins and ``note`` to non-guests. A
model that calls ``refund`` whatever it was offered shows the gateway's refusal is outside the model too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from switchboard.core.access import AccessConfig
from switchboard.core.approvals.policy import ApprovalsConfig, Policy, PolicyConfig, Rule
from switchboard.core.model import Finished, ModelEvent, ModelRequest, TextDelta, ToolCall, ToolCallEvent, Usage
from switchboard.queue.router import IngestRouter
from switchboard.settings import ChannelOptions, FileConfig

from .harness import World

RULES = [
    Rule(tool="refund", role_not=["admin"], decide="refuse", reason="refunds are for admins"),
    Rule(tool="note", role=["guest"], decide="refuse"),
    Rule(tool="refund", role=["admin"], decide="allow"),
]


class GreedyModel:
    """Records the tools it was offered, then calls ``refund`` on its first step whatever it was offered."""

    provider = "offline"

    def __init__(self) -> None:
        self.offered: list[list[str]] = []

    async def aclose(self) -> None:
        return None

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.offered.append(sorted(t.name for t in request.tools))
        last = request.messages[-1]
        if last.role == "user":
            yield ToolCallEvent(call=ToolCall(id="c1", name="refund", arguments={"amount": 7}))
            yield Finished(stop_reason="tool_calls")
            return
        yield TextDelta(text="done: " + last.content[:100])
        yield Usage(input_tokens=1, output_tokens=1)
        yield Finished(stop_reason="stop")


def _router(
    world: World, roles: dict[str, Any], default_role: str | None = None, busy_policy: Any = None
) -> IngestRouter:
    access = AccessConfig.model_validate({"roles": roles, "default_role": default_role})
    channel = ChannelOptions(access=access, busy_policy=busy_policy)
    config = FileConfig(agents={"assistant": world.agent()}, channels={"telegram": channel})
    return IngestRouter(world.ingestor, config, [("telegram", "default")])


@pytest.mark.parametrize(
    ("user", "default_role", "role", "refund_offered", "note_offered", "refunded"),
    [
        ("boss", None, "admin", True, True, [7]),
        ("u1", None, "user", False, True, []),
        ("u1", "guest", "guest", False, False, []),
        ("boss", "guest", "admin", True, True, [7]),
    ],
)
async def test_a_roles_refused_tools_are_not_offered_and_not_run(
    world: World,
    user: str,
    default_role: str | None,
    role: str,
    refund_offered: bool,
    note_offered: bool,
    refunded: list[int],
) -> None:
    world.policy = PolicyConfig(rules=RULES)
    world.model = model = GreedyModel()
    router = _router(world, {"telegram:boss": "admin"}, default_role)
    message = world.message("please refund", user=user)
    result = await router.ingest(message)
    assert result is not None and not result.duplicate
    await world.drainer().drain(message.session_key)
    [received] = await world.events("message_received")
    assert (received["access"], received["role"]) == ("open", role)
    assert ("refund" in model.offered[0]) is refund_offered
    assert ("note" in model.offered[0]) is note_offered
    assert world.refunds == refunded, "a role's refused tool never runs, whatever the model calls"
    if not refunded:
        [called] = await world.events("tool_called")
        assert called["tool"] == "refund" and not called["ok"]


async def test_a_batch_acts_with_the_least_trusted_role(world: World) -> None:
    """A group's admin message batched behind a user's lends the turn nothing: the turn is the user's."""
    world.policy = PolicyConfig(rules=RULES)
    world.model = model = GreedyModel()
    router = _router(world, {"telegram:boss": "admin"}, busy_policy="collect")  # both in one turn
    first, second = world.message("hi", user="u1"), world.message("please refund", user="boss")
    await router.ingest(first)
    await router.ingest(second)
    await world.drainer().drain(first.session_key)
    assert len(model.offered) == 2, "one turn (a tool step, then the answer)"
    assert "refund" not in model.offered[0] and world.refunds == []


def test_a_rule_without_a_role_keeps_older_policy_versions() -> None:
    """The role fields are hashed into a policy's version only when set: configs without them keep their version."""
    plain = PolicyConfig(rules=[Rule(tool="refund", decide="approve")])
    roled = PolicyConfig(rules=[Rule(tool="refund", decide="approve", role=["admin"])])
    before = {  # the effective configuration as versions were hashed before rules had roles
        "rules": [["agent:a", plain.rules[0].model_dump(mode="json", by_alias=True, exclude={"role", "role_not"})]],
        "mode": "confirm",
        "untrusted_effects": "approve",
        "approvals": ApprovalsConfig().model_dump(mode="json"),
        "admins": [],
    }
    digest = hashlib.sha256(json.dumps(before, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]
    assert Policy.of(("agent:a", plain)).version == digest
    assert Policy.of(("agent:a", roled)).version != digest
