"""Fakes of third-party APIs at their HTTP boundary (small aiohttp apps that record what they receive)."""
