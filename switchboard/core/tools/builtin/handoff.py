"""``handoff``: the agent hands the conversation to another agent, which answers the user's next messages.

Handing over is a write, so the policy decides each call like any write (``{tool: handoff, decide: refuse}`` forbids
it, ``decide: ask`` makes a person approve it). The agents it may hand to are its ``handoff.to`` list; the gateway
binds the conversation to the receiving agent (the ingest router reads that binding), gives the receiving agent the
part of the history ``handoff.history`` allows, with the handing agent's note, tells the user, and records a
``conversation_handed_off`` fact. ``/new`` ends the binding. The binding lives in the queue layer, reached through
:class:`ConversationHandoff`, a Protocol the session store implements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from switchboard.core.actions import SendText
from switchboard.core.events import ConversationHandedOff
from switchboard.core.protocols import conforms
from switchboard.core.routing import HandoffHistory
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.errors import ToolError

__all__ = ["TOOLS", "ConversationHandoff", "HandoffDone", "HandoffInput", "handing_text"]


@dataclass(frozen=True, slots=True)
class HandoffDone:
    """What a handoff did."""

    to: str
    label: str
    """The receiving agent's display name (its profile's, else its name)."""
    history: HandoffHistory
    carried: int
    """History entries the receiving agent got (the note included)."""


@runtime_checkable
class ConversationHandoff(Protocol):
    """Binds this conversation to another agent (implemented by the queue layer's session store)."""

    async def hand_off(self, from_agent: str, to: str, reason: str, note: str) -> HandoffDone:
        """Bind the conversation to ``to`` and give it the history its settings allow.

        Raises:
            ValueError: ``from_agent`` may not hand to ``to`` (not in its ``handoff.to``), or handing over is not
                possible here; the message says which agents it may hand to.
        """
        ...


class HandoffInput(BaseModel):
    """Arguments of ``handoff``."""

    model_config = ConfigDict(extra="forbid")

    agent: str = Field(min_length=1, max_length=64, description="The agent to hand the conversation to.")
    reason: str = Field(min_length=1, max_length=300, description="Why, in one sentence (recorded, shown to them).")
    note: str = Field(
        "",
        max_length=2000,
        description="What the receiving agent should know: the user's request and what you found out so far.",
    )


def handing_text(label: str) -> str:
    """What the user is told when the conversation is handed to the agent called ``label``."""
    return f"Handing you to {label}…"


async def handoff(args: HandoffInput, ctx: ToolContext) -> dict[str, Any]:
    """Tool body: hand this conversation to another agent."""
    store = ctx.store
    if not conforms(store, ConversationHandoff):
        raise ToolError("this conversation cannot be handed over here (its session store cannot)")
    try:
        done = await store.hand_off(ctx.agent, args.agent, args.reason, args.note)
    except ValueError as err:
        raise ToolError(str(err)) from None
    told = handing_text(done.label)
    if ctx.record is not None:
        await ctx.record(
            ConversationHandedOff(
                from_agent=ctx.agent,
                to=done.to,
                reason=args.reason,
                history=done.history,
                carried=done.carried,
            )
        )
    if ctx.act is not None:
        await ctx.act(SendText(text=told, notice=True))
    return {
        "handed_to": done.to,
        "user_told": told,
        "next": "The user's next messages go to them. End your turn without another answer.",
    }


TOOLS: list[Tool] = [
    Tool(
        name="handoff",
        description="Hand this conversation to another agent when the user needs what they do (the agents you may "
        "hand to are in your instructions). The user is told, and their next messages go to that agent, with your "
        "note.",
        input=HandoffInput,
        fn=handoff,
        side_effect="write",
        risk="medium",
        cost=5,
        timeout_s=5.0,
        key_fields=("agent",),
    ),
]
"""The handoff tool."""
