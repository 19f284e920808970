"""The agent's scheduling tools through the real drain, runtime and policy: a write like any other, confined to the
agent's own conversation, and a scheduled occurrence coming back as a turn or a message."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest

from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.approvals.policy import PolicyConfig, Rule
from switchboard.core.schedules import ScheduleSpec
from switchboard.queue.schedules import Scheduler, create_job, get_job, list_jobs

from .harness import World

AT = "2031-01-05T09:00:00+01:00"
SCHEDULE = '/tool schedule_message {"text": "Your trial ends tomorrow.", "at": "' + AT + '"}'


@dataclass
class SchedulingWorld(World):
    def agent(self) -> Agent:
        return Agent(
            name="assistant",
            profile=AgentProfile(name="A"),
            instructions="Answer.",
            tools=["schedule_message", "schedule_turn", "list_schedules", "cancel_schedule"],
            policy=self.policy,
        )


@pytest.fixture
def sworld(world: World) -> SchedulingWorld:
    return SchedulingWorld(world.client, world.settings, world.ingestor, world.tmp_path)


async def test_the_agent_schedules_a_message_into_its_own_conversation(sworld: SchedulingWorld) -> None:
    await sworld.send(sworld.message(SCHEDULE))
    [view] = await list_jobs(sworld.client, session=sworld.session)
    assert view.spec.action == "message" and view.spec.text == "Your trial ends tomorrow."
    assert view.spec.created_by == f"agent:{sworld.session}"
    assert view.next_at == 1925366400.0  # 2031-01-05 08:00 UTC
    [called] = await sworld.events("tool_called")
    assert called["tool"] == "schedule_message"


@pytest.mark.parametrize(("decide", "asked"), [("approve", True), ("refuse", False)])
async def test_a_policy_rule_gates_scheduling_like_any_write(sworld: SchedulingWorld, decide: str, asked: bool) -> None:
    sworld.policy = PolicyConfig(rules=[Rule(tool="schedule_*", decide=decide)])  # type: ignore[arg-type]
    await sworld.send(sworld.message(SCHEDULE))
    assert await list_jobs(sworld.client, session=sworld.session) == []  # nothing scheduled before a person said so
    if not asked:
        assert await sworld.events("approval_requested") == []
        return
    record = await sworld.only_approval()
    assert record.request is not None and record.request.tool == "schedule_message"
    await sworld.send(sworld.operator("decide", approval_id=record.id, verdict="approve"))
    assert len(await list_jobs(sworld.client, session=sworld.session)) == 1


async def test_the_agent_lists_and_cancels_only_its_own_sessions_jobs(sworld: SchedulingWorld) -> None:
    other = ScheduleSpec.model_validate(
        {"id": "elsewhere", "target": {"channel": "telegram", "conversation": "someone-else", "agent": "assistant"},
         "action": "message", "text": "not yours", "cron": "0 9 * * *"}
    )  # fmt: skip
    await create_job(sworld.client, other)
    await sworld.send(sworld.message(SCHEDULE))
    [mine] = await list_jobs(sworld.client, session=sworld.session)

    await sworld.send(sworld.message("/tool list_schedules {}"))
    listed = [json.loads(h["text"]) for h in await sworld.history() if h["role"] == "tool"][-1]
    assert [job["id"] for job in listed["jobs"]] == [mine.spec.id]

    await sworld.send(sworld.message('/tool cancel_schedule {"id": "elsewhere"}'))
    assert await get_job(sworld.client, "elsewhere") is not None  # another conversation's job is not the agent's
    await sworld.send(sworld.message('/tool cancel_schedule {"id": "' + mine.spec.id + '"}'))
    assert await list_jobs(sworld.client, session=sworld.session) == []


async def test_occurrences_come_back_as_a_message_sent_as_is_and_as_a_turn_the_agent_runs(
    sworld: SchedulingWorld,
) -> None:
    await sworld.send(sworld.message("hello"))  # the session exists, with its conversation
    soon = time.time() - 1
    for job_id, action, text in (("note", "message", "Stand-up in 5 minutes."), ("check", "turn", "check the build")):
        await create_job(
            sworld.client,
            ScheduleSpec.model_validate(
                {"id": job_id, "target": {"channel": "telegram", "conversation": sworld.conversation,
                 "agent": "assistant"}, "action": action, "text": text, "at": soon}
            ),
        )  # fmt: skip
    assert await Scheduler(sworld.client, sworld.settings).tick() == 2
    await sworld.drainer().drain(sworld.session)
    texts = sworld.texts()
    assert "Stand-up in 5 minutes." in texts  # the message job: as written, no model call
    assert any("check the build" in t and "offline model" in t for t in texts)  # the turn job: the agent answered
    history = [h["text"] for h in await sworld.history() if h["role"] == "user"]
    assert "(scheduled message note sent)" in history
