"""A turn's approvals: pausing at a gated call, continuing after a decision, holding a reply for review.

One :class:`TurnApprovals` per running turn, the runtime's half of ``docs/ARCHITECTURE.md`` §6 "Approvals": a gated
call becomes a pending record and a question with buttons and the turn ends ``waiting_for_approval``; an approved
action runs under the key its request named, re-checked by the gateway; review mode holds the final reply; button
presses are acknowledged as soon as the decision is known.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Protocol

from switchboard.core.actions import AckChoice, SettleChoices, ShowToolCall
from switchboard.core.agent.budget import Budget
from switchboard.core.agent.config import Agent
from switchboard.core.agent.decider import Reply
from switchboard.core.agent.programs import PausedProgram, ProgramSnapshotError
from switchboard.core.agent.programstep import ProgramStep, refusal, resume_program_call
from switchboard.core.agent.toolcards import outcome_card, started
from switchboard.core.agent.worklog import work_entries
from switchboard.core.approvals.decisions import Ask, Settled
from switchboard.core.approvals.grants import GATEWAY_PRINCIPAL
from switchboard.core.approvals.policy import Policy
from switchboard.core.approvals.records import (
    ApprovalRecord,
    ApprovalRequest,
    ApprovalStore,
    record_verifies,
    sign_record,
)
from switchboard.core.approvals.suspend import (
    approval_id_for,
    approval_offer,
    approval_options,
    approval_record,
    evidence_of,
    reply_record,
    session_state_sha256,
    waiting_content,
)
from switchboard.core.approvals.takeover import human_step, settled_messages
from switchboard.core.events import ApprovalRequested, Event
from switchboard.core.inbound import TurnPlan
from switchboard.core.messages import ChoiceSelected
from switchboard.core.model import ChatMessage, ToolCall
from switchboard.core.protocols import conforms
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.calls import ToolOutcome
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import CallScope, ToolGateway
from switchboard.core.turn import ActivitySink, SessionStore, TurnRequest, TurnResult, TurnSink

__all__ = ["REVIEW_HOLD_TEXT", "HeldSink", "RunningTurn", "TurnApprovals", "TurnRuntime", "reply_sink"]

logger = logging.getLogger(__name__)

_MAY_HAVE_RUN = frozenset({"ambiguous"})
"""Outcomes of an approved call that did not run now because an earlier attempt may have run it (in doubt: the model
tells the user it may have happened; it is never run again)."""

REVIEW_HOLD_TEXT = "A person checks my answers here before they are sent; you'll have it as soon as it is approved."


class TurnRuntime(Protocol):
    """What the approvals read of the runtime (:class:`~switchboard.core.agent.runtime.Runtime`)."""

    @property
    def snapshot_key(self) -> bytes:
        """Signs paused programs and approval records."""

    @property
    def registry(self) -> ToolRegistry:
        """The tools, to find an approved call's tool."""

    @property
    def gateway(self) -> ToolGateway:
        """The tool gateway (its inline size for a resumed program's results)."""


class RunningTurn(Protocol):
    """What the approvals read and change of the turn in flight (the runtime's turn)."""

    ctx: ToolContext
    """The calls' context; an approved call runs as the principal who asked, then it is put back."""

    @property
    def rt(self) -> TurnRuntime:
        """The runtime playing the turn."""

    @property
    def request(self) -> TurnRequest:
        """The turn's request."""

    @property
    def sink(self) -> TurnSink:
        """Where the turn's facts go."""

    @property
    def store(self) -> SessionStore:
        """The session's store (an :class:`ApprovalStore` keeps approvals)."""

    @property
    def agent(self) -> Agent:
        """The agent the turn plays."""

    @property
    def budget(self) -> Budget:
        """The turn's budget (an approved call is charged to it)."""

    @property
    def scope(self) -> CallScope:
        """The tools this turn may call."""

    @property
    def output(self) -> Reply:
        """The reply being written."""

    @property
    def message_id(self) -> str | None:
        """The message the turn answers."""

    @property
    def facts(self) -> dict[str, dict[str, Any]]:
        """Gateway facts of each call by call id."""

    @property
    def messages(self) -> list[ChatMessage]:
        """The model's conversation so far."""

    @property
    def opening(self) -> int:
        """Where this turn's own messages start in :attr:`messages`."""

    async def call_tool(
        self, name: str, args: dict[str, Any], call_id: str | None, *, approved: ApprovalRequest | None = None
    ) -> ToolOutcome:
        """One call through the gateway (``approved``: as a person approved it)."""


class TurnApprovals:
    """The approvals of one turn (see the module docstring)."""

    def __init__(self, turn: RunningTurn) -> None:
        self.turn = turn
        self.store: ApprovalStore | None = turn.store if conforms(turn.store, ApprovalStore) else None
        self.waiting: list[str] = []
        """Approvals this turn asked for: the run is ``waiting_for_approval`` once it returns."""
        self.news: list[ChatMessage] = []
        """Ended approvals, as the model learns them (put after the turn's opening)."""
        self.lead: list[str] = []
        """Review mode: what leads the reply and is not the model's to review (an approved draft, an operator's
        words, fixed replies); sent as it is before the question that the new draft waits."""
        self.acked: set[str] = set()
        """``ack_ref`` of the presses acknowledged in this turn."""

    async def state(self) -> str:
        """The hash of the session state an approval depends on, as stored now."""
        return session_state_sha256(await self.turn.store.load_slots())

    # ---------------------------------------------------------------- pausing

    async def suspend(self, call_id: str | None, request: ApprovalRequest, program: PausedProgram | None) -> str:
        """Ask a person about a gated call; the tool message content the model reads for it."""
        turn = self.turn
        if self.store is None:
            logger.warning("a call needs approval but this session store keeps no approvals; refused")
            return refusal(request.tool, "not performed: it needs a person's approval", error_class="needs_approval")
        approval_id = approval_id_for(turn.rt.snapshot_key, request.idempotency_key)
        record = await self.store.approval_get(approval_id)  # a re-run of this turn asked already: ask again
        if record is None:
            signed = program.dump(key=turn.rt.snapshot_key) if program is not None else None
            state = await self.state()
            record = approval_record(
                turn.request, request, turn.ctx.policy, approval_id=approval_id, state=state, call_id=call_id,
                requested_by=turn.ctx.actor, program=signed,
            )  # fmt: skip
            record = sign_record(record, turn.rt.snapshot_key)
            await self.store.approval_open(record)
        await self._requested(record)  # (again, on a re-run: its first attempt may have died before saying so)
        if turn.ctx.act is not None:
            await turn.ctx.act(approval_offer(record, reply_to=turn.message_id))
        self.waiting.append(record.id)
        return waiting_content(record)

    async def _requested(self, record: ApprovalRecord) -> None:
        request = record.request
        await self.turn.sink.event(
            ApprovalRequested(
                message_id=self.turn.message_id,
                approval_id=record.id,
                approval_kind=record.kind,
                tool=request.tool if request is not None else None,
                rule=request.rule if request is not None else "review",
                policy_version=request.policy_version if request is not None else self.turn.ctx.policy.version,
                action_sha256=record.action_sha256,
                expires_at=record.expires_at,
                program=record.program is not None,
            )
        )

    async def program_step(self, call_id: str, step: ProgramStep) -> tuple[str, bool]:
        """The tool message of a program step; a program paused at a gated call waits for its approval."""
        if step.paused is None or step.approval is None:
            return step.content, step.ok
        return await self.suspend(call_id, step.approval, step.paused), True

    # ---------------------------------------------------------------- deciding

    async def before_model(self, plan: TurnPlan) -> TurnResult | None:
        """Operator actions and decisions; a result when the model is not asked (else ``None``)."""
        if self.store is None:
            return None
        step = await human_step(
            self.turn.request,
            plan,
            self.store,
            execute=self.execute,
            state=self.state,
            event=self.turn.sink.event,
            verify=lambda record: record_verifies(record, self.turn.rt.snapshot_key),
            answer=self._answer,
        )
        if step is None:
            return None
        await self._show_settled(step.settled)
        self.news = settled_messages(step.model_news)
        await self._paused_again(step.model_news)
        if step.asks_model:
            if self.turn.ctx.policy.mode == "review":  # decided already: never held again with the new draft
                self.lead = step.texts
                return None
            for text in step.texts:  # fixed replies and operators' words lead the reply
                await self.turn.output.write(text, 0)
            return None
        history = work_entries(self.news, self.turn.facts)
        return TurnResult(text="\n\n".join(step.texts), steps=0, history=history, waiting_for=self.waiting)

    async def _show(self, card: ShowToolCall | None) -> None:
        if card is not None and conforms(self.turn.sink, ActivitySink):
            await self.turn.sink.activity(card)

    async def _show_settled(self, settled: list[Settled]) -> None:
        """Each decided (or expired) tool approval's buttons are spent, wherever it was decided: the channel is told."""
        sink = self.turn.sink
        if not conforms(sink, ActivitySink):
            return
        for item in settled:
            record = item.record
            if record.kind != "tool" or record.request is None or item.status == "superseded":
                continue
            approve, deny = (option.id for option in approval_options(record))
            chosen, label = {"denied": (deny, "Denied"), "expired": (None, "Expired")}.get(
                item.status, (approve, "Approved")
            )  # executed, or refused when checked again: approved either way
            decider = record.decided_by or ""
            by = "you" if decider == record.requested_by else "" if decider == GATEWAY_PRINCIPAL else decider
            ids = (approve, deny)
            await sink.activity(
                SettleChoices(ids=ids, chosen=chosen, label=label, by=by, reply_to=self.turn.message_id)
            )

    async def _paused_again(self, settled: list[Settled]) -> None:
        """Approvals of programs that resumed and paused again: the turn waits for them.

        Asked just now, they are waiting already; a re-run of a turn whose worker died after the resumed program
        was settled finds them here (the program paused at ``approval_<id>`` of the approval it resumed from).
        """
        resumed = {
            f"approval_{s.record.id}" for s in settled if s.record.program is not None and s.status == "executed"
        }
        if not resumed or self.store is None:
            return
        for record in await self.store.approval_pending():
            if (
                record.call_id in resumed
                and record.run_id == self.turn.request.run_id
                and record.id not in self.waiting
            ):
                self.waiting.append(record.id)

    async def _answer(self, ask: Ask, text: str) -> None:
        if ask.ack_ref is not None:
            await self._ack(ask.ack_ref, text)

    async def _ack(self, ack_ref: str, text: str) -> None:
        act = self.turn.ctx.act
        if act is None or ack_ref in self.acked:
            return
        self.acked.add(ack_ref)
        await act(AckChoice(ack_ref=ack_ref, text=text, reply_to=self.turn.message_id))

    async def ack_taps(self) -> None:
        """Acknowledge the turn's button presses no decision answered (an ``offer_choice`` answer): no notice."""
        for message in self.turn.request.messages:
            if isinstance(message.event, ChoiceSelected) and message.event.ack_ref is not None:
                await self._ack(message.event.ack_ref, "")

    async def execute(self, record: ApprovalRecord) -> tuple[str, bool, str | None]:
        """Run an approved action once, under its recorded key; ``(content, ok, refusal reason)``.

        It acts for the principal who asked, with that principal's permissions as configured now (whoever approved
        it: an operator's approval lends the action no permission of the operator's), and so does the rest of a
        resumed program.
        """
        turn = self.turn
        acting = turn.ctx
        if record.requested_by != acting.actor:
            resolve = turn.request.permissions_of
            granted = resolve(record.requested_by) if resolve is not None else frozenset[str]()
            turn.ctx = dataclasses.replace(acting, actor=record.requested_by, permissions=granted)
        try:
            return await self._execute(record)
        finally:
            turn.ctx = dataclasses.replace(turn.ctx, actor=acting.actor, permissions=acting.permissions)

    async def _execute(self, record: ApprovalRecord) -> tuple[str, bool, str | None]:
        turn, request = self.turn, record.request
        assert request is not None
        budget = turn.budget
        tool = turn.rt.registry.get(request.tool)
        if not budget.can_afford_tool(tool.cost if tool is not None else 0):
            return "", False, "budget"
        paused: PausedProgram | None = None
        name, args = request.tool, dict(request.arguments)
        if record.program is not None:
            try:
                paused = PausedProgram.load(record.program.encode(), key=turn.rt.snapshot_key)
            except ProgramSnapshotError as err:
                logger.warning("a paused program could not be resumed: %s", err)
                return "", False, "bad_snapshot"
            name, args = paused.tool, paused.args  # signed: what the program asked, checked against the hash
        card = None if paused else started(ToolCall(id=record.call_id or f"approval_{record.id}", name=name,
                                                    arguments=args), turn.message_id)  # fmt: skip
        await self._show(card)  # the call's card, waiting for approval until now, runs
        outcome = await turn.call_tool(name, args, None if paused else f"approval_{record.id}", approved=request)
        if card is not None:
            await self._show(outcome_card(card, outcome, writes=tool is not None and tool.side_effect == "write"))
        if not outcome.ok and outcome.attempts == 0 and outcome.error_class not in _MAY_HAVE_RUN:
            # refused before it ran (mismatch, policy, permission); an earlier attempt in doubt is no refusal
            return outcome.for_model(), False, outcome.error_class or "refused"
        if paused is None:
            return outcome.for_model(codeact=turn.agent.codeact), outcome.ok, None
        step = await resume_program_call(
            paused,
            outcome,
            call_id=f"approval_{record.id}",
            budget=budget,
            tool_of=turn.rt.registry.get,
            scope=turn.scope,
            inline_bytes=turn.rt.gateway.inline_bytes,
            call_tool=turn.call_tool,
            event=turn.sink.event,
            message_id=turn.message_id,
        )
        content, ok = await self.program_step(f"approval_{record.id}", step)
        return content, ok, None

    # ---------------------------------------------------------------- review

    async def hold_reply(self, text: str) -> str | None:
        """What to send instead of the final ``text`` (``None``: send it as it is).

        In review mode the reply is held for a person (a ``kind="reply"`` approval with what it rests on) and the
        user is told it follows; a turn already waiting for a tool approval sends only its question.
        """
        turn = self.turn
        if self.store is None or turn.ctx.policy.mode != "review":
            return None
        if self.waiting or not text.strip():
            return "\n\n".join(self.lead)
        approval_id = approval_id_for(turn.rt.snapshot_key, f"{turn.request.run_id}\nreply")
        if await self.store.approval_get(approval_id) is None:  # else a re-run of this turn held it already
            evidence = evidence_of(turn.messages[turn.opening :])
            state = await self.state()
            record = reply_record(
                turn.request, turn.ctx.policy, text, evidence, approval_id=approval_id, state=state,
                requested_by=turn.ctx.actor,
            )  # fmt: skip
            record = sign_record(record, turn.rt.snapshot_key)
            await self.store.approval_open(record)
            await self._requested(record)
        self.waiting.append(approval_id)
        return "\n\n".join([*self.lead, REVIEW_HOLD_TEXT])


class HeldSink:
    """The reply's sink in review mode: nothing streams to the user before a person approved it."""

    def __init__(self, sink: TurnSink) -> None:
        self.sink = sink

    async def delta(self, text: str) -> None:
        """Kept back (the held reply is sent whole once approved)."""

    async def event(self, event: Event) -> None:
        """Facts still go to the event log."""
        await self.sink.event(event)


def reply_sink(sink: TurnSink, store: SessionStore, policy: Policy) -> TurnSink:
    """Where the turn's reply streams: the sink, or in review mode (with approvals kept) nowhere yet."""
    return HeldSink(sink) if policy.mode == "review" and conforms(store, ApprovalStore) else sink
