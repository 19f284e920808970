"""The people around a run: operators taking a conversation over, and decisions before the model is asked.

:func:`human_step` runs first in every turn with an approval store: operator actions (take over, say, hand back),
then decisions, then the superseding of approvals a new message or ``/reset`` left pending. While an operator holds
the conversation the model is not asked: the user's messages are recorded and the operator answers.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from switchboard.core.agent.prompt import RUN_PROGRAM
from switchboard.core.approvals.decisions import (
    Answer,
    Execute,
    Settled,
    Verify,
    apply_decisions,
    decision_of,
    supersede_pending,
)
from switchboard.core.approvals.records import ApprovalStore, SessionControl
from switchboard.core.events import ControlChanged, Event
from switchboard.core.inbound import TurnPlan, event_text
from switchboard.core.messages import MessageDeleted, OperatorActed, Scheduled
from switchboard.core.model import ChatMessage, ToolCall
from switchboard.core.turn import TurnRequest

__all__ = [
    "HANDED_BACK_TEXT",
    "REPLY_EXPIRED_TEXT",
    "REPLY_NOT_SENT_TEXT",
    "TAKEN_OVER_TEXT",
    "HumanStep",
    "human_step",
    "operator_name",
    "settled_messages",
]

REPLY_NOT_SENT_TEXT = "A person reviewed the answer I had prepared and did not approve it, so it was not sent."
REPLY_EXPIRED_TEXT = (
    "The answer I had prepared waited too long for a person's review and was not sent; please ask again."
)
TAKEN_OVER_TEXT = "You're now talking with {name}, a person on our team."
"""Said to the user when an operator takes the conversation over (it also marks the moment in the history)."""
HANDED_BACK_TEXT = "You're talking with the assistant again."
"""Said to the user when the operator hands the conversation back."""


def operator_name(principal: str) -> str:
    """The name an operator's principal shows (``console:alice`` → ``alice``)."""
    return principal.split(":", 1)[1] if principal.startswith("console:") else principal


@dataclass
class HumanStep:
    """What people did in this turn, before any model call."""

    settled: list[Settled] = field(default_factory=list)
    """Approvals that ended (the model is told each), and held replies to send."""
    texts: list[str] = field(default_factory=list)
    """Said to the user without the model: operators' messages, fixed replies, approved drafts."""
    taken_over: bool = False
    """An operator holds the conversation: the model is not asked."""
    asks_model: bool = False
    """The model continues: an approval it asked for ended, or a new message from the user waits."""

    @property
    def model_news(self) -> list[Settled]:
        """Ended tool approvals, which the model is told about."""
        return [s for s in self.settled if s.record.kind == "tool"]


async def human_step(
    request: TurnRequest,
    plan: TurnPlan,
    store: ApprovalStore,
    *,
    execute: Execute,
    state: Callable[[], Awaitable[str]],
    event: Callable[[Event], Awaitable[None]],
    verify: Verify | None = None,
    answer: Answer | None = None,
) -> HumanStep | None:
    """Apply the turn's operator actions and decisions; ``None`` when the turn has none and nothing is pending.

    ``answer`` acknowledges each decision's button press as soon as the decision is known.
    """
    step = HumanStep()
    for message in request.messages:
        action = message.event
        if isinstance(action, Scheduled):
            if action.action == "message" and message.text.strip():  # sent as it is, like an operator's say
                step.texts.append(message.text)
            continue
        if not isinstance(action, OperatorActed):
            continue
        match action.action:
            case "take_over":
                await store.set_control(SessionControl(operator=action.operator, since=time.time()))
                await event(ControlChanged(message_id=message.id, action="take_over", operator=action.operator))
                step.texts.append(TAKEN_OVER_TEXT.format(name=operator_name(action.operator)))
            case "hand_back":
                await store.set_control(None)
                await event(ControlChanged(message_id=message.id, action="hand_back", operator=action.operator))
                step.texts.append(HANDED_BACK_TEXT)
            case "say":
                if message.text.strip():
                    step.texts.append(message.text)
            case "decide":
                pass
    asks = [ask for m in request.messages if (ask := decision_of(m)) is not None]
    news = [m for m in plan.messages if decision_of(m) is None and event_text(m) is not None]
    operated = any(
        isinstance(m.event, OperatorActed) or (isinstance(m.event, Scheduled) and m.event.action == "message")
        for m in request.messages
    )
    control = await store.control()
    pending = [
        record
        for record in (await store.approval_pending() if (news or plan.reset) and control is None else [])
        if record.run_id != request.run_id  # a re-run of the asking turn: its own approvals stand
    ]
    if not asks and not operated and control is None and not pending:
        return None
    applied = await apply_decisions(
        asks, store, execute=execute, state=state, event=event, verify=verify, run_id=request.run_id, answer=answer
    )
    step.settled += applied.settled
    step.texts += applied.notices
    if pending:
        step.settled += await supersede_pending(store, event, run_id=request.run_id)
    for settled in step.settled:
        if settled.record.kind == "reply":
            held = {"sent": settled.content, "expired": REPLY_EXPIRED_TEXT}
            step.texts.append(held.get(settled.status, REPLY_NOT_SENT_TEXT))
    step.taken_over = control is not None
    step.asks_model = not step.taken_over and (bool(news) or bool(step.model_news))
    if not news and all(isinstance(m.event, MessageDeleted | OperatorActed | Scheduled) for m in plan.messages):
        step.asks_model = step.asks_model and bool(step.model_news)
    return step


def settled_messages(settled: list[Settled]) -> list[ChatMessage]:
    """How the model learns what became of the actions it asked for: its call again, with the outcome as result.

    The request's own call already has its result in the history (``waiting_for_approval``); the outcome comes as
    a call of the same tool (``run_program`` for a paused program) and its result, so a tool result stays a tool
    result (never text in the user's voice).
    """
    messages: list[ChatMessage] = []
    for item in settled:
        record, request = item.record, item.record.request
        if request is None:
            continue
        name = RUN_PROGRAM if record.program is not None else request.tool
        arguments = {"resume": record.id} if record.program is not None else dict(request.arguments)
        call = ToolCall(id=f"approval_{record.id}", name=name, arguments=arguments)
        messages.append(ChatMessage(role="assistant", content="", tool_calls=[call]))
        messages.append(ChatMessage(role="tool", content=item.content, tool_call_id=call.id, name=name))
    return messages
