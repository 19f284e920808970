"""workspaces."""
