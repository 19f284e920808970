"""``SWITCHBOARD_MCP_SERVE__*``: Switchboard as an MCP server (``switchboard mcp serve`` and ``/mcp``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr

__all__ = ["McpServeSettings"]


class McpServeSettings(BaseModel):
    """How ``mcp serve`` and the web tier's ``/mcp`` serve MCP clients."""

    model_config = ConfigDict(extra="forbid")

    http: bool = True
    """Serve streamable HTTP at ``/mcp`` in the web tier (only clients added with ``mcp clients add`` get in)."""
    wait_s: float = Field(300.0, gt=0)
    """The longest an ``ask_<agent>`` call waits for the agent's reply."""
    max_body_bytes: int = Field(256 * 1024, ge=1024)
    """Largest request body ``/mcp`` accepts; more is answered ``413`` before it is parsed."""
    token: SecretStr | None = None
    """The client's token for ``switchboard mcp serve --client NAME`` over stdio (else ``--token``)."""
