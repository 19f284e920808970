"""MCP servers as tool sources: configuration, pinned identities and tool hashes, client sessions, gateway tools."""
