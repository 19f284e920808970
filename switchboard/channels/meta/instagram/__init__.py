"""instagram."""
