"""What a drain asks before and after a turn when budgets or linked identities are configured, and ``/usage``.

Built only when the YAML file has ``budgets:`` or turns on ``identity:`` (:meth:`TurnGate.build`): without them a turn
costs no Redis command more. Before a turn that would ask the model, the sender's person is looked up (when anything
needs it) and the period budgets are checked: a used-up budget answers the user with one clear message and the model
is never asked. The turn's metered credits are charged when its ``usage_metered`` fact is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from switchboard.core.approvals.suspend import principal_of
from switchboard.core.budgets import IdentityConfig, usage_text
from switchboard.core.commands import turn_command
from switchboard.core.events import Event, UsageMetered
from switchboard.core.inbound import plan_turn
from switchboard.core.messages import InboundMessage
from switchboard.core.turn import TurnRequest, TurnResult
from switchboard.queue.budgets import Budgets, Counter
from switchboard.queue.people import LinkRefused, People
from switchboard.settings import FileConfig

__all__ = [
    "LINK_COMMAND",
    "USAGE_COMMAND",
    "Ticket",
    "TurnGate",
    "command_of",
    "is_direct",
    "usage_without_budgets",
]

USAGE_COMMAND = "usage"
LINK_COMMAND = "link"


def command_of(messages: Sequence[InboundMessage]) -> str | None:
    """The command every message of the turn is (``/usage`` sent twice is one ``usage``), else ``None``."""
    command = turn_command(messages)
    return command.name if command is not None else None


_ONE_TO_ONE = frozenset({"web", "whatsapp", "messenger", "instagram"})
"""Channels whose conversations are always between the bot and one person."""
NOT_DIRECT_TEXT = (
    "Ask for a link code in a direct message with me, not here: anyone who sees the code could link their account "
    "to yours."
)


def is_direct(message: InboundMessage) -> bool:
    """Whether ``message`` came from a one-to-one conversation with the bot (what the channel says, else no)."""
    meta = message.meta
    match message.conversation.channel:
        case "telegram":
            return meta.get("chat_type") == "private"
        case "slack":
            return meta.get("channel_type") == "im"
        case "discord":
            return meta.get("dm") is True
        case channel:
            return channel in _ONE_TO_ONE


def usage_without_budgets() -> TurnResult:
    """``/usage`` where no budget is configured (no Redis command)."""
    return TurnResult(text=usage_text([]), steps=0)


@dataclass
class Ticket:
    """What the gate decided about one turn."""

    request: TurnRequest
    """The request to run (its ``person`` set, its credit cap narrowed to the budgets' least credits left)."""
    answer: TurnResult | None = None
    """Answered without the model (a used-up budget, ``/usage``, ``/link``): the turn's result."""
    events: list[Event] = field(default_factory=list)
    """Facts of the decision, for the session's event log."""
    counters: tuple[Counter, ...] = ()
    """The budget counters the turn's metered credits are charged to."""
    cap: float | None = None
    """The credit cap the budgets set (the least credits left), when it is the turn's cap."""
    exhausted: str = ""
    """What the user is told if the turn stops at that cap without answering."""


class TurnGate:
    """Budgets and linked identities, as one drain uses them."""

    def __init__(self, redis: aioredis.Redis, config: FileConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.budgets = Budgets(redis, config.budgets, clock=clock) if config.budgets else None
        self.people = People(redis, clock=clock)
        self.identity: IdentityConfig = config.identity

    @classmethod
    def build(cls, redis: aioredis.Redis, config: FileConfig | None) -> TurnGate | None:
        """A gate when budgets or identity are configured, else ``None`` (the drain then asks nothing)."""
        if config is None or not (config.budgets or config.identity.self_link or config.identity.resolve):
            return None
        return cls(redis, config)

    def _needs_person(self) -> bool:
        return self.identity.resolve or self.identity.self_link or bool(self.budgets and self.budgets.by_user)

    async def before(self, request: TurnRequest, messages: Sequence[InboundMessage]) -> Ticket:
        """Decide the turn: answer ``/usage`` and ``/link``, refuse a turn over budget, or narrow its credit cap."""
        tenant, principal = request.tenant, request.actor
        command = command_of(messages)
        person = await self.people.person_of(tenant, principal) if self._needs_person() else None
        if person is not None:
            request = self._as_person(request, messages, person)
        user = person or principal
        if command == LINK_COMMAND and self.identity.self_link:
            typed = turn_command(messages)
            return await self._link(request, messages[-1], typed.args if typed is not None else "")
        if command == USAGE_COMMAND:
            if self.budgets is None:
                return Ticket(request, usage_without_budgets())
            text = await self.budgets.usage(tenant, request.agent.name, user, principal)
            return Ticket(request, TurnResult(text=text, steps=0))
        if self.budgets is None or plan_turn(messages).kind != "model":
            return Ticket(request)
        admission = await self.budgets.admit(tenant, request.agent.name, user, principal)
        if admission.refused is not None:
            refused = admission.refused.model_copy(update={"message_id": messages[-1].id})
            return Ticket(request, TurnResult(text=admission.text, steps=0), [refused])
        left, cap = admission.credits_left, request.credit_budget
        if left is None or (cap is not None and cap <= left):
            return Ticket(request, counters=admission.counters)
        ticket = Ticket(request.model_copy(update={"credit_budget": left}), counters=admission.counters, cap=left)
        ticket.exhausted = admission.binding_text
        return ticket

    @staticmethod
    def _as_person(request: TurnRequest, messages: Sequence[InboundMessage], person: str) -> TurnRequest:
        """The request acting for ``person`` too: its ``person`` set, and the grants of ``person:<id>`` added.

        Grants are added only when every message of the turn is the actor's own: a batch holding others' messages
        keeps what all of its senders hold.
        """
        update: dict[str, object] = {"person": person}
        if request.permissions_of is not None and all(principal_of(m) == request.actor for m in messages):
            update["permissions"] = request.permissions | request.permissions_of(f"person:{person}")
        return request.model_copy(update=update)

    async def charge(self, ticket: Ticket, metered: UsageMetered) -> list[Event]:
        """Charge a turn's metered credits to its budgets; the alerts crossed for the first time."""
        if self.budgets is None or not ticket.counters:
            return []
        stopped = ticket.cap if ticket.cap is not None and metered.stopped_by == "credits" else None
        return list(await self.budgets.charge(ticket.counters, metered.credits, stopped_at_cap=stopped))

    async def _link(self, request: TurnRequest, message: InboundMessage, code: str) -> Ticket:
        tenant, principal = request.tenant, request.actor
        if ":" not in principal or principal.startswith("console:"):
            return Ticket(request, TurnResult(text="Only a chat account can be linked.", steps=0))
        if not code and not is_direct(message):  # a code shown in a group could be sent back by anyone there
            return Ticket(request, TurnResult(text=NOT_DIRECT_TEXT, steps=0))
        if not code:
            ttl, per_hour = self.identity.code_ttl_s, self.identity.codes_per_hour
            issued = await self.people.issue_code(tenant, principal, ttl_s=ttl, per_hour=per_hour)
            if issued is None:
                text = "You asked for too many link codes; try again in an hour."
            else:
                text = (
                    f"Your link code is {issued}. Within {ttl // 60} minutes, send /link {issued} from your other "
                    "account to link the two. Never share this code with anyone."
                )
            return Ticket(request, TurnResult(text=text, steps=0))
        linked = await self.people.redeem(tenant, principal, code, per_hour=self.identity.codes_per_hour)
        if isinstance(linked, LinkRefused):
            return Ticket(request, TurnResult(text=linked.reason, steps=0))
        text = f"Linked: {' and '.join(linked.principals)} are now one person here."
        return Ticket(request.model_copy(update={"person": linked.person}), TurnResult(text=text, steps=0), [linked])
