"""The chat commands a drain answers without asking the model: ``/status``, ``/model``, ``/whoami``, ``/help``.

Which message is which command, and who may use it, is :mod:`switchboard.core.commands`; here are the answers that
need the session's state. A command the sender's role may not use is refused (and recorded). ``/usage`` and ``/link``
are the budgets' and identities' (:mod:`switchboard.worker.budgets`), ``/reset`` and ``/new`` the runtime's (this
module only ends a handoff and a ``/model`` choice with them), ``/stop`` the queue's. A turn that is no command costs
no Redis command here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from switchboard.core.agent.config import Agent
from switchboard.core.commands import (
    Command,
    CommandsConfig,
    help_text,
    may_use,
    refusal_text,
    turn_command,
)
from switchboard.core.events import CommandAnswered, Event
from switchboard.core.inbound import RESET_COMMAND_NAMES, greeting
from switchboard.core.messages import ConversationRef, InboundMessage
from switchboard.core.turn import TurnRequest, TurnResult
from switchboard.queue.handoffs import Handoffs
from switchboard.queue.keys import SessionKeys
from switchboard.queue.people import People
from switchboard.settings import FileConfig
from switchboard.types import SessionKey, SessionState

__all__ = ["CommandDesk", "Reply", "model_override"]

DEFAULT_MODEL = "the default model"


@dataclass
class Reply:
    """A command answered without the model: its text and the facts to record."""

    result: TurnResult
    events: list[Event] = field(default_factory=list)


async def model_override(redis: aioredis.Redis, session: SessionKey, agent: Agent) -> Agent:
    """``agent`` with the model ``/model`` chose for the session, when it allows one (one GET, only then)."""
    if not agent.models_allowed:
        return agent
    raw = await redis.get(SessionKeys(session).model)
    chosen = raw.decode() if isinstance(raw, bytes) else raw
    if chosen and chosen in agent.models_allowed and chosen != agent.model:
        return agent.model_copy(update={"model": chosen, "models": None})  # the chosen model runs every step
    return agent


class CommandDesk:
    """Answers the built-in commands of one drain's turns."""

    def __init__(self, redis: aioredis.Redis, config: FileConfig | None, handoffs: Handoffs | None) -> None:
        self.redis = redis
        self.commands: CommandsConfig = config.commands if config is not None else {}
        self.handoffs = handoffs
        self.identity = config.identity if config is not None else None
        self.people = (
            People(redis) if self.identity is not None and (self.identity.resolve or self.identity.self_link) else None
        )
        self.hidden = config.hidden_commands() if config is not None else frozenset({"link", "voice"})

    async def answer(
        self, request: TurnRequest, messages: Sequence[InboundMessage], conversation: ConversationRef
    ) -> Reply | None:
        """The answer to a turn that is a built-in command, or ``None`` (the turn goes on to the gate and model)."""
        command = turn_command(messages, self.commands)
        if command is None:
            return None
        role = request.role
        if command.name == "stop" or may_use(command.name, role, self.commands):
            if command.name in RESET_COMMAND_NAMES:  # the runtime forgets the conversation
                await self._start_over(request, conversation)
            return await self._built_in(command, request, messages)
        fact = CommandAnswered(message_id=messages[-1].id, command=command.name, role=role, outcome="refused")
        return Reply(TurnResult(text=refusal_text(command.name), steps=0), [fact])

    async def _built_in(
        self, command: Command, request: TurnRequest, messages: Sequence[InboundMessage]
    ) -> Reply | None:
        agent, role = request.agent, request.role
        switched = False
        match command.name:
            case "help":
                text = f"{greeting(agent)}\n\n{help_text(self.commands, role, hidden=self.hidden)}"
            case "whoami":
                text = await self._whoami(request)
            case "status":
                text = await self._status(request, len(messages))
            case "model":
                text, switched = await self._model(request, command.args)
            case _:
                return None  # /new, /reset, /usage, /link, /stop and the file's own commands: answered elsewhere
        fact = CommandAnswered(
            message_id=messages[-1].id,
            command=command.name,
            role=role,
            outcome="switched" if switched else "answered",
            detail=command.args.strip()[:100] if switched else "",
        )
        return Reply(TurnResult(text=text, steps=0), [fact])

    async def _start_over(self, request: TurnRequest, conversation: ConversationRef) -> None:
        """``/new``: the conversation goes back to its configured agent and model (only what is configured is asked)."""
        if self.handoffs is not None:
            await self.handoffs.release(conversation)
        if request.agent.models_allowed:
            await self.redis.delete(SessionKeys(request.session_key).model)

    async def _whoami(self, request: TurnRequest) -> str:
        person = request.person
        if not person and self.people is not None and ":" in request.actor:
            person = await self.people.person_of(request.tenant, request.actor) or ""
        linked = f"; linked as person {person}" if person else ""
        return f"You are {request.actor} (role: {request.role}){linked}."

    async def _status(self, request: TurnRequest, own: int) -> str:
        keys = SessionKeys(request.session_key)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.llen(keys.inbox)
            pipe.exists(keys.control)
            pipe.zcard(keys.approvals)
            depth, controlled, pending = await pipe.execute()
        waiting = max(0, int(depth) - own)
        state: SessionState = (
            "taken_over" if controlled else "waiting_for_approval" if pending else "queued" if waiting else "done"
        )
        agent = request.agent
        name = agent.profile.name if agent.profile is not None else agent.name
        return (
            f"Agent: {name} ({agent.name})\nModel: {agent.model or DEFAULT_MODEL}\nState: {state}\n"
            f"Messages waiting: {waiting}" + (f"\nApprovals pending: {int(pending)}" if pending else "")
        )

    async def _model(self, request: TurnRequest, args: str) -> tuple[str, bool]:
        agent = request.agent
        allowed = agent.models_allowed
        choice = args.strip()
        current = agent.model or DEFAULT_MODEL
        if not choice:
            offer = f" Models you can switch to: {', '.join(allowed)}." if allowed else ""
            return f"This conversation uses {current}.{offer}", False
        if choice not in allowed:
            offer = ", ".join(allowed) if allowed else "none (this agent allows no other)"
            return f"{choice} is not one of the models this agent allows: {offer}.", False
        await self.redis.set(SessionKeys(request.session_key).model, choice)
        return f"This conversation now uses {choice}. /new goes back to the agent's own model.", True
