"""The MCP server one client sees: an ``ask_<agent>`` tool per ready agent of its tenant, and ``propose_agent``.

Built with the official SDK (:class:`mcp.server.mcpserver.MCPServer`) for one authenticated client at a time, so a
client lists and reaches only its own tenant's agents; the same server runs over stdio (``switchboard mcp serve
--client NAME``) and behind the web tier's ``/mcp`` (:mod:`switchboard.web.mcpserve.routes`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Final

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from switchboard import __version__
from switchboard.core.agent.config import Agent
from switchboard.errors import QueueUnavailableError
from switchboard.queue.mcpclients import McpClient
from switchboard.web.mcpserve.service import MAX_INSTRUCTIONS_CHARS, MAX_MESSAGE_CHARS, McpRefusedError, McpService

__all__ = ["SERVER_NAME", "build_server"]

logger = logging.getLogger(__name__)

SERVER_NAME: Final = "switchboard"

Message = Annotated[str, Field(min_length=1, max_length=MAX_MESSAGE_CHARS, description="What to say to the agent.")]
Conversation = Annotated[
    str | None,
    Field(
        default=None,
        max_length=64,
        description="Continue this conversation (the id an earlier answer gave); omit to start a new one.",
    ),
]


def _ask_tool(service: McpService, client: McpClient, agent: Agent) -> Callable[..., Awaitable[CallToolResult]]:
    async def ask(message: Message, conversation: Conversation = None) -> CallToolResult:
        try:
            answer = await service.ask(client, agent.name, message, conversation)
        except McpRefusedError as err:
            raise ToolError(str(err)) from None
        except QueueUnavailableError:
            raise ToolError("the gateway's queue did not answer in time; try again") from None
        return CallToolResult(
            content=[TextContent(type="text", text=answer.reply)],
            structured_content={"reply": answer.reply, "conversation": answer.conversation},
        )

    return ask


def _describe(agent: Agent) -> str:
    profile = agent.profile
    who = f"{profile.name}: {profile.description}" if profile is not None and profile.description else agent.name
    return (
        f"Ask the agent {who}. It answers one message per call with a real turn (its tools and policies apply); "
        "pass the returned conversation id to continue the conversation."
    )


def build_server(service: McpService, client: McpClient) -> MCPServer:
    """The MCP server for ``client``: its tenant's ready agents and ``propose_agent``."""
    server: MCPServer = MCPServer(
        SERVER_NAME,
        version=__version__,
        instructions="Switchboard's agents, each as a tool ask_<agent>; propose_agent drafts a new one for review.",
        warn_on_duplicate_tools=False,
    )
    for name, agent in service.agents(client.tenant).items():
        server.add_tool(
            _ask_tool(service, client, agent),
            name=f"ask_{name}",
            description=_describe(agent),
            annotations=ToolAnnotations(read_only_hint=False, open_world_hint=True),
            structured_output=False,
        )

    async def propose_agent(
        name: Annotated[str, Field(description="The agent's name: 1-40 of a-z 0-9 _, starting with a letter.")],
        instructions: Annotated[
            str, Field(min_length=1, max_length=MAX_INSTRUCTIONS_CHARS, description="Its instructions.")
        ],
        display_name: Annotated[str | None, Field(max_length=80, description="The name users see.")] = None,
        description: Annotated[str, Field(max_length=500, description="What it is for, in a sentence.")] = "",
        tools: Annotated[list[str], Field(max_length=32, description="Built-in tools it may use.")] = [],  # noqa: B006
    ) -> str:
        try:
            draft = await service.propose(
                client, name, instructions, display_name=display_name, description=description, tools=tools
            )
        except McpRefusedError as err:
            raise ToolError(str(err)) from None
        except QueueUnavailableError:
            raise ToolError("the gateway's queue did not answer in time; try again") from None
        logger.info("MCP client %s proposed the draft agent %s (tenant %s)", client.name, name, client.tenant)
        return (
            f"Agent {draft.agent.name!r} is a draft now. It is not served until its owner accepts it "
            "(the console, or `switchboard agents accept`); nothing can ask it before that."
        )

    server.add_tool(
        propose_agent,
        name="propose_agent",
        description=(
            "Propose a new agent (name, instructions, optional display name, description and built-in tools). It "
            "stays a draft, never served, until its owner accepts it."
        ),
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False),
    )
    return server
