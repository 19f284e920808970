"""messenger."""
