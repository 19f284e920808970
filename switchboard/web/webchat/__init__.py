"""webchat."""
