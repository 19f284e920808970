"""An approved action acts for the user who asked, with that user's permissions, whoever approved it."""

from __future__ import annotations

import dataclasses

from switchboard.core.approvals.policy import PolicyConfig
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.settings import FileConfig
from switchboard.worker.drain import Drainer

from .harness import World

REFUND = '/tool refund {"amount": 150}'


def _permissioned(world: World) -> None:
    """``refund`` needs the ``payments.refund`` permission; the YAML grants it to telegram:u1 only."""
    plain = world.registry

    def registry() -> ToolRegistry:
        found = plain()
        refund = found.get("refund")
        assert refund is not None
        found.register(dataclasses.replace(refund, permission="payments.refund"), replace=True)
        return found

    world.registry = registry  # type: ignore[method-assign]
    world.policy = PolicyConfig(grants={"telegram:u1": ["payments.*"]})
    make = world.drainer

    def drainer(worker_id: str = "w1") -> Drainer:
        built = make(worker_id)
        agent = world.agent()
        built.config = FileConfig(agents={"assistant": agent})
        return built

    world.drainer = drainer  # type: ignore[method-assign]


async def test_an_operator_approval_runs_the_action_with_the_requesters_permissions(world: World) -> None:
    _permissioned(world)
    await world.send(world.message(REFUND))
    record = await world.only_approval()
    assert record.requested_by == "telegram:u1" and world.refunds == []
    # console:alice holds no grant; the action still runs, as telegram:u1 (who holds payments.*)
    await world.send(world.operator("decide", approval_id=record.id, verdict="approve"))
    assert world.refunds == [150]
    assert (await world.record(record.id)).status == "executed"


async def test_a_grant_revoked_before_the_approval_refuses_the_action(world: World) -> None:
    _permissioned(world)
    await world.send(world.message(REFUND))
    record = await world.only_approval()
    world.policy = PolicyConfig()  # the grant is gone by the time a person approves
    await world.send(world.operator("decide", approval_id=record.id, verdict="approve"))
    assert world.refunds == []
    assert (await world.record(record.id)).status == "refused"
