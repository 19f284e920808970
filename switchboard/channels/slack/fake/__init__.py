"""fake."""
