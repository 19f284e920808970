"""The integration API (``/api/v1``): tokens with scopes, sending messages, starting turns, reading conversations."""
