"""Approve and deny a gated call through the real drain: buttons, /approve ID, the console's decision."""

from __future__ import annotations

import json

from switchboard.core.actions import AckChoice
from switchboard.core.approvals.decisions import MISMATCH_TEXT, NOT_YOURS_TEXT, UNKNOWN_TEXT
from switchboard.core.approvals.records import option_id, parse_option_id
from switchboard.core.messages import ChoiceSelected, InboundMessage

from .harness import World, where

REFUND = '/tool refund {"amount": 150}'


async def ask_refund(world: World) -> str:
    before = list(world.refunds)
    await world.send(world.message(REFUND))
    assert world.refunds == before  # nothing ran: a person decides first
    record = await world.only_approval()
    assert record.status == "pending" and record.request is not None
    assert record.request.tool == "refund" and record.request.arguments == {"amount": 150}
    assert record.requested_by == "telegram:u1"
    return record.id


async def test_a_gated_call_pauses_the_run_and_asks_on_the_channel(world: World) -> None:
    approval_id = await ask_refund(world)
    (offer,) = world.offers()
    assert f"/approve {approval_id}" in offer.question and "refund" in offer.question and "amount:150" in offer.question
    verdicts = [parse_option_id(o.id) for o in offer.options]
    assert [(v[0], v[1]) for v in verdicts if v] == [(approval_id, "approve"), (approval_id, "deny")]
    assert world.texts() == []  # the question is the message: no reply text
    (requested,) = await world.events("approval_requested")
    assert requested["status"] == "waiting_for_approval" and requested["tool"] == "refund"
    history = await world.history()
    tool_entries = [h for h in history if h["role"] == "tool"]
    assert json.loads(tool_entries[-1]["text"])["status"] == "waiting_for_approval"


async def test_approve_by_button_runs_the_call_once_and_the_model_answers(world: World) -> None:
    approval_id = await ask_refund(world)
    await world.send(world.click(world.approve_option()))
    assert world.refunds == [150]
    assert "refunded" in world.texts()[-1]  # the model read the result and answered
    record = await world.record(approval_id)
    assert record.status == "executed" and record.decided_by == "telegram:u1" and record.decision_via == "button"
    (decided,) = await world.events("approval_decided")
    assert decided["result"] == "applied" and decided["via"] == "button"
    assert where(await world.events("approval_settled"), status="executed")
    # a second click is answered without the model and runs nothing
    await world.send(world.click(world.approve_option()))
    assert world.refunds == [150]
    assert "already approved" in world.texts()[-1]


async def test_approve_by_command_and_by_the_console(world: World) -> None:
    approval_id = await ask_refund(world)
    await world.send(world.command("approve", approval_id))
    assert world.refunds == [150]
    assert (await world.record(approval_id)).decision_via == "command"

    second = await ask_refund(world)
    await world.send(world.operator("decide", approval_id=second, verdict="approve"))
    assert world.refunds == [150, 150]
    record = await world.record(second)
    assert record.status == "executed" and record.decided_by == "console:alice" and record.decision_via == "console"
    assert "refunded" in world.texts()[-1]


async def test_deny_tells_the_model_it_did_not_happen(world: World) -> None:
    approval_id = await ask_refund(world)
    await world.send(world.click(world.deny_option()))
    assert world.refunds == []
    assert (await world.record(approval_id)).status == "denied"
    assert "did not run" in world.texts()[-1]  # the offline model repeats the tool result's error
    assert where(await world.events("approval_settled"), status="denied")


async def test_someone_else_may_not_decide_and_unknown_ids_are_answered(world: World) -> None:
    approval_id = await ask_refund(world)
    await world.send(world.click(world.approve_option(), user="u2"))  # another member of a group chat
    assert world.refunds == []
    assert "someone else" in world.texts()[-1]
    assert (await world.record(approval_id)).status == "pending"
    assert where(await world.events("approval_decided"), result="not_allowed", actor="telegram:u2")
    await world.send(world.command("approve", "nosuchapproval1"))
    assert "don't know that approval" in world.texts()[-1]
    # a forged button naming the right id with another action hash changes nothing
    await world.send(world.click(option_id(approval_id, "approve", "0" * 64)))
    assert world.refunds == [] and (await world.record(approval_id)).status == "pending"
    await world.send(world.command("approve", ""))  # the only pending one
    assert world.refunds == [150]


async def test_the_wait_is_a_span_and_every_run_records_its_policy_version(world: World) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from switchboard import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        approval_id = await ask_refund(world)
        record = await world.record(approval_id)
        await world.send(world.click(world.approve_option()))
    finally:
        tracing.install(None)
    (wait,) = [s for s in exporter.get_finished_spans() if s.name == "approval.wait"]
    assert wait.start_time == int(record.requested_at * 1e9)
    assert wait.attributes is not None and wait.attributes["approval.id"] == approval_id
    assert wait.attributes["approval.verdict"] == "approve" and wait.attributes["tool.name"] == "refund"
    assert wait.end_time is not None and wait.end_time > wait.start_time
    metered = await world.events("usage_metered")
    assert len(metered) == 2 and all(m["policy_version"] == record.request.policy_version for m in metered)  # type: ignore[union-attr]
    assert record.request is not None and record.request.policy_version


async def test_a_typed_approve_is_a_decision_on_channels_without_commands(world: World) -> None:
    """Web chat, Slack, WhatsApp... deliver ``/approve ID`` as a plain message: it decides, it does not supersede."""
    approval_id = await ask_refund(world)
    await world.send(world.message(f"/approve {approval_id}"))  # a Posted message, not a CommandIssued
    assert world.refunds == [150]
    record = await world.record(approval_id)
    assert record.status == "executed" and record.decision_via == "command"
    second = await ask_refund(world)
    await world.send(world.message(f"  /DENY {second} "))
    assert world.refunds == [150] and (await world.record(second)).status == "denied"
    third = await ask_refund(world)
    await world.send(world.message(f"please /approve {third}"))  # words around it: a new message, which supersedes
    assert world.refunds == [150] and (await world.record(third)).status == "superseded"


def acks(world: World) -> dict[str, str]:
    """``ack_ref`` → notice of every tap acknowledgement the channel was asked for."""
    return {s.action.ack_ref: s.action.text for s in world.deliverer.sent if isinstance(s.action, AckChoice)}


def tap(world: World, option: str, ref: str, *, user: str | None = None) -> InboundMessage:
    event = ChoiceSelected(option_id=option, offer_message_id="1", ack_ref=ref)
    return world.message("Approve", event, user=user)


async def test_every_press_is_acknowledged_once_with_the_refusal_as_its_notice(world: World) -> None:
    first = await ask_refund(world)
    await world.send(tap(world, world.approve_option(), "q1"))
    assert world.refunds == [150] and acks(world) == {"q1": ""}
    await world.send(tap(world, world.deny_option(), "q2"))  # decided already
    assert acks(world)["q2"].startswith("That was already approved by telegram:u1")

    second = await ask_refund(world)
    await world.send(tap(world, world.approve_option(), "q3", user="u2"))  # not the requester's
    await world.send(tap(world, option_id(second, "approve", "0" * 64), "q4"))  # another version of the request
    await world.send(tap(world, option_id("nosuchapproval", "approve", "0" * 64), "q5"))
    assert [acks(world)[q] for q in ("q3", "q4", "q5")] == [NOT_YOURS_TEXT, MISMATCH_TEXT, UNKNOWN_TEXT]
    await world.send(tap(world, world.deny_option(), "q6"))
    assert acks(world)["q6"] == "" and (await world.record(second)).status == "denied"

    await world.send(tap(world, "fruit.banana", "q7"))  # not a decision (an offer_choice answer): no notice
    assert acks(world)["q7"] == ""
    sent = [s.action for s in world.deliverer.sent if isinstance(s.action, AckChoice)]
    assert len(sent) == 7 and (await world.record(first)).status == "executed"  # each press answered once
