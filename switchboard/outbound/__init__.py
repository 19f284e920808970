"""outbound."""
