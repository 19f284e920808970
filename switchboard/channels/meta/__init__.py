"""meta."""
