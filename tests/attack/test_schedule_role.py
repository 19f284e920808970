"""A turn the agent scheduled acts with the role of the turn that scheduled it, never with more.

Access control stamps each sender's role at ingest; a scheduled occurrence is ingested by the scheduler, which stamps
none, and an unstamped turn acts as ``user``. A guest whose turn may call ``schedule_turn`` would otherwise have the
agent woken later as a ``user``, with the tools the policy refuses guests.
"""

from __future__ import annotations

import time

import pytest

from switchboard.core.access import ROLE_META
from switchboard.core.messages import InboundMessage, Scheduled
from switchboard.queue.keys import SessionKeys
from switchboard.queue.schedules import Scheduler, list_jobs
from switchboard.worker.authority import turn_request
from tests.approvals.conftest import world
from tests.approvals.test_schedule_tools import SchedulingWorld, sworld

__all__ = ["sworld", "world"]


@pytest.mark.parametrize("role", ["guest", "admin"])
async def test_a_turn_scheduled_by_a_role_runs_with_no_more_than_that_role(sworld: SchedulingWorld, role: str) -> None:
    soon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 2))
    asked = sworld.message('/tool schedule_turn {"prompt": "run the shell", "at": "' + soon + '"}')
    await sworld.send(asked.model_copy(update={"meta": {**asked.meta, ROLE_META: role}}))
    [job] = await list_jobs(sworld.client, session=sworld.session)
    time.sleep(2.1)

    assert await Scheduler(sworld.client, sworld.settings).tick() == 1
    keys = SessionKeys(sworld.session)
    [queued_id] = [i.decode() for i in await sworld.client.lrange(keys.inbox, 0, -1)]
    fired = InboundMessage.model_validate_json(await sworld.client.hget(keys.messages, queued_id))
    assert isinstance(fired.event, Scheduled) and fired.event.job_id == job.spec.id
    request = turn_request(None, sworld.session, sworld.agent(), [fired], "run-1")
    assert request.role == ("guest" if role == "guest" else "user")
