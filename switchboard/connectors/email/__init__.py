"""The email connector: an MCP server that reads a mailbox over IMAP and sends from it over SMTP."""
