"""What an MCP client may do: ask one of its tenant's ready agents, and propose a draft agent.

An ask is a real turn through the normal pipeline: the message is ingested into a web chat session of its own
(``mcp-<client>-<conversation>``, under the client's tenant and the agent asked), so ordering, one run per session,
limits, policy and the event log hold as for any message; the reply is read from the session's web stream, where
the worker publishes it. A proposal is kept as a draft (:class:`~switchboard.queue.drafts.DraftStore`) that nothing
serves until its owner accepts it.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.exceptions import RedisError

from switchboard.channels.registry import Route
from switchboard.core.agent.config import Agent, AgentProfile
from switchboard.core.messages import ConversationRef, InboundMessage, Posted, Sender
from switchboard.errors import QueueUnavailableError
from switchboard.queue.drafts import AgentDraft, DraftStore
from switchboard.queue.keys import SessionKeys
from switchboard.queue.mcpclients import McpClient
from switchboard.queue.router import IngestRouter
from switchboard.settings import FileConfig

__all__ = [
    "AGENT_NAME_PATTERN",
    "CONVERSATION_PATTERN",
    "MAX_INSTRUCTIONS_CHARS",
    "MAX_MESSAGE_CHARS",
    "Answer",
    "McpRefusedError",
    "McpService",
    "tenant_agents",
]

logger = logging.getLogger(__name__)

MAX_MESSAGE_CHARS: Final = 32_000
"""Longest message an ask may carry."""
MAX_INSTRUCTIONS_CHARS: Final = 8_000
"""Longest instructions a proposed agent may have."""
AGENT_NAME_PATTERN: Final = r"^[a-z][a-z0-9_]{0,39}$"
"""A proposed agent's name (its tool is ``ask_<name>``)."""
CONVERSATION_PATTERN: Final = r"^[A-Za-z0-9_-]{1,64}$"
"""A conversation id an ask may continue."""
_READ_BLOCK_MS: Final = 1_000


class McpRefusedError(Exception):
    """An ask or a proposal refused, with the words the MCP client is shown."""


@dataclass(frozen=True, slots=True)
class Answer:
    """An agent's reply to one ask."""

    reply: str
    conversation: str
    """The id to pass back to continue the conversation."""


def tenant_agents(config: FileConfig, routes: Mapping[tuple[str, str], Route], tenant: str) -> list[str]:
    """The ready agents ``tenant``'s MCP clients may ask, by name.

    A tenant's agents are those its channel accounts route to (the web chat's ``channels.web.agents`` too, when the
    web chat is the tenant's) and the accepted agents of its ``agents.d/<tenant>/`` folder. Drafts are never among
    them: a draft is not an agent of the file, and an agent of the file without profile or instructions is a draft.
    """
    names = {route.agent for route in routes.values() if route.tenant == tenant}
    web = routes.get(("web", "default"))
    options = config.channels.get("web")
    if web is not None and web.tenant == tenant and options is not None:
        names.update(options.agents)
    names.update(name for name in config.agents if config.agent_tenant(name) == tenant)
    return sorted(
        name
        for name in names
        if name in config.agents
        and config.agents[name].status == "ready"
        and config.agent_tenant(name) in (None, tenant)
    )


class McpService:
    """Asks and proposals of authenticated MCP clients, over the web tier's (or the CLI's) Redis and router."""

    def __init__(
        self, redis: aioredis.Redis, router: IngestRouter, *, wait_s: float, tool_names: Collection[str]
    ) -> None:
        """Serve over ``redis`` and ``router`` (owned by the caller).

        Args:
            redis: where sessions, web streams and drafts live.
            router: the ingest router (routes and durable ingest).
            wait_s: the longest an ask waits for its reply.
            tool_names: the tools a proposed agent may list (the built-in registry's).
        """
        self.redis = redis
        self.router = router
        self.wait_s = wait_s
        self.tool_names = frozenset(tool_names)
        self.drafts = DraftStore(redis)

    def agents(self, tenant: str) -> dict[str, Agent]:
        """The ready agents of ``tenant``, by name."""
        config = self.router.config
        return {name: config.agents[name] for name in tenant_agents(config, self.router.routes, tenant)}

    async def ask(self, client: McpClient, agent: str, message: str, conversation: str | None) -> Answer:
        """Run one turn of ``agent`` on ``message`` and return its reply.

        Raises:
            McpRefusedError: an agent not the client's tenant's, a bad message or conversation id, a refused or
                limited message, no reply in time.
            QueueUnavailableError: Redis did not answer.
        """
        if agent not in self.agents(client.tenant):
            raise McpRefusedError(f"no ready agent {agent!r} here")
        if not message.strip() or len(message) > MAX_MESSAGE_CHARS:
            raise McpRefusedError(f"message must be 1-{MAX_MESSAGE_CHARS} characters, not blank")
        if not _encodable(message):
            raise McpRefusedError("message must be valid Unicode text (no lone surrogates)")
        if conversation is not None and not re.match(CONVERSATION_PATTERN, conversation):
            raise McpRefusedError("conversation must be 1-64 of A-Z a-z 0-9 _ -, as an earlier answer gave it")
        conversation = conversation or uuid.uuid4().hex
        ref = ConversationRef(
            tenant=client.tenant,
            agent=agent,
            channel="web",
            account="default",
            conversation=f"mcp-{client.name}-{conversation}",
        )
        stream = SessionKeys(ref.session_key).web
        draft = InboundMessage(
            dedup_key=uuid.uuid4().hex,
            conversation=ref,
            sender=Sender(id=f"mcp:{client.name}", name=client.name),
            text=message,
            event=Posted(),
            received_at=time.time(),
        )
        try:
            newest: Any = await self.redis.xrevrange(stream, count=1)
            start = _text(newest[0][0]) if newest else "0-0"
        except (TimeoutError, RedisError, OSError) as err:
            raise QueueUnavailableError(f"Redis did not answer: {type(err).__name__}") from err
        result = await self.router.ingest(
            draft, echo={"type": "user", "data": json.dumps({"text": message, "client_id": draft.dedup_key})}
        )
        if result is None:
            raise McpRefusedError("the web chat is not enabled in this process, or access control refused the message")
        if result.limited is not None:
            raise McpRefusedError(f"the conversation refused the message for now ({result.limited}); retry later")
        reply = await self._reply(stream, start, result.message_id)
        return Answer(reply=reply, conversation=conversation)

    async def _reply(self, stream: str, start: str, message_id: str) -> str:
        """The text the worker published in answer to ``message_id``, once its turn is over."""
        texts: list[str] = []
        deadline = time.monotonic() + self.wait_s
        cursor = start
        while time.monotonic() < deadline:
            try:
                found: Any = await self.redis.xread({stream: cursor}, count=100, block=_READ_BLOCK_MS)
            except (TimeoutError, RedisError, OSError) as err:
                raise QueueUnavailableError(f"Redis did not answer: {type(err).__name__}") from err
            for _, entries in found:
                for entry_id, fields in entries:
                    cursor = _text(entry_id)
                    kind = _text(fields.get(b"type", b""))
                    data = json.loads(fields.get(b"data", b"{}"))
                    if not isinstance(data, dict) or data.get("reply_to") != message_id:
                        continue
                    if kind == "message" and isinstance(data.get("text"), str):
                        texts.append(data["text"])
                    elif kind == "reply_error":
                        raise McpRefusedError(f"the agent could not answer: {data.get('message', 'failed')}")
                    elif kind == "status" and data.get("status") == "idle":
                        return "\n\n".join(texts)
        if texts:
            return "\n\n".join(texts)
        raise McpRefusedError(f"no reply within {self.wait_s:g} s; the turn may still be running")

    async def propose(
        self,
        client: McpClient,
        name: str,
        instructions: str,
        *,
        display_name: str | None,
        description: str,
        tools: Sequence[str],
    ) -> AgentDraft:
        """Keep a proposed agent as a draft of the client's tenant.

        Raises:
            McpRefusedError: a bad name, instructions or tool, or a name an agent or a draft has already.
        """
        if not re.match(AGENT_NAME_PATTERN, name):
            raise McpRefusedError("name must be 1-40 of a-z 0-9 _, starting with a letter")
        if not _encodable(instructions, display_name or "", description, *tools):
            raise McpRefusedError("every field must be valid Unicode text (no lone surrogates)")
        if not instructions.strip() or len(instructions) > MAX_INSTRUCTIONS_CHARS:
            raise McpRefusedError(f"instructions must be 1-{MAX_INSTRUCTIONS_CHARS} characters, not blank")
        unknown = sorted(set(tools) - self.tool_names)
        if unknown:
            raise McpRefusedError(f"unknown tool(s) {', '.join(unknown)}; known: {', '.join(sorted(self.tool_names))}")
        if name in self.router.config.agents:
            raise McpRefusedError(f"an agent {name!r} exists already: choose another name")
        try:
            agent = Agent(
                name=name,
                profile=AgentProfile(name=display_name or name, description=description),
                instructions=instructions,
                tools=list(dict.fromkeys(tools)),
            )
        except ValidationError as err:
            raise McpRefusedError(f"not a valid agent: {err.errors()[0]['msg']}") from None
        try:
            return await self.drafts.propose(client.tenant, agent, f"mcp:{client.name}")
        except ValueError as err:
            raise McpRefusedError(str(err)) from None
        except (TimeoutError, RedisError, OSError) as err:
            raise QueueUnavailableError(f"Redis did not answer: {type(err).__name__}") from err


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _encodable(*values: str) -> bool:
    try:
        for value in values:
            value.encode()
    except UnicodeEncodeError:
        return False
    return True
