"""A CodeAct program paused at a gated call resumes from its signed snapshot on another worker; a crash between
approval and execution executes once."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from switchboard.core.approvals.policy import PolicyConfig
from switchboard.core.approvals.records import ApprovalRecord, DecideOutcome, DecisionVia, Verdict
from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.queue.keys import SessionKeys
from switchboard.worker.drain import Drainer

from .harness import World, where

PROGRAM = """/run note(text="before")
r = refund(amount=150)
print("refunded", r["refunded"])
note(text="after " + str(r["refunded"]))
r["refunded"] * 2"""


async def test_a_program_paused_at_a_gated_call_resumes_on_another_worker(world: World) -> None:
    world.codeact = True
    await world.send(world.message(PROGRAM), world.drainer("w1"))
    assert world.notes == ["before"] and world.refunds == []  # stopped at refund, the rest not run
    record = await world.only_approval()
    assert record.program is not None and record.request is not None and record.request.tool == "refund"
    assert json.loads(record.program)["mac"]  # signed
    (requested,) = await world.events("approval_requested")
    assert requested["program"] is True

    # the decision is drained by another worker, with its own runtime: only Redis and the signing key are shared
    await world.send(world.click(world.approve_option()), world.drainer("w2"))
    assert world.refunds == [150]
    assert world.notes == ["before", "after 150"]  # the rest of the program ran, once
    reply = world.texts()[-1]
    assert "refunded 150" in reply and "300" in reply  # its printed output and its value reached the model
    assert (await world.record(record.id)).status == "executed"


async def test_a_tampered_snapshot_is_refused(world: World) -> None:
    world.codeact = True
    await world.send(world.message(PROGRAM))
    record = await world.only_approval()
    key = SessionKeys(world.session).approval(record.id)
    raw = await world.raw_record(record.id)
    envelope = json.loads(raw["program"])
    envelope["calls"] = 0  # any change breaks the signature
    raw["program"] = json.dumps(envelope)
    await world.client.hset(key, "record", json.dumps(raw))
    await world.send(world.click(world.approve_option()))
    assert world.refunds == [] and world.notes == ["before"]
    outcome = (await world.record(record.id)).outcome
    assert outcome is not None and outcome["reason"] == "approval_mismatch"  # the record is signed too


async def test_a_denied_program_does_not_continue(world: World) -> None:
    world.codeact = True
    await world.send(world.message(PROGRAM))
    await world.send(world.click(world.deny_option()))
    assert world.refunds == [] and world.notes == ["before"]
    assert "did not run" in world.texts()[-1]


class CrashOnce:
    """The drain's store, with one crash injected after ``method`` did its work (the worker died right there)."""

    def __init__(self, store: Any, method: str, crashes: list[str]) -> None:
        self._store, self._method, self._crashes = store, method, crashes

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def load_history(self, limit: int) -> Any:
        return await self._store.load_history(limit)

    async def append_history(self, entries: Sequence[Any]) -> None:
        await self._store.append_history(entries)

    async def load_slots(self) -> dict[str, Any]:
        return dict(await self._store.load_slots())

    async def save_slot(self, name: str, value: Any) -> None:
        await self._store.save_slot(name, value)

    async def approval_decide(
        self,
        approval_id: str,
        verdict: Verdict,
        actor: str,
        via: DecisionVia,
        *,
        action_prefix: str | None,
        run_id: str | None = None,
    ) -> DecideOutcome:
        outcome: DecideOutcome = await self._store.approval_decide(
            approval_id, verdict, actor, via, action_prefix=action_prefix, run_id=run_id
        )
        self._crash("approval_decide")
        return outcome

    async def approval_open(self, record: ApprovalRecord) -> None:
        await self._store.approval_open(record)
        self._crash("approval_open")  # the question was not yet offered, the turn not completed

    async def approval_settle(self, approval_id: str, status: Any, outcome: Any) -> bool:
        self._crash("approval_settle")  # the effect ran; its approval was not yet consumed
        consumed = bool(await self._store.approval_settle(approval_id, status, outcome))
        self._crash("approval_settled")  # consumed; the model has not answered yet
        return consumed

    def _crash(self, where: str) -> None:
        if where == self._method and not self._crashes:
            self._crashes.append(where)
            raise RuntimeError(f"worker died after {where}")


def crashing(world: World, method: str, crashes: list[str]) -> Drainer:
    drainer = world.drainer()
    inner = drainer.runner

    async def runner(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        return await inner(request, sink, CrashOnce(store, method, crashes))

    drainer.runner = runner
    return drainer


async def crash_between(world: World, method: str, text: str = '/tool refund {"amount": 150}') -> ApprovalRecord:
    await world.send(world.message(text))
    record = await world.only_approval()
    crashes: list[str] = []
    await world.send(world.click(world.approve_option()), crashing(world, method, crashes))
    assert crashes == [method]  # the first attempt died there; the drain ran the turn again
    assert len(await world.events("run_failed")) == 1
    return record


async def test_a_crash_between_approval_and_execution_executes_once(world: World) -> None:
    record = await crash_between(world, "approval_decide")
    assert world.refunds == [150]
    assert (await world.record(record.id)).status == "executed"
    assert "refunded" in world.texts()[-1]


async def test_a_crash_between_the_effect_and_its_settlement_does_not_repeat_it(world: World) -> None:
    record = await crash_between(world, "approval_settle")
    assert world.refunds == [150]  # the re-run found the effect recorded under the approved key
    assert (await world.record(record.id)).status == "executed"
    assert len(where(await world.events("approval_settled"), status="executed")) == 1


async def test_a_crash_after_asking_asks_once(world: World) -> None:
    crashes: list[str] = []
    await world.send(world.message('/tool refund {"amount": 150}'), crashing(world, "approval_open", crashes))
    assert crashes == ["approval_open"]
    requested = {e["approval_id"] for e in await world.events("approval_requested")}
    assert len(requested) == 1  # the re-run found the approval it had opened: the same id
    assert len(world.offers()) == 1  # and the outbox sent its question once
    pending = await world.client.zrange(SessionKeys(world.session).approvals, 0, -1)
    assert {p.decode() for p in pending} == requested
    await world.send(world.click(world.approve_option()))
    assert world.refunds == [150]


async def test_a_crash_after_the_approval_was_settled_still_answers(world: World) -> None:
    """The worker dies once the approved call ran and its approval was consumed, before the model answered: the
    re-run tells the model the recorded outcome and it answers, once; no "already approved" notice instead."""
    record = await crash_between(world, "approval_settled")
    assert world.refunds == [150]
    assert (await world.record(record.id)).status == "executed"
    replies = world.texts()  # the question is an offer, not a text
    assert len(replies) == 1 and "refund returned" in replies[0] and "already" not in replies[0], replies
    assert "refunded: 150" in replies[0], replies
    assert len(where(await world.events("approval_settled"), status="executed")) == 1  # written by the re-run


async def test_a_crash_after_a_resumed_program_was_settled_still_answers(world: World) -> None:
    world.codeact = True
    record = await crash_between(world, "approval_settled", PROGRAM)
    assert world.refunds == [150] and world.notes == ["before", "after 150"]
    assert (await world.record(record.id)).status == "executed"
    replies = world.texts()
    assert len(replies) == 1 and "The program printed: refunded 150" in replies[0], replies
    assert "300" in replies[0] and "already" not in replies[0], replies


async def test_a_second_click_after_execution_gets_the_fixed_reply(world: World) -> None:
    """Only a re-run of the turn that carried the approval out continues it: another click is told it is done."""
    await world.send(world.message('/tool refund {"amount": 150}'))
    option = world.approve_option()
    await world.send(world.click(option))
    await world.send(world.click(option))
    assert world.refunds == [150]
    assert world.texts()[-1].startswith("That was already approved by") and "carried out" in world.texts()[-1]


TWICE = """/run r = refund(amount=150)
s = refund(amount=20)
print("refunded", r["refunded"], s["refunded"])"""


async def test_a_program_paused_again_still_waits_after_a_crash_past_its_settlement(world: World) -> None:
    """A resumed program pauses at its second gated call; the worker dies once the first approval was consumed. The
    re-run still knows the turn waits for the second approval: in review mode no draft is held beside it."""
    world.codeact = True
    world.policy = PolicyConfig(mode="review")
    first = await crash_between(world, "approval_settled", TWICE)
    assert world.refunds == [150] and (await world.record(first.id)).status == "executed"
    requested = {e["approval_id"] for e in await world.events("approval_requested")}
    pending = [r for r in [await world.record(i) for i in requested] if r.status == "pending"]
    assert [r.kind for r in pending] == ["tool"], pending  # the second refund waits; no reply held for review
    assert not any("A person checks my answers" in t for t in world.texts()), world.texts()


async def test_a_crash_past_the_settlement_of_a_batch_of_clicks_answers_the_first_and_tells_the_second(
    world: World,
) -> None:
    """Two taps on approve in one turn, the worker dies after the first settled it: the re-run continues the first
    (the model answers) and tells the second it is done, as the first attempt would have; the refund runs once."""
    await world.send(world.message('/tool refund {"amount": 150}'))
    batch = [world.click(world.approve_option()), world.click(world.approve_option())]
    for message in batch:
        await world.ingestor.ingest(message, busy_policy="collect")
    crashes: list[str] = []
    await crashing(world, "approval_settled", crashes).drain(batch[-1].session_key)
    assert crashes == ["approval_settled"] and world.refunds == [150]
    (reply,) = world.texts()
    assert reply.count("already approved by telegram:u1 and carried out") == 1 and "refund returned" in reply, reply


async def test_a_crash_after_a_held_reply_was_approved_still_sends_it(world: World) -> None:
    """Review mode: the worker dies once the operator's approval of the held reply was consumed; the re-run sends the
    draft (once), instead of nothing."""
    world.policy = PolicyConfig(mode="review")
    await world.send(world.message("what is the refund policy?"))
    record = await world.only_approval()
    crashes: list[str] = []
    decide = world.operator("decide", approval_id=record.id, verdict="approve")
    await world.send(decide, crashing(world, "approval_settled", crashes))
    assert crashes == ["approval_settled"] and (await world.record(record.id)).status == "executed"
    assert world.texts()[1:] == [record.draft]


async def test_a_crash_after_a_deny_was_recorded_still_tells_the_user(world: World) -> None:
    """The worker dies once the deny was applied, before the model answered: the re-run tells the model (it says the
    refund did not happen) instead of answering "That was already denied"."""
    await world.send(world.message('/tool refund {"amount": 150}'))
    record = await world.only_approval()
    crashes: list[str] = []
    await world.send(world.click(world.deny_option()), crashing(world, "approval_decide", crashes))
    assert crashes == ["approval_decide"] and world.refunds == []
    assert (await world.record(record.id)).status == "denied"
    (reply,) = world.texts()
    assert "did not run" in reply and "already denied" not in reply, reply


async def test_a_crash_after_an_expiry_was_recorded_still_tells_the_user(world: World) -> None:
    await world.send(world.message('/tool refund {"amount": 150}'))
    record = await world.only_approval()
    await world.client.hset(SessionKeys(world.session).approval(record.id), "expires_at", "1")  # time passed
    crashes: list[str] = []
    expire = world.operator("decide", operator="switchboard", approval_id=record.id, verdict="expire")
    await world.send(expire, crashing(world, "approval_decide", crashes))
    assert crashes == ["approval_decide"] and (await world.record(record.id)).status == "expired"
    (reply,) = world.texts()
    assert "expired" in reply and "did not run" in reply, reply
