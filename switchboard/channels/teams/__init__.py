"""teams."""
