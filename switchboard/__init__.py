"""Switchboard: a self-hosted gateway that connects AI agents to the chat apps people already use."""

__version__ = "0.1.0"
