"""``switchboard mcp serve``: Switchboard as an MCP server (stdio, and streamable HTTP at ``/mcp``)."""
