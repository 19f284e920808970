"""A gated tool call read back as a transcript: the call, its approval (asked, decided, executed) and the answer."""

from __future__ import annotations

from switchboard.control.transcript import transcript_of
from switchboard.queue.eventlog import read_events

from .harness import World


async def test_an_approved_call_reads_as_one_approval_line_between_the_call_and_the_answer(world: World) -> None:
    await world.send(world.message('/tool refund {"amount": 150}'))
    record = await world.only_approval()
    await world.send(world.operator("decide", approval_id=record.id, verdict="approve"))
    assert world.refunds == [150]
    lines = await transcript_of(world.client, world.session, history_limit=100, events_limit=1000)
    kinds = [line.kind for line in lines]
    assert kinds[0] == "user" and "approval" in kinds and kinds[-1] == "agent"
    [approval] = [line for line in lines if line.kind == "approval"]
    assert (approval.tool, approval.action) == ("refund", "executed")
    assert "approved by console:alice via" in approval.text
    assert [e.kind for e in approval.events] == ["approval_requested", "approval_decided", "approval_settled"]
    calls = [line for line in lines if line.kind == "tool_call" and line.tool == "refund"]
    assert calls and calls[-1].arguments == {"amount": 150} and calls[-1].ok is True
    # the operator's decision is no operator message: the resumed run's answer is the agent's
    assert not [line for line in lines if line.kind == "operator"]
    shown = sorted(e.id for line in lines for e in line.events)
    assert shown == sorted(e["id"] for e in await read_events(world.client, world.session, 1000))
