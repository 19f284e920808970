"""Conversations handed from one agent to another: the per-conversation binding and the history it carries.

Sessions are keyed by agent (``tenant/agent/channel/account/conversation``), so a handoff moves the conversation to
another session: the ``handoff`` tool writes a binding record for the conversation (``GlobalKeys.handoff``, with a
TTL of :data:`HANDOFF_TTL_S`), the ingest router reads it for each message of the conversation and routes the message
to the bound agent's session, and ``/new`` (or ``/reset``) in that session deletes it, so the next message goes where
the configuration sends it. Only a file that gives some agent a ``handoff`` block pays the one read per message.

What the receiving agent sees is written into its session's history when the handoff is made (``handoff.history``):
``none``: only the handing agent's note; ``summary``: the note and the last user and assistant messages as text;
``full``: every entry of the handing session's history and the turn's messages, then the note.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from switchboard.core.inbound import history_text
from switchboard.core.messages import ConversationRef, InboundMessage, session_key
from switchboard.core.tools.builtin.handoff import HandoffDone
from switchboard.core.turn import HistoryEntry
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.store import load_history, parse_history, stored_history
from switchboard.settings import FileConfig
from switchboard.types import SessionKey

__all__ = ["HANDOFF_TTL_S", "Handoffs", "TurnHandoff", "conversation_id"]

HANDOFF_TTL_S = 30 * 24 * 3600
"""How long a handoff binds a conversation after it was made (then the configuration routes it again)."""
SUMMARY_LINE_CHARS = 500
"""Each message of a ``summary`` is cut to this many characters."""

_GLOBAL = GlobalKeys()


def conversation_id(conv: ConversationRef) -> str:
    """The conversation's session key with ``-`` for its agent: the same for every agent it may be bound to."""
    return session_key(conv.tenant, "-", conv.channel, conv.account, conv.conversation, conv.thread)


def _summary(entries: Sequence[HistoryEntry], turn: Sequence[str], count: int) -> str:
    said = [(e.role, e.text) for e in entries if e.role in ("user", "assistant") and e.text.strip()]
    said += [("user", text) for text in turn if text.strip()]
    lines = [f"{role}: {' '.join(text.split())[:SUMMARY_LINE_CHARS]}" for role, text in said[-count:]]
    return "\n".join(lines)


class Handoffs:
    """The handoff bindings of one deployment (built only when some agent has a ``handoff`` block)."""

    def __init__(self, redis: aioredis.Redis, config: FileConfig, *, history_maxlen: int = 200) -> None:
        self.redis = redis
        self.config = config
        self.history_maxlen = history_maxlen

    @classmethod
    def build(cls, redis: aioredis.Redis, config: FileConfig | None, *, history_maxlen: int = 200) -> Handoffs | None:
        """Handoffs when some agent may hand over, else ``None`` (nothing is read for any message)."""
        if config is None or not any(agent.handoff is not None for agent in config.agents.values()):
            return None
        return cls(redis, config, history_maxlen=history_maxlen)

    async def bound(self, conv: ConversationRef) -> str | None:
        """The agent the conversation was handed to (one GET), if it still exists."""
        raw = await self.redis.get(_GLOBAL.handoff(conversation_id(conv)))
        if not raw:
            return None
        agent = str(json.loads(raw).get("agent", ""))
        return agent if agent in self.config.agents else None

    async def release(self, conv: ConversationRef) -> bool:
        """End the conversation's binding (``/new``); whether there was one."""
        return bool(await self.redis.delete(_GLOBAL.handoff(conversation_id(conv))))

    async def hand_off(
        self,
        conv: ConversationRef,
        turn: Sequence[InboundMessage],
        from_agent: str,
        to: str,
        reason: str,
        note: str,
    ) -> HandoffDone:
        """Bind ``conv`` to ``to`` and write what it may see into its session's history (one transaction).

        Raises:
            ValueError: ``from_agent`` may not hand to ``to``.
        """
        source = self.config.agents.get(from_agent)
        rules = source.handoff if source is not None else None
        if rules is None or to not in rules.to:
            allowed = ", ".join(rules.to) if rules is not None else "none"
            raise ValueError(f"you may not hand this conversation to {to!r}; the agents you may hand to: {allowed}")
        target = self.config.agents[to]
        origin = session_key(conv.tenant, from_agent, conv.channel, conv.account, conv.conversation, conv.thread)
        receiving = SessionKey(session_key(conv.tenant, to, conv.channel, conv.account, conv.conversation, conv.thread))
        said = [history_text(m) for m in turn]
        header = f"(handoff: agent {from_agent} handed this conversation to you. Reason: {reason}"
        entries: list[str] = []
        match rules.history:
            case "full":
                found: list[bytes | str] = await self.redis.lrange(SessionKeys(origin).history, 0, -1)
                carried = parse_history(found, origin)  # opened here, sealed again for the receiving session
                carried += [
                    HistoryEntry(role="user", text=text, message_id=m.id)
                    for m, text in zip(turn, said, strict=True)
                    if text
                ]
                entries = stored_history(carried, receiving)
                text = f"{header}. Their note: {note or '(none)'})"
            case "summary":
                earlier = await load_history(self.redis, origin, self.history_maxlen)
                transcript = _summary(earlier, said, rules.summary_entries)
                text = f"{header}. Their note: {note or '(none)'})\nThe conversation so far:\n{transcript}"
            case "none":
                text = f"{header}. Their note: {note or '(none)'})"
        entries += stored_history([HistoryEntry(role="user", text=text, meta={"handoff": from_agent})], receiving)
        record = json.dumps({"agent": to, "from": from_agent, "reason": reason, "at": time.time()})
        history = SessionKeys(receiving).history
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.rpush(history, *entries)
            pipe.ltrim(history, -self.history_maxlen, -1)
            pipe.set(_GLOBAL.handoff(conversation_id(conv)), record, ex=HANDOFF_TTL_S)
            await pipe.execute()
        label = target.profile.name if target.profile is not None else to
        return HandoffDone(to=to, label=label, history=rules.history, carried=len(entries))


@dataclass
class TurnHandoff:
    """A turn's view of :class:`Handoffs`: its conversation and messages, for the ``handoff`` tool."""

    handoffs: Handoffs
    conversation: ConversationRef
    messages: Sequence[InboundMessage]

    async def hand_off(self, from_agent: str, to: str, reason: str, note: str) -> HandoffDone:
        """See :meth:`Handoffs.hand_off`."""
        return await self.handoffs.hand_off(self.conversation, self.messages, from_agent, to, reason, note)
