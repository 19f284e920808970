"""A small MCP server for the MCP guide (docs/mcp.md), on the official SDK: ``python mcp_server.py [stdio|http PORT]``."""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("demo-tools")


@server.tool(description="Adds two integers.")
def add(a: int, b: int) -> int:
    return a + b


@server.tool(description="Counts the words of a text.")
def word_count(text: str) -> int:
    return len(text.split())


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
