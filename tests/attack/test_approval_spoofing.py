"""A click carrying another conversation's approval option, or one after the approval settled, decides nothing.

Through the real drain, runtime, gateway and Redis store: option ids are looked up in the clicking session only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis

from switchboard.queue.ingest import Ingestor
from switchboard.settings import QueueSettings
from tests.approvals.harness import World

REFUND = '/tool refund {"amount": 150}'


@pytest.fixture
def world(client: aioredis.Redis, queue_settings: QueueSettings, ingestor: Ingestor, tmp_path: Path) -> World:
    return World(client, queue_settings, ingestor, tmp_path)


async def test_another_conversations_approval_option_decides_nothing(world: World) -> None:
    await world.send(world.message(REFUND))
    record = await world.only_approval()
    option = world.approve_option()
    world.conversation = "c2"  # the same user, and then another one, in another conversation
    for user in ("u1", "intruder"):
        await world.send(world.click(option, user=user))
    assert world.refunds == []
    assert await world.events("approval_decided") == []
    world.conversation = "c1"
    assert (await world.record(record.id)).status == "pending"
    await world.send(world.click(option))  # in its own conversation it still works, once
    assert world.refunds == [150]


async def test_a_click_after_the_approval_settled_runs_nothing(world: World) -> None:
    await world.send(world.message(REFUND))
    record = await world.only_approval()
    await world.send(world.click(world.deny_option()))
    assert (await world.record(record.id)).status != "pending"
    await world.send(world.click(world.approve_option(0)))
    assert world.refunds == []
    assert [e["result"] for e in await world.events("approval_decided")] == ["applied", "already_decided"]
